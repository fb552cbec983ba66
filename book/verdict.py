"""Sentences that judge a measurement, written by code from the measurement (chapter 00: "true on any device").

The prose of a chapter states what holds on every device; whenever a sentence says *fast or slow, agrees or not,
memory-bound or not*, a cell computes it with these helpers, so the live notebook and the static page say what the
numbers beside them say, whatever machine produced them. Each helper returns a `Verdict`, which prints as plain
text and renders as Markdown in Jupyter (live and in the built book).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from .timing import time_unit

__all__ = ["Verdict", "compare", "ratio", "bound", "trend", "pick", "say", "inversions", "pct", "OUTCOMES"]

#: The outcomes a verdict can have; unit tests drive each of them with contrasting numbers.
OUTCOMES = ("agrees", "above", "below", "noisy", "memory-bound", "compute-bound", "neither", "rises", "falls",
            "flat", "holds", "fails")


@dataclass(frozen=True)
class Verdict:
    """A sentence computed from measurements, with the branch it took (`outcome`) for tests and later cells."""

    text: str
    outcome: str
    values: dict[str, float] = field(default_factory=dict)
    label: str = "On this device"     # what the numbers come from: this device, a training record, published runs

    def __str__(self) -> str:
        return self.text

    def _repr_markdown_(self) -> str:
        return f"**{self.label}:** {_after_colon(self.text)}"

    def labelled(self, label: str) -> "Verdict":
        """The same sentence judged from numbers that were not measured here, e.g. "From the training record"
        (chapter 06)."""
        if not label.strip():
            raise ValueError("a verdict's label must name where its numbers come from")
        return replace(self, label=label.strip())

    def __bool__(self) -> bool:        # a verdict is truthy when the claim it checks holds
        return self.outcome in ("agrees", "holds", "memory-bound", "compute-bound", "rises", "falls", "flat")


#: First words a verdict keeps capitalised after "On this device:" (names, not sentence starts).
NAMES = frozenset({"Hugging", "Llama", "Jacobi", "Mistral", "Orca", "Mercury", "Gemini", "Python", "Colab", "Intel",
                   "Apple", "Medusa", "Leviathan", "Chen", "Pinsker", "Jensen"})


def _after_colon(text: str) -> str:
    """A sentence continued after "On this device:" starts in lower case, unless its first word is a name or an
    acronym (HF, TTFT, MBU) (chapter 00)."""
    first = text.split(" ", 1)[0].rstrip(",:;")
    first = first[:-2] if first.endswith("'s") else first     # "Pinsker's" -> "Pinsker"; "As" stays "As"
    if len(first) > 1 and first[0].isupper() and first[1:].islower() and first not in NAMES:
        return text[0].lower() + text[1:]
    return text


def _num(x: float, name: str) -> float:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        raise ValueError(f"{name} must be a finite number, got {x!r}")
    return float(x)


def _sig(x: float, digits: int) -> str:
    """`digits` significant figures, trailing zeros kept (22.0, not 22, beside a table's 22.0) (chapter 00)."""
    s = f"{x:#,.{digits}g}"
    return s[:-1] if s.endswith(".") else s


def _fmt(x: float, unit: str, digits: int = 3, to_s: bool = True) -> str:
    unit = unit.strip()   # " steps" and "steps" print alike: one space before the unit
    if to_s and unit == "ms" and time_unit(x / 1e3, digits)[1] == "s":   # 7.68 s, not 7,676 ms (format_seconds)
        return _fmt(x / 1e3, "s", digits)
    if unit in ("ms", "s", "us"):
        return f"{_sig(x, digits)} {unit}" if abs(x) < 100 else f"{x:,.{digits - 3}f} {unit}"
    if unit == "x":              # 0.91x and 7.75x to two decimals, 12.8x to three figures like `_ratio`
        return f"{x:,.{digits - 1}f}x" if abs(x) < 10 else f"{_sig(x, digits)}x"
    if unit:
        return f"{_sig(x, digits)} {unit}" if abs(x) < 1000 else f"{x:,.{digits - 3}f} {unit}"
    return _sig(x, digits) if abs(x) < 1000 else f"{x:,.{digits - 3}f}"


def _ratio(r: float) -> str:
    """A ratio to two decimals from 0.1 to 10, two significant figures under 0.1 (0.038) and three from 10 (19.2, not
    19.15): a timing's noise makes the fourth figure meaningless (chapter 00)."""
    if abs(r) < 0.1:
        return _sig(r, 2)                  # 0.038, not 0.04
    return f"{r:.2f}" if abs(r) < 10 else _sig(r, 3) if abs(r) < 1000 else f"{r:,.0f}"   # 13.0, not 13


def _fmt_pair(a: float, b: float, unit: str, digits: int = 3) -> tuple[str, str]:
    """Two values printed side by side, with at least `digits` significant figures and more only where rounding
    would invent a gap or more than double it: 207.5 and 207.48 print as 207.5 and 207.5, not 208 and 207, while
    22.43 and 22.49 stay 22.4 and 22.5 (a fourth figure a timing's noise does not support); both in one unit
    (chapter 00)."""
    if unit.strip() == "ms" and time_unit(max(abs(a), abs(b)) / 1e3)[1] == "s":   # 7.68 s and 4.14 s, both in s,
        if min(abs(a), abs(b)) >= 100:                                             # but 86.9 ms beside 1,306 ms
            a, b, unit = a / 1e3, b / 1e3, "s"
    for d in range(digits, max(digits, 5) + 1):
        sa, sb = _fmt(a, unit, d, to_s=False), _fmt(b, unit, d, to_s=False)
        if sa == sb or abs(_printed(sa) - _printed(sb)) <= 2 * abs(a - b):
            return sa, sb
    return sa, sb


def _printed(s: str) -> float:
    """The number a formatted value shows ("1,234 ms" -> 1234.0), to compare a printed gap with the real one."""
    return float(re.match(r"-?[\d,]*\.?\d+", s).group().replace(",", ""))


def compare(measured: float, predicted: float, *, what: str, unit: str = "", tol: float = 0.15,
            spread: float | None = None, above: str = "", below: str = "", against: str = "predicted",
            tol_name: str = "", digits: int = 3, measured_name: str = "measured") -> Verdict:
    """Measured against predicted: 'agrees' within `tol` (relative), else 'above' or 'below', each followed by the
    known reason the caller gives for that direction; 'noisy' when the measurement's relative `spread` (e.g. IQR /
    median) is larger than both `tol` and the gap, so the data cannot tell. `against` names the reference when it
    is not a prediction (e.g. "the median"); `tol_name` says where the tolerance comes from when the page prints it
    elsewhere (e.g. "the read samples' range in the table"); `digits`: at least this many significant figures, as
    the table beside it prints; `measured_name` names a value derived from a measurement (e.g. "scaled")
    (chapter 00)."""
    m, p, tol = _num(measured, "measured"), _num(predicted, "predicted"), _num(tol, "tol")
    if p <= 0 or m < 0 or tol <= 0 or not isinstance(digits, int) or digits < 1:
        raise ValueError(f"need predicted > 0, measured >= 0, tol > 0, digits >= 1; got {predicted}, {measured}, "
                         f"{tol}, {digits}")
    r = m / p
    gap = max(r, 1 / r) - 1 if r > 0 else float("inf")   # symmetric: half and double are the same distance
    vals = {"measured": m, "predicted": p, "ratio": r}
    ref = "the prediction" if against == "predicted" else against
    sm, sp = _fmt_pair(m, p, unit, digits)
    rt = f"{r:.3f}" if abs(gap - tol) < 0.005 else _ratio(r)     # on the cut: the digit that decides
    head = f"{what}: {measured_name} {sm}, {against} {sp}, a ratio of {rt}"
    if spread is not None and _num(spread, "spread") > max(tol, gap):
        return Verdict(f"{head}; the run-to-run spread ({spread:.0%}) is larger than the gap, so this run "
                       f"cannot tell whether they agree.", "noisy", vals)
    if gap <= tol:
        named = f" ({tol_name})" if tol_name else ""
        return Verdict(f"{head}: they agree within {tol:.0%}{named}.", "agrees", vals)
    reason = above if r > 1 else below
    side = "above" if r > 1 else "below"
    return Verdict(f"{head}: {side} {ref}" + (f"; {reason.rstrip('.')}." if reason else "."), side, vals)


def ratio(a: float, b: float, *, a_name: str, b_name: str, what: str = "time", tol: float = 0.1,
          spread: float | None = None) -> Verdict:
    """How two measurements of the same thing compare ('agrees' = the same within `tol`; 'above' = a larger;
    'below' = a smaller), e.g. two decoders' step times (chapter 00)."""
    x, y = _num(a, a_name), _num(b, b_name)
    if x <= 0 or y <= 0:
        raise ValueError(f"both values must be positive, got {a_name}={a}, {b_name}={b}")
    r = x / y
    vals = {"a": x, "b": y, "ratio": r}
    if spread is not None and _num(spread, "spread") > max(tol, abs(r - 1)):
        return Verdict(f"{a_name} and {b_name} differ by a factor of {_ratio(r)} in {what}, within this run's spread "
                       f"({spread:.0%}): too noisy to rank them.", "noisy", vals)
    if abs(r - 1) <= tol:
        return Verdict(f"{a_name} and {b_name} take the same {what} within {tol:.0%} (ratio {_ratio(r)}).", "agrees", vals)
    verb = "takes" if what == "time" else "has"
    if r > 1:
        return Verdict(f"{a_name} {verb} {_ratio(r)}x the {what} of {b_name}.", "above", vals)
    return Verdict(f"{a_name} {verb} {_ratio(r)}x the {what} of {b_name} (1/{_ratio(1 / r)}).", "below", vals)


def bound(mbu: float, mfu: float, *, what: str = "this step", at_least: float = 0.5,
          against: str = "the measured read bandwidth", roof: str | None = None,
          causes: str | None = None) -> Verdict:
    """Which roof a measured kernel sits under: memory-bound when it streams at least `at_least` of the measured
    bandwidth (MBU, taken `against` the bandwidth it names) and uses less of the compute roof (MFU); compute-bound
    the other way round; 'neither' when both are below `at_least` (overheads dominate), with the reasons that fit
    the roof the roofline predicts for it (`roof`: "memory" or "compute"), or the `causes` the caller knows
    (a CUDA graph has no launches or Python to blame) (chapter 02)."""
    u, f = _num(mbu, "MBU"), _num(mfu, "MFU")
    if u < 0 or f < 0:
        raise ValueError(f"MBU and MFU must be >= 0, got {mbu}, {mfu}")
    vals = {"mbu": u, "mfu": f}
    over = (" A share above 100% means this run went faster than the ceiling measured earlier, which is one "
            "benchmark's result (one large square product, one way of reading memory) at one moment, not the "
            "hardware's limit.") if max(u, f) > 1 else ""
    pu, pf = pct(u), pct(f)
    if u >= at_least and u >= f:
        return Verdict(f"{what} streams memory at {pu} of {against} and uses {pf} of the "
                       f"compute roof: it is memory-bound.{over}", "memory-bound", vals)
    if f >= at_least and f > u:
        return Verdict(f"{what} uses {pf} of the measured matmul rate and {pu} of {against}: it is "
                       f"compute-bound.{over}", "compute-bound", vals)
    why = causes or ("products that run below the peak rate at these shapes, attention and element-wise work, "
                     "per-call costs (Python, dispatch, a GPU's kernel launches)" if roof == "compute" else
                     "kernels that stream below the memory's speed, per-call costs (Python, dispatch, a GPU's "
                     "kernel launches)")
    if pu == pct(at_least):                  # 49.8% is not 50%: show the digit that decides
        pu = f"{u:.1%}"
    return Verdict(f"{what} reaches only {pu} of {against} and {pf} of the matmul rate, both under the "
                   f"{pct(at_least)} this book counts as bound: neither roof is reached, so time goes to something "
                   f"else ({why}).", "neither", vals)


def pct(x: float) -> str:
    """A share as the book's tables print it: whole percent from 10%, one decimal below (2.4%, not 2%), two
    significant figures below 0.1% (0.042%, not 0.0%) (chapter 02)."""
    if 0 < x < 0.00095:
        return f"{x * 100:.2g}%"
    return f"{x:.0%}" if x >= 0.0995 else f"{x:.1%}"   # 0.0998 rounds to 10.0%: print it as 10%


def trend(xs: Sequence[float], ys: Sequence[float], *, what: str, x_name: str, unit: str = "",
          flat: float = 0.15, spread: float | None = None) -> Verdict:
    """Whether `ys` rise, fall or stay flat (within `flat`, relative) from the first x to the last; 'noisy' when
    the change is within the measurements' relative `spread`, or the series zigzags by more than its net change
    (chapter 00)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"need two equal-length series of at least 2 points, got {len(xs)} and {len(ys)}")
    y0, y1 = _num(ys[0], "first y"), _num(ys[-1], "last y")
    if y0 <= 0:
        raise ValueError(f"the first value must be positive, got {y0}")
    r = y1 / y0
    vals = {"first": y0, "last": y1, "ratio": r}
    span = f"from {_fmt(y0, unit)} at {x_name} = {xs[0]:,} to {_fmt(y1, unit)} at {x_name} = {xs[-1]:,}"
    ys_f = [_num(y, "y") for y in ys]
    steps = [b - a for a, b in zip(ys_f, ys_f[1:])]
    against = sum(abs(d) for d in steps if (d > 0) != (y1 > y0))     # movement against the net direction
    if max(abs(y / y0 - 1) for y in ys_f) <= flat:      # every point, not only the two ends: a zigzag inside
        return Verdict(f"{what} stays within {flat:.0%} {span} ({_ratio(r)}x).", "flat", vals)   # the band is flat
    if (spread is not None and abs(r - 1) <= _num(spread, "spread")) or against > abs(y1 - y0):
        why = (f"within the run-to-run spread ({spread:.0%})" if spread is not None and abs(r - 1) <= spread
               else "and the points in between move up and down by more than that")
        return Verdict(f"{what} goes {span} ({_ratio(r)}x), {why}: too noisy to call a trend.", "noisy", vals)
    if abs(r - 1) <= flat:                               # back near the start, but not flat on the way
        peak = max(ys_f, key=lambda y: abs(y / y0 - 1))
        return Verdict(f"{what} goes {span} ({_ratio(r)}x), but reaches {_fmt(peak, unit)} on the way "
                       f"({peak / y0:.2f}x): not flat.", "rises" if peak > y0 else "falls", vals)
    extra, inner = "", ys_f[1:-1]
    if inner:   # an inner point past the far end by over half the net change: say so ("rises" would hide it)
        top = max(inner) if r > 1 else min(inner)
        if abs(top - y1) > 0.5 * abs(y1 - y0) and (top > y1) == (r > 1):
            extra = (f", {'peaking at' if r > 1 else 'dipping to'} {_fmt(top, unit)} at {x_name} = "
                     f"{xs[1 + inner.index(top)]:,} on the way")
    return Verdict(f"{what} {'rises' if r > 1 else 'falls'} {span} ({_ratio(r)}x){extra}.", "rises" if r > 1 else "falls",
                   vals)


def pick(value: float, branches: Sequence[tuple[Callable[[float], bool], str]], *, otherwise: str,
         outcome_names: Sequence[str] | None = None) -> Verdict:
    """The first branch whose test holds for `value` writes the sentence ({v} is replaced by the value); for claims
    that need their own thresholds (chapter 00)."""
    v = _num(value, "value")
    for i, (test, text) in enumerate(branches):
        if test(v):
            name = outcome_names[i] if outcome_names else "holds"
            return Verdict(text.format(v=v), name, {"value": v})
    return Verdict(otherwise.format(v=v), "fails", {"value": v})


def inversions(sizes: Sequence[float], times: Sequence[float], *, tol: float | Sequence[float] = 0.0
               ) -> list[tuple[float, float]]:
    """The neighbouring sizes (smaller, larger), `sizes` ascending, where the larger timed faster than the smaller
    by more than the relative margin `tol`: one number, or one per point (a run's spread), a pair using the larger
    of its two. Work that grows with the size cannot cost less, so each pair is noise or a change of kernel between
    the two shapes, and a chapter says so beside its table (chapters 04-05)."""
    n = len(sizes)
    tols = [float(tol)] * n if isinstance(tol, (int, float)) else [float(t) for t in tol]
    if len(times) != n or len(tols) != n:
        raise ValueError(f"need one time (and one tolerance) per size; got {n} sizes, {len(times)} times, "
                         f"{len(tols)} tolerances")
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"sizes must be ascending, got {list(sizes)}")
    if any(not 0 <= t < 1 for t in tols):
        raise ValueError(f"tolerances are fractions in [0, 1), got {tols}")
    return [(sizes[i], sizes[i + 1]) for i in range(n - 1)
            if times[i + 1] < times[i] * (1 - max(tols[i], tols[i + 1]))]


def say(condition: bool, if_true: str, if_false: str, **values: float) -> Verdict:
    """The simplest verdict: one sentence if a measured condition holds, another if it does not (chapter 00)."""
    return Verdict(if_true.format(**values) if condition else if_false.format(**values),
                   "holds" if condition else "fails", {k: float(v) for k, v in values.items()})
