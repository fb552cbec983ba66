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


def test_static_slider_precomputes_every_frame(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    widgets.slider(_draw, size=[1, 2, 4], kind=["sum", "copy"], value={"size": 2}, fmt={"size": "{} MiB"},
                   static=True)
    html = shown[0].data
    frames = json.loads(re.search(r'<script type="application/json"[^>]*>(.*?)</script>', html).group(1))
    assert len(frames) == 6                                     # every combination, once
    assert frames[0][1] == "sum at 1\n" and frames[5][1] == "copy at 4\n"
    assert all(f[0].startswith("iVBOR") for f in frames)        # PNG images
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
