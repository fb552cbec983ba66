"""A pytest plugin for `make test` (the build): each chapter nbval executed without a failure goes into the book's
execution cache, so the -W book build that follows renders those outputs instead of running every chapter again.

Use: `pytest --nbval-lax -p book.nbcache chapters` with BOOK_NB_CACHE set to the book's cache folder (`_config.yml`,
`execute.cache`). Without BOOK_NB_CACHE the plugin does nothing. A chapter with a failed, skipped or missing cell is
not cached, so the build executes it itself.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_outputs: dict[str, dict[int, list]] = {}
_seconds: dict[str, float] = {}
_incomplete: set[str] = set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call" or not hasattr(item, "cell_num") or not hasattr(item, "test_outputs"):
        return
    path = str(Path(str(item.parent.fspath)).resolve())
    _seconds[path] = _seconds.get(path, 0.0) + rep.duration
    if rep.passed and item.test_outputs is not None:
        _outputs.setdefault(path, {})[item.cell_num] = list(item.test_outputs)
    else:
        _incomplete.add(path)


def executed_notebook(path: str, outputs: dict[int, list]):
    """The notebook at `path` with nbval's outputs in its code cells, numbered as a fresh run would number them;
    None when a code cell has no outputs recorded (chapter cells all run under nbval)."""
    import nbformat
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    if sorted(outputs) != list(range(len(code))):
        return None
    for i, cell in enumerate(code):
        cell.execution_count = i + 1
        cell.outputs = [nbformat.from_dict(dict(o)) for o in outputs[i]]
        for o in cell.outputs:
            if o.output_type == "execute_result":
                o.execution_count = i + 1
    nbformat.validate(nb)
    return nb


def pytest_sessionfinish(session, exitstatus):
    folder = os.environ.get("BOOK_NB_CACHE")
    if not folder:
        return
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    cache = get_cache(folder)
    for path, outputs in sorted(_outputs.items()):
        name = Path(path).name
        if path in _incomplete:
            print(f"\nbook.nbcache: {name} had a failed or skipped cell; the build will execute it", file=sys.stderr)
            continue
        try:
            nb = executed_notebook(path, outputs)
        except Exception as e:  # noqa: BLE001 - an output nbformat rejects: let the build execute the chapter
            print(f"\nbook.nbcache: {name} not cached ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        if nb is None:
            print(f"\nbook.nbcache: {name} has cells nbval did not run; the build will execute it", file=sys.stderr)
            continue
        cache.cache_notebook_bundle(CacheBundleIn(nb, path, data={"execution_seconds": _seconds.get(path, 0.0)}),
                                    check_validity=False, overwrite=True)
        print(f"\nbook.nbcache: cached {name} for the book build", file=sys.stderr)
