"""The book's figure style, shared by every chapter (chapter 00)."""
from __future__ import annotations

import math

import matplotlib

__all__ = ["apply_style", "bytes_ticks", "COLUMN_IN", "FULL_WIDTH_IN", "format_bytes", "plain_log_ticks"]


#: Widest figure, in inches at 100 dpi, that the book's text column (688 px) shows at full size; a cell tagged
#: `full-width` spans 136% of the column (935 px), room for FULL_WIDTH_IN. tests/test_book_config.py enforces both.
COLUMN_IN, FULL_WIDTH_IN = 6.9, 9.3


def apply_style() -> None:
    """One consistent look: readable sizes, light grids, no top/right spines; in a notebook, figures are drawn at
    twice the pixels they are shown at, so they stay sharp on high-density screens (chapter 00)."""
    matplotlib.rcParams.update({
        "figure.figsize": (COLUMN_IN, 3.8), "figure.dpi": 100, "savefig.dpi": 100, "savefig.bbox": "tight",
        "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
        "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9, "legend.frameon": False,
    })
    try:
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:          # plain Python: no inline figures to set up
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "kernel"):
        import matplotlib.pyplot as _plt  # noqa: F401 - activates the inline backend, which would reset the formats
        shell.run_line_magic("config", "InlineBackend.figure_formats = ['retina']")
        set_matplotlib_formats("retina")


def _ticks_within(lo: float, hi: float, mantissas: tuple[int, ...]) -> int:
    """How many of m x 10^k (m in `mantissas`) lie in [lo, hi], lo > 0."""
    return sum(lo <= m * 10.0 ** k <= hi for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
               for m in mantissas)


def plain_log_ticks(ax, axis: str = "y", minor: bool = True, scale: float = 1.0, floor: bool = True) -> None:
    """Label a logarithmic axis in plain numbers (200, not 2 x 10^2), the minor ticks only at 2 and 5 of each decade
    (or none with minor=False, for an axis of many decades), so a log axis does not crowd its labels; an axis on
    which those would label fewer than two ticks when called labels every minor tick, so it shows more than one
    number (3.5 to 6 ms would show only 5, 12 to 47 only 20); `scale` divides the labels (1e9 labels FLOP/s in
    GFLOP/s: 100, not 1e+11; the caller names the unit); with `floor`, a y axis whose bottom lies at most 1.5x above a
    labelled tick is lowered to show it, so the lowest point has a number under it (10.7 gets a 10) (chapter 00)."""
    from matplotlib.ticker import FuncFormatter
    if axis not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y', got {axis!r}")
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v / scale:g}"))
    lo, hi = sorted(target.get_view_interval())
    digits = "125" if lo > 0 and _ticks_within(lo, hi, (1, 2, 5)) >= 2 else "123456789"   # narrow: every tick
    if floor and axis == "y" and lo > 0:      # a label at or under the lowest point, when one is near
        k = math.floor(math.log10(lo))
        labelled = [int(d) for d in digits] if minor else [1]
        under = max(m * 10.0 ** e for e in (k - 1, k) for m in labelled if m * 10.0 ** e <= lo)
        if under < lo <= 1.5 * under:
            ax.set_ylim(bottom=under / 1.05)
    target.set_minor_formatter(FuncFormatter(lambda v, _: f"{v / scale:g}" if minor and f"{v:.0e}"[0] in digits
                                             else ""))


def label_points(ax, xs, ys, labels, *, min_gap: float = 0.12, fontsize: int = 7) -> list[str]:
    """Annotate points of a log-log plot in order, skipping a label whose point lies within `min_gap` decades (on
    both axes) of the last one labelled, so labels of points that crowd together do not print over each other; a
    label goes under its point, or over it where the point sits in the lowest tenth of the axes (under it, the
    x-axis would cut it) or where, under it, it would run into the previous label (its width estimated from its
    characters); returns the labels drawn (chapter 02)."""
    drawn, last, box = [], None, None
    y0, y1 = sorted(ax.get_ylim())
    lo, hi = (math.log10(y0), math.log10(y1)) if y0 > 0 else (0.0, 0.0)
    pt = ax.figure.dpi / 72                                    # display pixels per point
    for x, y, text in zip(xs, ys, labels):
        if x <= 0 or y <= 0:
            raise ValueError(f"a log-log point needs x, y > 0, got ({x}, {y})")
        here = (math.log10(x), math.log10(y))
        if last is not None and abs(here[0] - last[0]) < min_gap and abs(here[1] - last[1]) < min_gap:
            continue
        low = hi > lo and (here[1] - lo) / (hi - lo) < 0.1
        dy = 4 if low else -10
        px, py = ax.transData.transform((x, y))
        left = px + 4 * pt
        if box is not None and left < box[1] and abs(py + dy * pt - box[2]) < 9 * pt:
            dy = -10 if dy > 0 else 4                           # the other side of its point
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, dy), fontsize=fontsize)
        box = (left, left + 0.62 * fontsize * len(text) * pt, py + dy * pt)
        drawn.append(text)
        last = here
    return drawn


def format_bytes(n: float) -> str:
    """'512 B', '4 KiB', '1.5 GiB' (chapter 00)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def bytes_ticks(lo: float, hi: float, step: int = 8) -> list[int]:
    """Tick positions for a byte-size axis from `lo` to `hi`: powers of two every `step`-fold, counted down from the
    largest power of two within `hi`, so the axis's largest size is labelled (chapter 00)."""
    if not 0 < lo <= hi or step < 2:
        raise ValueError(f"need 0 < lo <= hi and step >= 2, got lo={lo}, hi={hi}, step={step}")
    t, ticks = 2 ** int(math.floor(math.log2(hi))), []
    while t >= lo:
        ticks.append(t)
        t //= step
    return ticks[::-1]
