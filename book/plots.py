"""The book's figure style, shared by every chapter (chapter 00)."""
from __future__ import annotations

import matplotlib

__all__ = ["apply_style", "BYTES_TICKS", "format_bytes"]


def apply_style() -> None:
    """One consistent look: readable sizes, light grids, no top/right spines (chapter 00)."""
    matplotlib.rcParams.update({
        "figure.figsize": (7.0, 3.8), "figure.dpi": 100, "savefig.dpi": 100, "savefig.bbox": "tight",
        "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
        "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9, "legend.frameon": False,
    })


def format_bytes(n: float) -> str:
    """'512 B', '4 KiB', '1.5 GiB' (chapter 00)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


#: Tick positions for byte-size axes, 1 KiB to 64 GiB.
BYTES_TICKS = [2**k for k in range(10, 37, 3)]
