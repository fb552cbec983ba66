import json
import re

import matplotlib.pyplot as plt
import pytest

from book import widgets


def _draw(size, kind="sum"):
    fig, ax = plt.subplots()
    ax.plot([0, size], [0, 1])
    print(f"{kind} at {size}")
    return fig


def test_grid_values_and_validation():
    assert widgets.grid(1, 4, 4) == [1.0, 2.0, 3.0, 4.0]
    assert widgets.grid(1, 1000, 4, log=True) == pytest.approx([1, 10, 100, 1000])
    assert widgets.grid(1, 9, 5, integer=True) == [1, 3, 5, 7, 9]
    for args, kwargs, msg in [((5, 1, 3), {}, "upward"), ((1, 5, 1), {}, "at least 2"),
                              ((0, 5, 3), {"log": True}, "positive start"), ((1, float("inf"), 3), {}, "finite"),
                              ((1, 1.4, 5), {"integer": True}, "fewer than 2")]:
        with pytest.raises(ValueError, match=msg):
            widgets.grid(*args, **kwargs)


@pytest.mark.parametrize("values,msg", [([], "no values"), ([1, 1], "repeats"), ([3, 2], "increase"),
                                        ("abc", "list of values"), ([1, float("nan")], "not finite")])
def test_slider_rejects_invalid_ranges(values, msg):
    with pytest.raises(ValueError, match=msg):
        widgets.slider(_draw, size=values, static=True)


def test_slider_rejects_bad_start_values_and_names():
    with pytest.raises(ValueError, match="not among its values"):
        widgets.slider(_draw, size=[1, 2], value={"size": 3}, static=True)
    with pytest.raises(ValueError, match="not a slider parameter"):
        widgets.slider(_draw, size=[1, 2], fmt={"colour": "{}"}, static=True)
    with pytest.raises(ValueError, match="at least one parameter"):
        widgets.slider(_draw, static=True)
    with pytest.raises(ValueError, match="at most"):
        widgets.slider(_draw, size=list(range(1, 20)), kind=[f"k{i}" for i in range(5)], static=True)


def test_static_slider_precomputes_every_frame(monkeypatch, tmp_path):
    shown = []
    monkeypatch.chdir(tmp_path)                                 # outside a book: every frame inline
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    widgets.slider(_draw, size=[1, 2, 4], kind=["sum", "copy"], value={"size": 2}, fmt={"size": "{} MiB"},
                   static=True)
    html = shown[0].data
    frames = json.loads(re.search(r'<script type="application/json"[^>]*>(.*?)</script>', html).group(1))
    assert len(frames) == 6                                     # every combination, once
    assert frames[0][1] == "sum at 1\n" and frames[5][1] == "copy at 4\n"
    assert all(f[0].startswith("data:image/png;base64,iVBOR") for f in frames)   # PNG images
    assert html.count('type="range"') == 2 and "2 MiB" in html
    assert 'value="1"' in html                                  # starts at size=2
    assert "http" not in html                                   # nothing from a CDN


def test_live_slider_builds_widgets(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    widgets.slider(_draw, size=[1, 2, 4], kind=["sum", "copy"], static=False)
    box = shown[-1]
    assert type(box).__name__ == "VBox" and len(box.children) == 3


def test_static_mode_follows_the_environment(monkeypatch):
    from book.build import is_static
    monkeypatch.setenv("BOOK_STATIC", "1")
    assert is_static()
    monkeypatch.setenv("BOOK_STATIC", "0")
    assert not is_static()


def test_inside_a_book_only_the_start_frame_is_inline(monkeypatch, tmp_path):
    (tmp_path / "_config.yml").write_text("title: t\n")
    (tmp_path / "_toc.yml").write_text("root: intro\n")
    (tmp_path / "chapters").mkdir()
    monkeypatch.chdir(tmp_path / "chapters")                    # notebooks run from their own folder
    assert widgets.frames_dir() == tmp_path / "_static" / "frames"
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    widgets.slider(_draw, size=[1, 2, 4], kind=["sum", "copy"], value={"size": 4, "kind": "copy"}, static=True)
    html = shown[0].data
    frames = json.loads(re.search(r'<script type="application/json"[^>]*>(.*?)</script>', html).group(1))
    inline = [i for i, f in enumerate(frames) if f[0].startswith("data:")]
    assert inline == [5]                                        # size=4, kind=copy: index 2 * 2 + 1
    files = sorted((tmp_path / "_static" / "frames").iterdir())
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in files)   # identical figures share one file
    urls = [f[0] for i, f in enumerate(frames) if i != 5]
    assert all(u.startswith("../_static/frames/") for u in urls)
    assert {(tmp_path / "chapters" / u).resolve() for u in urls} == set(files)
    assert len(html) < len(frames[5][0]) + 5_000                # one image in the page, not six
    assert widgets.frames_dir(tmp_path.parent) is None
