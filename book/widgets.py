"""The book's one slider helper: a live ipywidgets control in a kernel, a precomputed flipbook in the static book (chapter 00).

`slider(fn, size=[...])` calls `fn(size=...)`, which draws a matplotlib figure and may print text.
In a live kernel each move re-runs `fn` (real measurements included). In the static build ($BOOK_STATIC=1,
set by `make book`) every value of the grid is run once at build time and the page gets an HTML range input
that swaps the pre-rendered figures in the browser: no kernel, no CDN. The figure the slider starts on is inlined
in the page; the others are PNG files in the book's `_static/frames/` (named by their content's hash), which the
browser fetches only when the slider moves, so a page with many frames stays light.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import html
import io
import itertools
import json
import math
import os
import uuid
from numbers import Real
from pathlib import Path
from typing import Any, Callable, Sequence

from .build import is_static, progress

__all__ = ["slider", "grid", "MAX_FRAMES", "frames_dir"]

#: The most figures one static slider may precompute; larger grids make pages heavy and builds slow.
MAX_FRAMES = 64


def grid(start: float, stop: float, num: int, *, log: bool = False, integer: bool = False) -> list:
    """`num` slider values from `start` to `stop`, evenly or log-spaced; invalid ranges are rejected (chapter 00)."""
    for label, v in (("start", start), ("stop", stop)):
        if not isinstance(v, Real) or not math.isfinite(v):
            raise ValueError(f"slider {label} must be a finite number, got {v!r}")
    if not isinstance(num, int) or num < 2:
        raise ValueError(f"a slider needs at least 2 values, got num={num!r}")
    if not start < stop:
        raise ValueError(f"slider range must go upward: start={start} is not below stop={stop}")
    if log and start <= 0:
        raise ValueError(f"a log-spaced slider needs a positive start, got start={start}")
    if log:
        vals = [start * (stop / start) ** (i / (num - 1)) for i in range(num)]
    else:
        vals = [start + (stop - start) * i / (num - 1) for i in range(num)]
    if integer:
        vals = sorted(set(int(round(v)) for v in vals))
        if len(vals) < 2:
            raise ValueError(f"the range {start}..{stop} holds fewer than 2 distinct integers")
    return vals


def _check_values(name: str, values: Sequence[Any]) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"slider {name!r}: give a list of values, got {type(values).__name__}")
    vals = list(values)
    if not vals:
        raise ValueError(f"slider {name!r} has no values")
    if len(set(map(repr, vals))) != len(vals):
        raise ValueError(f"slider {name!r} repeats a value: {vals}")
    if all(isinstance(v, Real) and not isinstance(v, bool) for v in vals):
        if not all(math.isfinite(v) for v in vals):
            raise ValueError(f"slider {name!r} has a value that is not finite: {vals}")
        if any(b <= a for a, b in zip(vals, vals[1:])):
            raise ValueError(f"slider {name!r} values must increase: {vals}")
    return vals


def _label(fmt: dict[str, Any], name: str, value: Any) -> str:
    f = fmt.get(name)
    if f is None:
        return f"{value:g}" if isinstance(value, float) else str(value)
    return f(value) if callable(f) else f.format(value)


def _render(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[bytes, str]:
    """Run fn once; return (PNG bytes, printed text)."""
    import matplotlib.pyplot as plt
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fig = fn(**kwargs)
    fig = fig if fig is not None else plt.gcf()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    return png.getvalue(), buf.getvalue()


def frames_dir(start: str | os.PathLike | None = None) -> Path | None:
    """Where static slider frames go: `_static/frames` of the book that holds the working directory (the folder
    with `_config.yml` and `_toc.yml`, which the build copies to the HTML), or None outside a book (chapter 00)."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "_config.yml").is_file() and (folder / "_toc.yml").is_file():
            return folder / "_static" / "frames"
    return None


def _sources(pngs: list[bytes], keep_inline: int, where: Path | None) -> list[str]:
    """Image sources for the frames: a data URI for the one the slider starts on (and for all of them outside a
    book), a relative URL to a content-named file in `where` for the others."""
    out = []
    for i, png in enumerate(pngs):
        if where is None or i == keep_inline:
            out.append("data:image/png;base64," + base64.b64encode(png).decode("ascii"))
            continue
        where.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256(png).hexdigest()[:20] + ".png"
        if not (where / name).exists():
            (where / name).write_bytes(png)
        out.append(Path(os.path.relpath(where / name, os.getcwd())).as_posix())
    return out


_SCRIPT = """
(function () {
  var root = document.getElementById(%(id)s);
  var frames = JSON.parse(document.getElementById(%(data_id)s).textContent);
  var inputs = root.querySelectorAll("input[type=range]");
  function update() {
    var index = 0;
    inputs.forEach(function (input) {
      index = index * (Number(input.max) + 1) + Number(input.value);  // mixed radix over the sliders
      var labels = JSON.parse(input.dataset.labels);
      input.parentNode.querySelector("output").textContent = labels[Number(input.value)];
    });
    root.querySelector("img").src = frames[index][0];
    root.querySelector("pre").textContent = frames[index][1];
    root.dataset.frame = index;
  }
  inputs.forEach(function (input) { input.addEventListener("input", update); });
  update();
})();
"""


def _static_html(names: list[str], values: list[list], labels: list[list[str]], start: list[int],
                 frames: list[tuple[str, str]]) -> str:
    uid = "book-slider-" + uuid.uuid4().hex[:10]
    rows = []
    for name, vals, labs, s in zip(names, values, labels, start):
        rows.append(
            f'<label style="display:block;margin:.2em 0">'
            f'<span style="display:inline-block;min-width:9em">{html.escape(name)}</span> '
            f'<input type="range" min="0" max="{len(vals) - 1}" step="1" value="{s}" data-param="{html.escape(name)}" '
            f"data-labels='{html.escape(json.dumps(labs))}' style=\"width:18em;vertical-align:middle\"> "
            f"<output>{html.escape(labs[s])}</output></label>")
    script = _SCRIPT % {"id": json.dumps(uid), "data_id": json.dumps(uid + "-data")}
    return (f'<div class="book-slider" id="{uid}" data-frames="{len(frames)}">'
            + "".join(rows)
            + '<img alt="figure for the chosen slider values" style="max-width:100%;display:block">'
            + '<pre style="white-space:pre-wrap;margin-top:.3em"></pre></div>'
            + f'<script type="application/json" id="{uid}-data">{json.dumps(frames)}</script>'
            + f"<script>{script}</script>"
            + '<p style="font-size:.85em;color:#666">Static page: each position shows a result computed when '
              "the book was built. Run the chapter to recompute it on your own device.</p>")


def slider(fn: Callable[..., Any], *, value: dict[str, Any] | None = None,
           fmt: dict[str, Any] | None = None, static: bool | None = None, **params: Sequence[Any]) -> None:
    """Show a figure with one slider per parameter, each over a list of values (chapter 00).

    `fn(**chosen)` draws a figure (return it, or leave it current) and may print. `value` picks start
    positions, `fmt` maps a parameter to a format string or function for its label.
    """
    if not callable(fn):
        raise TypeError(f"slider needs a function to call, got {fn!r}")
    if not params:
        raise ValueError("slider needs at least one parameter, e.g. slider(fn, size=[1, 2, 4])")
    value, fmt = dict(value or {}), dict(fmt or {})
    names = list(params)
    values = [_check_values(n, params[n]) for n in names]
    for n in list(value) + list(fmt):
        if n not in params:
            raise ValueError(f"{n!r} is not a slider parameter; the parameters are {names}")
    start = []
    for n, vals in zip(names, values):
        if n in value:
            if value[n] not in vals:
                raise ValueError(f"start value {value[n]!r} of slider {n!r} is not among its values {vals}")
            start.append(vals.index(value[n]))
        else:
            start.append(0)
    labels = [[_label(fmt, n, v) for v in vals] for n, vals in zip(names, values)]

    if static if static is not None else is_static():
        combos = list(itertools.product(*values))
        if len(combos) > MAX_FRAMES:
            raise ValueError(f"this slider grid has {len(combos)} combinations; a static page holds at most "
                             f"{MAX_FRAMES}: use fewer values")
        rendered = [_render(fn, dict(zip(names, c))) for c in progress(combos, desc="precomputing slider")]
        first = 0
        for s, vals in zip(start, values):                  # the mixed-radix index of the start position
            first = first * len(vals) + s
        srcs = _sources([png for png, _ in rendered], first, frames_dir())
        frames = [(src, text) for src, (_, text) in zip(srcs, rendered)]
        from IPython.display import HTML, display
        display(HTML(_static_html(names, values, labels, start, frames)))
        return

    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display
    controls = {}
    for n, vals, labs, s in zip(names, values, labels, start):
        options = list(zip(labs, vals))
        if all(isinstance(v, str) for v in vals) and len(vals) <= 6:
            controls[n] = w.ToggleButtons(options=options, value=vals[s], description=n)
        else:
            controls[n] = w.SelectionSlider(options=options, value=vals[s], description=n,
                                            continuous_update=False, style={"description_width": "initial"},
                                            layout=w.Layout(width="32em"))

    def show(**kwargs: Any) -> None:
        fig = fn(**kwargs)
        fig = fig if fig is not None else plt.gcf()
        display(fig)
        plt.close(fig)

    out = w.interactive_output(show, controls)
    display(w.VBox([*controls.values(), out]))
