"""Self-checking exercises: say right or wrong, and why (chapter 00)."""
from __future__ import annotations

import math
import textwrap

__all__ = ["check_number", "check_choice"]


def _wrap(text: str) -> str:
    """Fold long feedback to the width of the book's output boxes."""
    return textwrap.fill(text, width=80, subsequent_indent="  ")


def _fmt(x: float) -> str:
    return f"{x:,.4g}"


def _tol(rel_tol: float) -> str:
    if rel_tol <= 0:
        return "exactly"
    return f"within {rel_tol:.0%}" if rel_tol >= 0.01 else f"within {rel_tol:.1%}" if rel_tol >= 0.001 else \
        f"within {rel_tol:.1e} relative"


def check_number(answer: float | None, expected: float, *, rel_tol: float = 0.05, unit: str = "",
                 why: str = "") -> bool:
    """Compare a numeric answer with the expected value within a relative tolerance; print the verdict (chapter 00)."""
    u = f" {unit}" if unit else ""
    if answer is None or answer is ...:
        print(f"Replace None with your answer{' in ' + unit if unit else ''} and run the cell again.")
        return False
    try:
        value = float(answer)
    except (TypeError, ValueError):
        print(f"✗ Your answer should be a number{' in ' + unit if unit else ''}, got {answer!r}.")
        return False
    if not math.isfinite(value):
        print(f"✗ Your answer should be a finite number, got {value}.")
        return False
    ok = math.isclose(value, expected, rel_tol=rel_tol)
    if ok:
        print(f"✓ Right: {_fmt(value)}{u} (expected {_fmt(expected)}{u}, {_tol(rel_tol)}).")
    else:
        off = value / expected if expected else float("inf")
        hint = f" You are off by a factor of {off:.3g}: check the units." if off > 5 or off < 0.2 else ""
        print(f"✗ Not quite: {_fmt(value)}{u}, expected {_fmt(expected)}{u} ({_tol(rel_tol)}).{hint}")
    if why:
        print("  Why: " + why)
    return ok


def check_choice(answer: str | None, expected: str, options: dict[str, str]) -> bool:
    """Check a multiple-choice answer given as a letter; explain each option (chapter 00)."""
    if answer is None:
        print(f"Replace None with one of {', '.join(repr(k) for k in options)} and run the cell again.")
        return False
    key = str(answer).strip().lower()
    if key not in {k.lower() for k in options}:
        print(f"✗ {answer!r} is not an option; choose one of {', '.join(repr(k) for k in options)}.")
        return False
    ok = key == expected.lower()
    print(_wrap(("✓ Right: " if ok else f"✗ Not quite (you chose {answer!r}). The answer: ") + options[expected]))
    if not ok:
        chosen = next(v for k, v in options.items() if k.lower() == key)
        print(_wrap("  Your choice: " + chosen))
    return ok
