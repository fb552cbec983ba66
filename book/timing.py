"""One timer that is correct on CUDA, MPS and CPU: warm-up, synchronisation, repeats, median and spread (chapter 00)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, TypeVar

import torch

from .device import as_device, synchronize

__all__ = ["Timing", "time_fn", "time_in_turn", "format_seconds", "time_unit"]

K = TypeVar("K", bound=Hashable)


def time_unit(s: float, digits: int = 3) -> tuple[float, str]:
    """(scale, unit) a duration of `s` seconds prints in: µs below a millisecond, ms below a second, s above,
    judged after rounding to `digits` significant figures, so 999.96 ms is '1.00 s', not '1.00e+03 ms'. The one
    rule for `format_seconds` and the verdicts (chapter 00)."""
    for scale, unit in ((1e-6, "µs"), (1e-3, "ms")):
        if float(f"{abs(s) / scale:.{digits}g}") < 1000:
            return scale, unit
    return 1.0, "s"


def format_seconds(s: float) -> str:
    """Format a duration with a sensible unit (`time_unit`) and three significant figures, trailing zeros kept:
    '812 µs', '12.3 ms', '30.0 ms', '1.42 s' (chapter 00)."""
    scale, unit = time_unit(s)
    text = f"{s / scale:#.3g}"
    return f"{text.rstrip('.')} {unit}" if "e" not in text else f"{s:,.0f} s"


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted list."""
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Timing:
    """Seconds per call from repeated, synchronised runs; summarised by the median (chapter 00)."""

    times: tuple[float, ...]
    device: str = "cpu"
    number: int = 1  # calls averaged inside each repeat (for work shorter than the timer's resolution)

    def __post_init__(self) -> None:
        if not self.times:
            raise ValueError("a Timing needs at least one measured repeat")

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def max(self) -> float:
        return max(self.times)

    @property
    def p10(self) -> float:
        return _quantile(sorted(self.times), 0.10)

    @property
    def p90(self) -> float:
        return _quantile(sorted(self.times), 0.90)

    @property
    def quartiles(self) -> tuple[float, float]:
        """The 25th and 75th percentiles of the times (chapter 01 draws them as error bars)."""
        xs = sorted(self.times)
        return _quantile(xs, 0.25), _quantile(xs, 0.75)

    @property
    def iqr(self) -> float:
        q1, q3 = self.quartiles
        return q3 - q1

    @property
    def spread(self) -> float:
        """Relative spread: interquartile range / median."""
        return self.iqr / self.median if self.median > 0 else 0.0

    def __str__(self) -> str:
        return (f"{format_seconds(self.median)} median (IQR {format_seconds(self.iqr)}, "
                f"{len(self.times)} repeats on {self.device})")


def _calibrate(fn: Callable[[], Any], dev: torch.device, target_s: float) -> int:
    """How many calls per repeat so that one repeat lasts at least `target_s`."""
    number = 1
    while True:
        synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        synchronize(dev)
        elapsed = time.perf_counter() - t0
        if elapsed >= target_s or number >= 1 << 20:
            return number
        number = max(number * 2, int(number * target_s / max(elapsed, 1e-9) * 1.2))


def time_fn(fn: Callable[[], Any], *, device: torch.device | str | None = None, warmup: int = 3,
            repeats: int = 10, number: int | None = 1, min_repeat_s: float = 2e-3) -> Timing:
    """Time `fn()`: warm up, synchronise, repeat, and return seconds per call (chapter 00).

    On CUDA each repeat is bracketed by CUDA events, so the GPU's own clock times the queued work.
    `number=None` calibrates how many calls one repeat averages so it lasts at least `min_repeat_s`.
    """
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
    if number is not None and number < 1:
        raise ValueError(f"number of calls per repeat must be >= 1, got {number}")
    dev = as_device(device)
    for _ in range(warmup):
        fn()
    if number is None:
        number = _calibrate(fn, dev, min_repeat_s)
    synchronize(dev)
    times: list[float] = []
    if dev.type == "cuda":
        pairs = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(number):
                fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize(dev)
        times = [s.elapsed_time(e) / 1e3 / number for s, e in pairs]
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            synchronize(dev)
            times.append((time.perf_counter() - t0) / number)
    return Timing(times=tuple(times), device=str(dev), number=number)


def time_in_turn(fns: Mapping[K, Callable[[], Any]], *, device: torch.device | str | None = None, warmup: int = 1,
                 rounds: int = 5) -> dict[K, Timing]:
    """Time several functions in turn: `warmup` untimed calls of each, then `rounds` rounds that time one call of
    each, so that a machine whose speed drifts (a shared host, a clock that ramps) slows all of them alike instead of
    whichever ran last; one Timing per key (chapter 01)."""
    if not fns:
        raise ValueError("time_in_turn needs at least one function to time")
    if warmup < 0 or rounds < 1:
        raise ValueError(f"need warmup >= 0 and rounds >= 1, got warmup={warmup}, rounds={rounds}")
    dev = as_device(device)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[K, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            synchronize(dev)
            t0 = time.perf_counter()
            fn()
            synchronize(dev)
            times[k].append(time.perf_counter() - t0)
    return {k: Timing(times=tuple(ts), device=str(dev)) for k, ts in times.items()}
