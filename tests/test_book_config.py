"""The book's structure: the repository URL in one place, every chapter in the toc, chapters committed clean."""
import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
URL = CONFIG["repository"]["url"]


def _toc_files():
    return [c["file"] for c in TOC.get("chapters", [])] + [f["file"] for p in TOC.get("parts", [])
                                                          for f in p.get("chapters", [])]


def test_repository_url_is_set_and_not_the_jupyter_book_default():
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", URL)
    assert "executablebooks" not in URL
    assert CONFIG["launch_buttons"]["colab_url"] == "https://colab.research.google.com"


def test_every_chapter_is_in_the_toc_and_every_toc_entry_exists():
    toc = _toc_files()
    assert sorted(f"chapters/{p.stem}" for p in CHAPTERS) == sorted(f for f in toc if f.startswith("chapters/"))
    for f in toc:
        assert (ROOT / f).with_suffix(".ipynb").exists() or (ROOT / f).with_suffix(".md").exists(), f
    assert all(re.fullmatch(r"(\d\d|A\d)_[a-z0-9_]+", p.stem) for p in CHAPTERS)   # chapters, appendices


def test_build_settings():
    ex = CONFIG["execute"]
    assert ex["execute_notebooks"] == "cache" and ex["allow_errors"] is False and ex["timeout"] > 0
    assert CONFIG["only_build_toc_files"] is True
    assert {"_build", ".venv", ".venv-oldest", "build"} <= set(CONFIG["exclude_patterns"])
    assert "sphinx_exercise" in CONFIG["sphinx"]["extra_extensions"]
    assert CONFIG["sphinx"]["config"]["nb_execution_raise_on_error"] is True


def test_chapters_point_only_at_the_configured_repository():
    owner_repo = URL.split("github.com/")[1]
    for path in CHAPTERS:
        text = path.read_text()
        for link in re.findall(r"https://colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/blob/main/(\S+?)\)", text):
            assert link == (owner_repo, f"chapters/{path.name}"), f"{path.name}: Colab link points at {link}"
        for target in re.findall(r"git\+(https://github\.com/[\w.-]+/[\w.-]+)", text):
            assert target == URL, f"{path.name}: installs from {target}, not {URL}"
        assert "git+" + URL in text and "colab.research.google.com/github/" + owner_repo in text


def test_chapters_are_committed_clean_and_shaped_like_a_chapter():
    for path in CHAPTERS:
        nb = json.loads(path.read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert not any(c.get("outputs") or c.get("execution_count") for c in code), f"{path.name} has outputs"
        assert "hide-input" in code[0]["metadata"].get("tags", []) and "book.setup(" in "".join(code[0]["source"])
        text = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        assert text.startswith("# ") and "## Exercises" in text and "## Summary" in text
        assert "{exercise-start}" in text and "{solution-start}" in text and ":class: dropdown" in text


def test_figures_fit_the_column_they_are_shown_in():
    """A figure wider than the text column is shrunk by the browser and its labels become unreadable: every
    figsize fits the column (book.plots.COLUMN_IN), or the cell is tagged full-width and fits that
    (FULL_WIDTH_IN)."""
    from book.plots import COLUMN_IN, FULL_WIDTH_IN
    for path in CHAPTERS:
        for i, c in enumerate(json.loads(path.read_text())["cells"]):
            if c["cell_type"] != "code":
                continue
            wide = "full-width" in c["metadata"].get("tags", [])
            limit = FULL_WIDTH_IN if wide else COLUMN_IN
            for w in re.findall(r"figsize=\(\s*([0-9.]+)\s*,", "".join(c["source"])):
                assert float(w) <= limit + 0.1, f"{path.name} cell {i}: figsize width {w} > {limit} in"


def test_code_lines_fit_the_column():
    """Code lines fit 79 characters (chapters/AUTHORING.md): the browser check fails on a code block that scrolls,
    and this finds such a line before the chapters run."""
    for path in CHAPTERS:
        for i, c in enumerate(json.loads(path.read_text())["cells"]):
            if c["cell_type"] == "code":
                long = [line for line in "".join(c["source"]).split("\n") if len(line) > 79]
                assert not long, f"{path.name} cell {i}: lines over 79 characters: {long}"


def test_every_code_cell_parses():
    """A syntax error in a chapter is found here in a second, not after the chapters before it have run."""
    import ast
    for path in CHAPTERS:
        for i, c in enumerate(json.loads(path.read_text())["cells"]):
            if c["cell_type"] == "code":
                try:
                    ast.parse("".join(c["source"]))
                except SyntaxError as e:
                    raise AssertionError(f"{path.name} cell {i}: {e}") from None
