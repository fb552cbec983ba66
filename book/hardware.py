"""GPU datasheets and the measured ceilings of the reader's own device: bandwidth and matmul rate (chapter 00)."""
from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .device import as_device, device_name, last_level_cache_bytes, memory_bytes
from .timing import Timing, time_fn

__all__ = ["GPUSpec", "GPUS", "gpu", "gpu_names", "datasheet_for", "Ceilings", "measure_read_bandwidth",
           "measure_copy_bandwidth", "measure_matmul", "random_tensor", "read_probe", "supported_matmul_dtypes",
           "measured_ceilings",
           "bandwidth_test_bytes", "bandwidth_sweep", "ceilings_file", "sweep_sizes", "reference_suite", "DTYPES"]

GB = 1e9
TFLOP = 1e12

#: The names the book uses for matmul precisions. "tf32" is fp32 storage with TensorFloat-32 tensor-core math.
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                                  "fp16": torch.float16}


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet: memory, bandwidth and dense peak rates in TFLOP/s per precision (chapter 00)."""

    name: str
    memory_gb: float
    bandwidth_gbs: float
    tflops: dict[str, float]  # dense (no structured sparsity); a precision the GPU lacks is absent
    source: str
    notes: str = ""
    aliases: tuple[str, ...] = field(default=())

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense peak in FLOP/s for one precision; a clear error when the GPU lacks it (chapter 02)."""
        if dtype not in self.tflops:
            raise ValueError(f"{self.name} has no {dtype} rate on its datasheet; it has {sorted(self.tflops)}")
        return self.tflops[dtype] * TFLOP

    def ridge_point(self, dtype: str = "bf16") -> float:
        """FLOPs per byte where the roofline bends: peak rate / bandwidth (chapter 02)."""
        return self.peak_flops(dtype) / (self.bandwidth_gbs * GB)


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (r4) and NVIDIA A100 architecture whitepaper"
_HOPPER_NOTE = "Datasheet figures with sparsity are twice these dense ones."

GPUS: dict[str, GPUSpec] = {s.name: s for s in [
    GPUSpec("A100 40GB", 40, 1555, {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, _A100,
            "SXM; HBM2", aliases=("a100-sxm4-40gb", "a100-40gb", "a100 40gb", "a100-pcie-40gb")),
    GPUSpec("A100 80GB", 80, 2039, {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, _A100,
            "SXM; HBM2e (the PCIe card: 1935 GB/s)", aliases=("a100-sxm4-80gb", "a100-80gb", "a100 80gb",
                                                              "a100 80gb pcie", "a100")),
    GPUSpec("H100 SXM", 80, 3350, {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
            "NVIDIA H100 Tensor Core GPU datasheet; dense rates from the NVIDIA H100 architecture whitepaper",
            _HOPPER_NOTE + " HBM3.", aliases=("h100 80gb hbm3", "h100", "h100-sxm5-80gb")),
    GPUSpec("H200", 141, 4800, {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
            "NVIDIA H200 Tensor Core GPU datasheet (compute as H100 SXM)",
            _HOPPER_NOTE + " HBM3e; SXM.", aliases=("h200 sxm", "h200-sxm", "nvidia h200")),
    GPUSpec("L4", 24, 300, {"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121},
            "NVIDIA L4 Tensor Core GPU datasheet", "72 W card; the datasheet's tensor rates are with sparsity, "
            "halved here", aliases=("nvidia l4",)),
    GPUSpec("T4", 16, 320, {"fp32": 8.1, "fp16": 65},
            "NVIDIA T4 Tensor Core GPU datasheet and product page", "Turing: no bf16 or tf32 tensor cores; "
            "fp16 is mixed precision (fp32 accumulate); the datasheet table says 300 GB/s, the product page 320",
            aliases=("tesla t4", "nvidia t4")),
    GPUSpec("A10G", 24, 600, {"fp32": 35, "tf32": 35, "bf16": 70, "fp16": 70},
            "NVIDIA A10G datasheet published by AWS (EC2 G5)", "AWS variant of the A10 (A10: 31.2/62.5/125 "
            "TFLOP/s); rates are dense", aliases=("nvidia a10g",)),
    GPUSpec("RTX 4090", 24, 1008, {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
            "NVIDIA Ada GPU architecture whitepaper, appendix A", "GeForce: fp16/bf16 with fp32 accumulate "
            "(330.3 with fp16 accumulate)", aliases=("geforce rtx 4090", "nvidia geforce rtx 4090", "4090")),
]}


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]+", " ", name.lower().replace("nvidia", "").replace("tesla", "")).strip()


def gpu_names() -> list[str]:
    """The GPUs in the datasheet catalog (chapter 00)."""
    return list(GPUS)


def gpu(name: str) -> GPUSpec:
    """A catalog GPU by name or alias, case-insensitive; an unknown name lists the known ones (chapter 00)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a GPU name must be a non-empty string, got {name!r}; known GPUs: {', '.join(GPUS)}")
    wanted = _key(name)
    for spec in GPUS.values():
        if wanted == _key(spec.name) or wanted in {_key(a) for a in spec.aliases}:
            return spec
    raise KeyError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)}")


def datasheet_for(name: str) -> GPUSpec | None:
    """The catalog entry that matches a device name as torch reports it, e.g. 'NVIDIA H200' (chapter 00)."""
    key = _key(name)
    try:
        return gpu(name)
    except KeyError:
        pass
    # torch names look like "NVIDIA A100-SXM4-80GB" or "NVIDIA GeForce RTX 4090"; match longest alias inside.
    best: tuple[int, GPUSpec] | None = None
    for spec in GPUS.values():
        for alias in (spec.name, *spec.aliases):
            a = _key(alias)
            if a and a in key and (best is None or len(a) > best[0]):
                best = (len(a), spec)
    if best and best[1].name.startswith("A100") and "40" not in key and "80" not in key:
        return None  # an A100 of unknown memory size: do not guess
    return best[1] if best else None


# --------------------------------------------------------------------------------------------- measured ceilings

def bandwidth_test_bytes(device: torch.device | str | None = None) -> int:
    """A tensor size well beyond the last-level cache: 4 x LLC, at least 256 MiB, at most 1/8 of memory (chapter 00)."""
    dev = as_device(device)
    llc = last_level_cache_bytes(dev) or 64 * 2**20
    size = max(256 * 2**20, 4 * llc)
    if dev.type == "cuda":
        size = max(size, 2 * 2**30)
    mem = memory_bytes(dev)
    if mem:
        size = min(size, mem // 8)
    return int(size) // 4096 * 4096


def random_tensor(*shape: int, device: torch.device | str | None = None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random values to time on (never zeros); on the CPU a tiled random block: as random to DRAM, 5x faster (chapter 00)."""
    dev = as_device(device)
    numel = 1
    for s in shape:
        if s <= 0:
            raise ValueError(f"tensor sizes must be positive, got shape {shape}")
        numel *= s
    block = 1 << 20
    if dev.type != "cpu" or numel <= block:
        return torch.randn(*shape, device=dev).to(dtype)
    tile = torch.randn(block).to(dtype)
    flat = tile.repeat(-(-numel // block))[:numel]
    return flat.reshape(shape).clone() if numel % block else flat.reshape(shape)


def _random_tensor(nbytes: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return random_tensor(max(1, nbytes // torch.empty((), dtype=dtype).element_size()), device=device, dtype=dtype)


def read_probe(read_bytes: int, device: torch.device | str | None = None) -> dict[str, Callable[[], Any]]:
    """{"read": a `sum` over a fresh tensor of `read_bytes`}, or {} for 0: added to the functions a
    `book.timing.time_in_turn` call times, it samples the memory's read bandwidth in the same rounds as them
    (chapters 01, 02 and 04)."""
    if read_bytes < 0:
        raise ValueError(f"read_bytes must be >= 0, got {read_bytes}")
    return {"read": _random_tensor(read_bytes, as_device(device)).sum} if read_bytes > 0 else {}


def measure_read_bandwidth(nbytes: int | None = None, device: torch.device | str | None = None, *,
                           repeats: int = 10, x: torch.Tensor | None = None) -> tuple[float, Timing]:
    """Read bandwidth in bytes/s: sum a float32 tensor of `nbytes` (read once, nothing written) (chapter 00)."""
    dev = as_device(device)
    if x is None:
        if nbytes is None:
            nbytes = bandwidth_test_bytes(dev)
        if nbytes <= 0:
            raise ValueError(f"tensor size must be positive, got {nbytes} bytes")
        x = _random_tensor(nbytes, dev)
    t = time_fn(lambda: x.sum(), device=dev, warmup=2, repeats=repeats, number=None)
    return x.numel() * x.element_size() / t.median, t


def measure_copy_bandwidth(nbytes: int | None = None, device: torch.device | str | None = None, *,
                           repeats: int = 10) -> tuple[float, Timing]:
    """Copy bandwidth in bytes/s: dst.copy_(src) counted as read + write, 2 x `nbytes` per copy (chapter 00)."""
    dev = as_device(device)
    if nbytes is None:
        nbytes = bandwidth_test_bytes(dev)
    if nbytes <= 0:
        raise ValueError(f"tensor size must be positive, got {nbytes} bytes")
    src = _random_tensor(nbytes, dev)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device=dev, warmup=2, repeats=repeats, number=None)
    return 2 * src.numel() * src.element_size() / t.median, t


def supported_matmul_dtypes(device: torch.device | str | None = None) -> list[str]:
    """The matmul precisions worth measuring on this device (chapter 00)."""
    dev = as_device(device)
    if dev.type == "cuda":
        major, _ = torch.cuda.get_device_capability(dev)
        return ["fp32", "tf32", "bf16", "fp16"] if major >= 8 else ["fp32", "fp16"]
    if dev.type == "mps":
        return ["fp32", "fp16"]
    return ["fp32", "bf16", "fp16"]


_BF16_FAST: dict[str, bool] = {}


def bf16_is_fast(device: torch.device | str | None = None) -> bool:
    """Whether bf16 matrix products run at least FALLBACK_BELOW_FP32 x as fast as fp32 here, i.e. bf16 is not a slow
    fallback: from this process's measured ceilings when there are some, else from one 512 x 512 product of each,
    measured once (chapter 00). Training and evaluation autocast to bf16 only where this holds."""
    dev = as_device(device)
    key = str(dev)
    if key not in _BF16_FAST:
        known = [c for c in _CEILINGS.values() if c.kind == dev.type and "bf16" in c.matmul and "fp32" in c.matmul]
        if known:
            _BF16_FAST[key] = "bf16" not in known[0].fallbacks
        else:
            rate = {d: measure_matmul(d, dev, n=512, repeats=3)[0] for d in ("fp32", "bf16")}
            _BF16_FAST[key] = rate["bf16"] >= FALLBACK_BELOW_FP32 * rate["fp32"]
    return _BF16_FAST[key]


def measure_matmul(dtype: str = "fp32", device: torch.device | str | None = None, *, n: int | None = None,
                   repeats: int = 5, target_s: float | None = None) -> tuple[float, int, Timing]:
    """Matmul rate in FLOP/s of an n x n by n x n product (2n^3 FLOPs) through F.linear, the call a model's layers
    make (on some CPUs `a @ b` in bf16 takes a path several times slower); returns (rate, n, timing) (chapter 00).

    Without `n`, the size doubles from 256 until one product lasts `target_s` (GPU: also n >= 4096), and on while
    the rate still rises by a fifth a doubling (a slow path, such as bf16 on a CPU without it, is slow enough to time
    at n = 256 long before it reaches its own peak), as long as the next product would take under half a second.
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown matmul precision {dtype!r}; use one of {list(DTYPES)}")
    dev = as_device(device)
    if target_s is None:
        target_s = 0.02 if dev.type == "cpu" else 0.005
    tdtype = DTYPES[dtype]
    allow = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        if n is None:
            n, cap, prev = 256, (16384 if dev.type == "cuda" else 4096), 0.0
            while n < cap:
                a = torch.randn(n, n, device=dev).to(tdtype)
                t = time_fn(lambda: F.linear(a, a), device=dev, warmup=1, repeats=1)
                rate = 2 * n**3 / t.median
                if (t.median >= target_s and (dev.type != "cuda" or n >= 4096)
                        and (rate < 1.2 * prev or 8 * t.median > 0.5)):
                    break
                prev, n = rate, n * 2
        if n <= 0:
            raise ValueError(f"matrix size must be positive, got {n}")
        a = torch.randn(n, n, device=dev).to(tdtype)
        b = torch.randn(n, n, device=dev).to(tdtype)
        t = time_fn(lambda: F.linear(a, b), device=dev, warmup=2, repeats=repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow
    return 2 * n**3 / t.median, n, t


#: A low-precision matmul that is not at least this many times as fast as fp32 is only a fallback on this device (fp16
#: on most CPUs): it is labelled as such and never chosen as a chapter's precision for matrix products (a batch-1
#: decode step is chosen by streaming rate instead, DECODE_SWITCH). (Real fast paths are 2x and more;
#: a margin keeps run-to-run noise from flipping the label.)
FALLBACK_BELOW_FP32 = 1.25


def slow_fallbacks(matmul: dict[str, float]) -> list[str]:
    """The low precisions among `matmul` (rates by precision) under `FALLBACK_BELOW_FP32` times fp32's (chapter 00)."""
    fp32 = matmul.get("fp32", 0.0)
    return [d for d in ("bf16", "fp16") if d in matmul and matmul[d] < FALLBACK_BELOW_FP32 * fp32]

#: A batch-1 decode step reads its weights and hardly computes, so its precision is chosen by weights streamed per
#: second through one-row products, not by matmul rate. A precision listed later (fp16 after bf16, fp32 after both)
#: replaces an earlier one only when it streams at least this many times as many weights: two kernels reading the
#: same bytes differ by less than that from run to run, and bf16 keeps fp32's range.
DECODE_SWITCH = 1.25

#: Elements of one of the 4096-row layers the decoder's path is chosen on ([4096, 4096], `measured_ceilings`).
LAYER_ELEMENTS = 4096 * 4096

#: A one-row call whose fixed cost (dispatch, a GPU's kernel launch) is at least this share of its time is set by
#: calls more than by memory: its rate measures launches, not streaming (a GPU's 4096-row layers, chapter 02).
CALL_BOUND_SHARE = 0.5


def call_bound(per_call: tuple[float, float] | None) -> bool:
    """Whether a (seconds a call, seconds of it fixed) pair (`Ceilings.layer_call`) is set by the call's fixed cost
    more than by the bytes it streams (chapter 02)."""
    return per_call is not None and per_call[1] >= CALL_BOUND_SHARE * per_call[0]


def _three(x: float) -> str:
    """At least three significant figures, whole numbers as they are: 0.128, 47.2, 726, 1,234."""
    return f"{x:,.{max(0, 2 - math.floor(math.log10(x)))}f}" if x > 0 else f"{x:g}"


@dataclass(frozen=True)
class Ceilings:
    """Measured ceilings of one device (chapter 00): read and copy bandwidth and matmul rate per precision (medians of
    samples spread in time, with the samples kept), and the matrix-vector ceiling per precision (`book.kernels`).

    Decode reads, so the **read bandwidth is the denominator of decode MBU** everywhere in the book, and the measured
    ridge point is a matmul rate over the same read bandwidth. The read bandwidth is the fastest way of reading the
    tensor once that was measured: `sum`, or a matrix-vector product over the same bytes when one streams faster.
    """

    device: str
    kind: str
    read_bw: float
    copy_bw: float
    matmul: dict[str, float]
    bytes_tested: int
    matmul_sizes: dict[str, int]
    datasheet: GPUSpec | None = None
    samples: dict[str, tuple[float, ...]] = field(default_factory=dict)   # "read", "copy", "matmul <dtype>"
    matvec: dict[str, dict[str, float]] = field(default_factory=dict)     # dtype -> {path: bytes/s}
    matvec_failed: dict[str, dict[str, str]] = field(default_factory=dict)
    matvec_layer: dict[str, dict[str, float]] = field(default_factory=dict)   # dtype -> {path: bytes/s}, 4096 rows
    few_rows: dict[str, dict[str, float]] = field(default_factory=dict)       # dtype -> {path: bytes/s}, 4-16 rows
    matvec_call: dict[str, dict[str, float]] = field(default_factory=dict)    # dtype -> {path: fixed s a call}
    long_rows: dict[str, dict[str, float]] = field(default_factory=dict)  # dtype -> {"whole"/"blocks": bytes/s}
    measured_at: str = ""
    cache_file: str | None = None
    read_kernel: str = "sum"       # the kernel that read fastest: "sum", or a matrix-vector product

    @property
    def read_sum_bw(self) -> float:
        """The median read bandwidth of `sum` alone (chapter 00)."""
        xs = self.samples.get("read", ())
        return statistics.median(xs) if xs else self.read_bw

    @property
    def read_samples(self) -> str:
        """The name of the samples the read bandwidth is the median of: "read" (`sum`), or "matvec <dtype>" where a
        matrix-vector product read faster (chapter 00)."""
        return "read" if self.read_kernel == "sum" else f"matvec {self.read_kernel.split()[1].rstrip(',')}"

    def moved(self, rate: float, samples: str = "read", floor: float = 0.1) -> float | None:
        """`rate` (bytes/s, sampled later beside some work) over the median of the ceiling's `samples`, minus one,
        where that moves beyond the samples' own range (and beyond `floor`); else None: the machine moved since
        the ceilings were measured (chapters 02 and 04)."""
        xs = self.samples.get(samples)
        base = statistics.median(xs) if xs else self.read_bw
        drift = rate / base - 1
        return drift if abs(drift) > max(floor, self.spread(samples)) else None

    def beside_text(self, rate: float, what: str, beside: str = "these steps") -> tuple[float | None, str]:
        """`moved` for a `sum` read at `rate` (bytes/s) in the same rounds as some steps (beyond 15% and the
        samples' range), and the lines that print it against the ceilings' sum, saying which machine `what` (the
        numbers derived from the ceilings) describe where the memory moved (chapters 01 and 04)."""
        drift = self.moved(rate, "read", floor=0.15)
        text = (f"read bandwidth beside {beside} (sum, in the same rounds): {rate / GB:,.1f} GB/s;\n"
                f"the ceilings' sum: {self.read_sum_bw / GB:,.1f} GB/s (range {self.spread('read'):.0%})")
        if drift is not None:
            text += (f"\nthe memory read {drift + 1:.2f}x as fast beside {beside} as when the ceilings were "
                     f"measured:\n{what} (from the ceilings) are for a machine "
                     f"{'slower' if drift > 0 else 'faster'}\nthan this one was during {beside}")
        return drift, text

    @property
    def decode_bw(self) -> float:
        """The bandwidth every decode MBU in the book is measured against: the read bandwidth (chapter 00)."""
        return self.read_bw

    @property
    def fallbacks(self) -> list[str]:
        """Low-precision matmuls not clearly faster than fp32 here (under 1.25x): emulated or unoptimised fallbacks
        (chapter 00)."""
        return slow_fallbacks(self.matmul)

    def spread(self, name: str) -> float:
        """Relative spread (max - min) / median of one ceiling's samples: "read", "copy", "matmul bf16" or
        "layers bf16" (chapter 00)."""
        xs = sorted(self.samples.get(name, ()))
        if len(xs) < 2:
            return 0.0
        return (xs[-1] - xs[0]) / xs[len(xs) // 2]

    def fastest(self, dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32")) -> str:
        """The precision in `dtypes` with the highest measured matmul rate; ties go to the first (chapter 01)."""
        return max(dtypes, key=lambda d: self.matmul.get(d, 0.0))

    def weights_per_s(self, dtype: str) -> float:
        """Weights (parameters) per second the decoder's one-row path streams in `dtype` over 4096-row layers read in
        turn, as a decode step reads them (`layer_bw` over the bytes a weight takes) (chapter 02)."""
        from .models import dtype_bytes
        return self.layer_bw(dtype) / dtype_bytes(dtype)

    def layer_bw(self, dtype: str) -> float:
        """Bytes/s of `dtype`'s 4096-row layers through the decoder's path: the median of the samples taken in turn
        with the other precisions where there are some, else the path's rate from its own measurement, else the
        one-matrix ceiling (chapter 02)."""
        xs = self.samples.get(f"layers {dtype}")
        if xs:
            return statistics.median(xs)
        rates = self.matvec_layer.get(dtype) or self.matvec.get(dtype)
        if not rates:
            raise ValueError(f"no matrix-vector rate measured for {dtype}; measured: {sorted(self.matvec)}")
        return max(rates.values())

    def decode_dtype(self, dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32")) -> str:
        """The precision a batch-1 decode step runs fastest in here: the most weights per second through one-row
        products (`weights_per_s`), which need not be the fastest matmul (`fastest`); one listed later replaces an
        earlier only when it streams DECODE_SWITCH x as many. Where no one-row product was measured, `fastest`
        (chapter 02)."""
        best = None
        for d in dtypes:
            if d not in self.matvec:
                continue
            if best is None or self.weights_per_s(d) >= DECODE_SWITCH * self.weights_per_s(best):
                best = d
        return best or self.fastest(dtypes)

    def decode_text(self, dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32"), *, narrow: bool = False) -> str:
        """One line: the batch-1 decode precision and each measured precision's weights per second; `narrow`: broken
        into short lines for an output column (chapter 02)."""
        have = [d for d in dtypes if d in self.matvec]
        if not have:
            return f"batch-1 decode precision: {self.fastest(dtypes)} (no one-row product measured)"  # the matmul's
        best = self.decode_dtype(dtypes)
        rest = ", ".join(f"{d} {_three(self.weights_per_s(d) / 1e9)}" for d in have if d != best)
        if any(self.weights_per_s(d) > self.weights_per_s(best) for d in have):   # say why a higher rate lost
            rest += f"; another replaces {best} only at {DECODE_SWITCH}x"
        parts = [f"batch-1 decode precision: {best}, {_three(self.weights_per_s(best) / 1e9)} G weights/s",
                 "in one-row products on 4096-row layers"] + ([f"({rest})"] if rest else [])
        return ("\n  " if narrow else " ").join(parts)

    def ridge_point(self, dtype: str = "fp32") -> float:
        """Measured FLOPs per byte where this device's roofline bends: matmul rate / read bandwidth (chapter 02)."""
        return self.matmul[dtype] / self.read_bw

    def matvec_bw(self, dtype: str) -> float:
        """The matrix-vector ceiling: bytes/s of the fastest single matrix-vector product over one large matrix, the
        median of its samples taken in turn with `sum` (else its one measurement) (chapter 02)."""
        rates = self.matvec.get(dtype)
        if not rates:
            raise ValueError(f"no matrix-vector ceiling measured for {dtype}; measured: {sorted(self.matvec)}")
        xs = self.samples.get(f"matvec {dtype}")
        return statistics.median(xs) if xs else max(rates.values())

    def matvec_path(self, dtype: str) -> str:
        """The decoder's matrix-vector path for `dtype` (see book.kernels.PATHS): the fastest over layer-sized
        matrices read one after another, as a decode step reads them; else the fastest over one large matrix
        (chapter 02)."""
        rates = self.matvec_layer.get(dtype) or self.matvec.get(dtype) or {"linear": 0.0}
        return max(rates, key=rates.get)

    def matvec_costs(self, dtype: str) -> dict[str, tuple[float, float]] | None:
        """Each one-row path's (fixed seconds a call, bytes/s it streams beyond that), from which the decoder picks
        the quickest path for each weight's size (`kernels.call_time`); None where the fixed costs were not measured
        (chapter 02). A 4096-row call's time holds the fixed cost once, so the streaming rate is its bytes over the
        rest; where the fixed cost is most of such a call (a GPU's launches), the rest is too small to measure and
        the path's rate on one large matrix stands in."""
        fixed, rates = self.matvec_call.get(dtype), self.matvec_layer.get(dtype)
        if not fixed or not rates:
            return None
        from .models import dtype_bytes
        size = LAYER_ELEMENTS * dtype_bytes(dtype)
        costs = {}
        for p in fixed:
            if p not in rates or rates[p] <= 0:
                continue
            t = size / rates[p]
            big = self.matvec.get(dtype, {}).get(p)
            stream = big if call_bound((t, fixed[p])) and big else size / (t - fixed[p])
            costs[p] = (fixed[p], stream)
        return costs or None

    def layer_call(self, dtype: str) -> tuple[float, float] | None:
        """(seconds one 4096-row call takes through the decoder's path, seconds of it that path's fixed cost a
        call), or None where the fixed cost was not measured: where the fixed cost is most of the call, the
        4096-row rate is set by calls rather than by memory (chapter 02)."""
        path = self.matvec_path(dtype)
        fixed = self.matvec_call.get(dtype, {}).get(path)
        if fixed is None or not self.matvec_layer.get(dtype):
            return None
        from .models import dtype_bytes
        return LAYER_ELEMENTS * dtype_bytes(dtype) / self.layer_bw(dtype), fixed

    def rows_path(self, dtype: str) -> str:
        """The decoder's path for 2-32 rows of `dtype` (see book.kernels.ROW_PATHS): the faster measured, else
        F.linear (chapter 02)."""
        rates = self.few_rows.get(dtype) or {"linear": 0.0}
        return max(rates, key=rates.get)

    def row_blocks(self, dtype: str) -> bool:
        """Whether the decoder stores `dtype` weights with rows longer than 4096 elements as blocks of their columns:
        where the blocks streamed `kernels.BLOCKS_PAY` times as fast as whole rows (`kernels.blocks_pay`, chapter 02)."""
        from .kernels import blocks_pay
        return blocks_pay(self.long_rows.get(dtype))

    def rows_bw(self, dtype: str) -> float | None:
        """Bytes/s of `dtype`'s few-rows path (4 and 16 rows over 4096-row layers, as a batched step or a
        verification pass reads them): the median of its samples taken in turn with the one-row layers (`layer_bw`),
        else its rate when the paths were compared; None where it was not measured (chapter 02)."""
        rates = self.few_rows.get(dtype)
        if not rates:
            return None
        xs = self.samples.get(f"rows {dtype}")
        return statistics.median(xs) if xs else rates[self.rows_path(dtype)]

    def matvec_ceiling_path(self, dtype: str) -> str:
        """The path that set the matrix-vector ceiling (one large matrix) for `dtype` (chapter 02)."""
        rates = self.matvec.get(dtype) or {"linear": 0.0}
        return max(rates, key=rates.get)

    def matmul_text(self, dtype: str) -> str:
        """One precision's matmul rate in the unit every matmul rate of this device shares: TFLOP/s when the slowest
        is at least 10 GFLOP/s, else GFLOP/s, so a slow fallback prints as "1.35 GFLOP/s", not "0.001 TFLOP/s"
        (chapter 00)."""
        rate = self.matmul[dtype]
        if min(self.matmul.values()) >= 0.01 * TFLOP:     # three significant figures: 0.128, 47.2, 726
            return f"{_three(rate / TFLOP)} TFLOP/s"
        g = rate / 1e9
        return f"{g:,.0f} GFLOP/s" if g >= 100 else f"{g:.3g} GFLOP/s"

    def table(self) -> str:
        """The ceilings as a small text table with their spread, and the datasheet beside them when the device is in
        the catalog."""
        ds = self.datasheet

        def spread(name: str) -> str:
            n = len(self.samples.get(name, ()))
            return f"{self.spread(name):.0%} ({n})" if n > 1 else "-"

        rows = [(f"read bandwidth ({self.read_kernel})", f"{self.read_bw / GB:,.1f} GB/s", spread(self.read_samples),
                 f"{ds.bandwidth_gbs:,.0f} GB/s" if ds else "-"),
                ("copy bandwidth (read+write)", f"{self.copy_bw / GB:,.1f} GB/s", spread("copy"),
                 f"{ds.bandwidth_gbs:,.0f} GB/s" if ds else "-")]
        if self.read_kernel != "sum":    # sum's own rate, under the read bandwidth a product set
            rows.insert(1, ("read bandwidth (sum)", f"{self.read_sum_bw / GB:,.1f} GB/s", spread("read"), "-"))
        for name in self.matmul:         # one unit for every matmul row (matmul_text)
            sheet = f"{ds.tflops[name]:,.1f} TFLOP/s" if ds and name in ds.tflops else "-"
            label = f"matmul {name} (n={self.matmul_sizes[name]})" + (" *" if name in self.fallbacks else "")
            rows.append((label, self.matmul_text(name), spread(f"matmul {name}"), sheet))
        chosen = {self.fastest(tuple(self.matvec)), self.decode_dtype()} if self.matvec else set()
        estimated: list[str] = []   # precisions with an est. row
        for name in self.matvec:
            rows.append((f"matrix-vector {name} ({self.matvec_ceiling_path(name)})",
                         f"{self.matvec_bw(name) / GB:,.1f} GB/s", spread(f"matvec {name}"), "-"))
            if self.matvec_layer.get(name):   # what the decode precision is chosen by, for every precision
                rows.append((f"  4096-row layers ({self.matvec_path(name)})", f"{self.layer_bw(name) / GB:,.1f} GB/s",
                             spread(f"layers {name}"), "-"))
            if name not in chosen:     # the other detail rows only for the precisions the book computes in
                continue
            costs = self.matvec_costs(name)
            if costs:   # a small weight: the fixed cost a call counts, and another path can be quicker
                from .kernels import call_time, cheapest
                small = cheapest(costs, 2**20)
                estimated.append(name)
                rows.append((f"  1 MiB weights ({small}, est.)",
                             f"{2**20 / call_time(costs[small], 2**20) / GB:,.1f} GB/s", "-", "-"))
            long = self.long_rows.get(name)
            if long:     # rows of 11008 elements, whole and as blocks of their columns
                from .kernels import LONG_ROWS, block_width
                rows.append((f"  rows of {LONG_ROWS[1]} (whole)", f"{long['whole'] / GB:,.1f} GB/s", "-", "-"))
                rows.append((f"  rows of {LONG_ROWS[1]} in blocks of {block_width(LONG_ROWS[1])}",
                             f"{long['blocks'] / GB:,.1f} GB/s", "-", "-"))
            few = self.rows_bw(name)
            if few:
                rows.append((f"  batch 4 and 16 ({self.rows_path(name)})", f"{few / GB:,.1f} GB/s",
                             spread(f"rows {name}"), "-"))
        w = max(len(r[0]) for r in rows)
        if ds:
            lines = [f"{'ceiling':<{w}}  {'measured':>15}  {'range (n)':>10}  {'datasheet':>15}"]
            lines += [f"{a:<{w}}  {b:>15}  {c:>10}  {d:>15}" for a, b, c, d in rows]
        else:   # no datasheet column for a device the catalog does not have (keeps the table in the column)
            lines = [f"{'ceiling':<{w}}  {'measured':>15}  {'range (n)':>10}"]
            lines += [f"{a:<{w}}  {b:>15}  {c:>10}" for a, b, c, _ in rows]
        if self.fallbacks:
            fp32 = self.matmul.get("fp32")
            each = ", ".join(f"{d} {self.matmul[d] / fp32:.2f}x" if fp32 else d for d in self.fallbacks)
            lines.append(f"* a slow fallback here ({each} the fp32 rate;\n  below {FALLBACK_BELOW_FP32}x the fp32 "
                         f"rate a precision is never chosen for matrix-matrix\n  products (prefill, batches); "
                         f"batch-1 decode is chosen by the line below)")   # short lines: the output column is narrow
        if self.read_kernel != "sum" and self.read_bw > SUM_BELOW * self.read_sum_bw:
            lines.append(f"sum read {self.read_sum_bw / GB:,.1f} GB/s; a matrix-vector product over the same "
                         f"bytes,\n  in the same rounds, read {self.read_bw / self.read_sum_bw:.2f}x as fast: the "
                         f"memory delivers at least\n  the product's rate, so that is the read bandwidth")
        if len(self.matvec) > 1:
            lines.append(self.decode_text(narrow=True))
        blocked = [f"{n} ({r['blocks'] / r['whole']:.2f}x)" for n, r in self.long_rows.items() if self.row_blocks(n)]
        if self.long_rows:
            from .kernels import LONG_ROWS
            lines.append(f"rows of {LONG_ROWS[1]}: one-row products over [{LONG_ROWS[0]}, {LONG_ROWS[1]}] weights, "
                         f"rows whole\n  or as blocks of their columns; the decoder stores rows longer than 4096 "
                         f"as blocks\n  " + (f"in {', '.join(blocked)},\n  where blocks streamed faster than whole "
                                             "rows (by the factor shown)" if blocked
                                             else "in no precision here (blocks were not faster)"))
        if any(r[0].endswith(", est.)") for r in rows):
            lines.append("est.: from the path's fixed cost a call and its 4096-row rate, not timed alone")
        calls = [(n, lc) for n in self.matvec if call_bound(lc := self.layer_call(n))]
        if calls:   # a GPU's launches one at a time: the 4096-row rates measure calls, not memory
            lines.append("4096-row layers: rates set by each call's fixed cost more than by memory (a call on\n"
                         "  a small weight takes nearly as long: dispatch and launch, overlapping the kernel)")
            lines += [f"  {n}: a 4096-row call {lc[0] * 1e6:.1f} µs, a small weight's {lc[1] * 1e6:.1f} µs"
                      for n, lc in calls]
        moved = [(n, self.matvec_layer[n][p], self.layer_bw(n)) for n in self.matvec if self.matvec_layer.get(n)
                 and (p := self.matvec_path(n)) in self.matvec_layer[n]
                 and abs(self.matvec_layer[n][p] / self.layer_bw(n) - 1) > 0.15]
        if moved:   # one path, two moments: the machine's speed moved between them
            lines.append("4096-row layers: sampled in turn (the rows above), and when the paths were compared:")
            lines += [f"  {n} ({self.matvec_path(n)}): {sampled / GB:,.1f} and {compared / GB:,.1f} GB/s"
                      for n, compared, sampled in moved]
            used = [n for n, _, _ in moved if n in estimated]
            lines.append("  moments further apart than the samples' range"
                         + (f" (the est. row of {', '.join(used)} uses the second)" if used else ""))
        over = [n for n in self.matvec if self.matvec_layer.get(n) and self.layer_bw(n) > self.matvec_bw(n)
                and n not in {m[0] for m in moved}]
        paired = [n for n in over if f"layers {n}" in self.samples and f"matvec {n}" in self.samples]
        every = [n for n in paired if all(a > b for a, b in zip(self.samples[f"layers {n}"],
                                                                 self.samples[f"matvec {n}"]))]
        if every:       # faster in every one of the same rounds: the shape, not the moment (else within noise)
            lines.append(f"{', '.join(every)}: 4096-row layers read in turn streamed faster than one large matrix\n"
                         "  in every round: the kernel's rate depends on the matrix's shape here")
        if len(paired) < len(over):
            lines.append(f"{', '.join(n for n in over if n not in paired)}: 4096-row layers above the one-matrix "
                         "ceiling; the two were measured at\n  different moments of a machine whose speed varies "
                         "(see the range)")
        lines.append(f"device: {self.device}; bandwidth tensors {self.bytes_tested / 2**20:,.0f} MiB")
        lines.append("range: (largest - smallest) / median of the (n) samples, taken in turn")
        lines.append(f"datasheet: {ds.name} ({ds.source})" if ds else "datasheet: none in the catalog for this device")
        if self.cache_file:
            lines.append(f"measured {self.measured_at} once for this build and shared by every chapter\n"
                         f"  ({'/'.join(Path(self.cache_file).parts[-2:])}; delete it to measure again)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """The ceilings as plain numbers (the cache file's entry) (chapter 00)."""
        return {"device": self.device, "kind": self.kind, "read_bw": self.read_bw, "copy_bw": self.copy_bw,
                "matmul": self.matmul, "bytes_tested": self.bytes_tested, "matmul_sizes": self.matmul_sizes,
                "samples": {k: list(v) for k, v in self.samples.items()}, "matvec": self.matvec,
                "matvec_failed": self.matvec_failed, "matvec_layer": self.matvec_layer, "few_rows": self.few_rows,
                "matvec_call": self.matvec_call, "long_rows": self.long_rows,
                "measured_at": self.measured_at, "read_kernel": self.read_kernel}

    @classmethod
    def from_json(cls, d: dict, cache_file: str | None = None) -> "Ceilings":
        """Back from `to_json` (chapter 00)."""
        return cls(device=d["device"], kind=d["kind"], read_bw=d["read_bw"], copy_bw=d["copy_bw"],
                   matmul=dict(d["matmul"]), bytes_tested=int(d["bytes_tested"]),
                   matmul_sizes={k: int(v) for k, v in d["matmul_sizes"].items()},
                   datasheet=datasheet_for(d["device"]) if d["kind"] == "cuda" else None,
                   samples={k: tuple(v) for k, v in d.get("samples", {}).items()},
                   matvec={k: dict(v) for k, v in d.get("matvec", {}).items()},
                   matvec_failed={k: dict(v) for k, v in d.get("matvec_failed", {}).items()},
                   matvec_layer={k: dict(v) for k, v in d.get("matvec_layer", {}).items()},
                   few_rows={k: dict(v) for k, v in d.get("few_rows", {}).items()},
                   matvec_call={k: dict(v) for k, v in d.get("matvec_call", {}).items()},
                   long_rows={k: dict(v) for k, v in d.get("long_rows", {}).items()},
                   measured_at=d.get("measured_at", ""), cache_file=cache_file,
                   read_kernel=d.get("read_kernel", "sum"))


_CEILINGS: dict[str, Ceilings] = {}


def ceilings_file() -> Path | None:
    """Where a build (or a reader's session) keeps its one set of ceilings: $BOOK_CEILINGS (`make` sets
    _build/ceilings.json), else a file in the user's cache folder; $BOOK_CEILINGS=off keeps them in memory only
    (chapter 00)."""
    env = os.environ.get("BOOK_CEILINGS", "").strip()
    if env.lower() in ("off", "0", "none"):
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "why-llm-decoding-is-slow" / "ceilings.json"


#: A matrix-vector product this much faster than `sum` over the same bytes gets a line of its own in the table.
SUM_BELOW = 1.25

#: Raised whenever the cached ceilings gain a measurement, so a file written before it is measured again, not read
#: without it (2: one-row products in every precision, and layers sampled in turn for the decode precision; 3: long
#: rows, whole and as blocks; 4: the one-matrix products sampled in turn with `sum`; 5: and the 4096-row layers
#: in the same rounds).
CEILINGS_VERSION = 6


def _cache_key(dev: torch.device, dtypes: list[str]) -> str:
    return f"{device_name(dev)} | torch {torch.__version__} | {dev} | {','.join(dtypes)} | v{CEILINGS_VERSION}"


def _load_cached(key: str, path: Path | None) -> Ceilings | None:
    if path is None or not path.exists():
        return None
    try:
        entry = json.loads(path.read_text()).get(key)
    except (OSError, ValueError):
        return None
    if not entry:
        return None
    max_age_h = float(os.environ.get("BOOK_CEILINGS_MAX_AGE_H", "0" if os.environ.get("BOOK_CEILINGS") else "12"))
    if max_age_h > 0 and time.time() - entry.get("measured_unix", 0) > max_age_h * 3600:
        return None
    try:
        return Ceilings.from_json(entry, str(path))
    except (KeyError, TypeError, ValueError):
        return None


def _save(key: str, c: Ceilings, path: Path | None) -> Ceilings:
    if path is None:
        return c
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            data = {}
        data[key] = {**c.to_json(), "measured_unix": time.time()}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError as e:
        print(f"note: could not keep the ceilings in {path} ({e}); they are kept for this session only",
              file=sys.stderr)
        return c
    return replace(c, cache_file=str(path))


def measured_ceilings(device: torch.device | str | None = None, *, refresh: bool = False,
                      dtypes: list[str] | None = None, rounds: int = 5, nbytes: int | None = None) -> Ceilings:
    """The device's ceilings, measured once and shared (chapter 00): read and copy bandwidth and the matmul rate of
    each precision, each the median of `rounds` samples taken in turn (so a drifting machine spreads all of them
    alike), and the matrix-vector ceiling of each precision a decoder would use. Kept in memory for the kernel and in
    `ceilings_file()` for the build, so every chapter of one build prints the same numbers; `refresh=True` measures
    again; `nbytes` replaces the tensor size (`bandwidth_test_bytes`, beyond the last-level cache) for a quick
    check whose numbers are not published."""
    from . import kernels
    dev = as_device(device)
    dtypes = list(dtypes or supported_matmul_dtypes(dev))
    key = _cache_key(dev, dtypes)
    path = ceilings_file()
    if not refresh:
        c = _CEILINGS.get(key) or _load_cached(key, path)
        if c is not None:
            _CEILINGS[key] = c
            for name, rates in c.matvec.items():
                if rates:
                    kernels.set_matvec_path(dev, DTYPES[name], c.matvec_path(name))
                    kernels.set_matvec_costs(dev, DTYPES[name], c.matvec_costs(name))
                    kernels.set_rows_path(dev, DTYPES[name], c.rows_path(name))
                    kernels.set_row_blocks(dev, DTYPES[name], c.row_blocks(name))
            return c
    nbytes = nbytes or bandwidth_test_bytes(dev)
    # Every precision gets its one-row products measured, a slow-fallback matmul included: a decode step streams
    # weights, and a precision whose matmul is slow can still stream them fastest (bf16 on a CPU without bf16
    # instructions). First each path once, to choose: over one large matrix (the ceiling's path), and over
    # layer-sized matrices read in turn, as a decode step reads them (the decoder's path: a kernel that wins on one
    # huge matrix can lose on 4096 rows, where each call's fixed cost counts).
    matvec, failed, layer = {}, {}, {}
    for name in dict.fromkeys("fp32" if d == "tf32" else d for d in dtypes):
        r = kernels.measure_matvec(min(nbytes, 2 * 2**30), dev, DTYPES[name], choose=False)
        matvec[name], failed[name] = dict(r), dict(r.failed)
        layer[name] = dict(kernels.measure_matvec(min(nbytes, 2 * 2**30), dev, DTYPES[name], rows=4096, k=4096,
                                                  paths=tuple(matvec[name])))
    # Then every rate compared with another is sampled in the same rounds, in turn, so a machine whose speed drifts
    # slows all of them alike: `sum`, copy, each matmul, each precision's one large matrix (made anew in each round,
    # so a GPU holds one at a time) and its 4096-row layers, each through its chosen path.
    x = _random_tensor(nbytes, dev)
    sizes: dict[str, int] = {}
    first: dict[str, float] = {}
    operands: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name in dtypes:
        first[name], sizes[name], _ = measure_matmul(name, dev, repeats=1)
        n = sizes[name]
        operands[name] = (torch.randn(n, n, device=dev).to(DTYPES[name]), torch.randn(n, n, device=dev).to(DTYPES[name]))
    mv_bytes = min(nbytes, 2 * 2**30)
    ways = {name: max(rates, key=rates.get) for name, rates in matvec.items() if rates}
    stacks = {name: (kernels.weight_stack(min(nbytes, 2**30), 4096, 4096, dev, DTYPES[name]),
                     torch.randn(4096, device=dev).to(DTYPES[name]), max(layer[name], key=layer[name].get))
              for name in ways if layer.get(name)}
    # A few rows (a batched step, a verification pass) over the same layers, 4 and 16 rows, through the few-rows
    # path measured fastest: left out for a precision whose matmul is a slow fallback by a first product (a few rows
    # are matmul work), and sampled in the same rounds, so their rate over one row's is one moment's
    few_rows: dict[str, dict[str, float]] = {}
    row_xs: dict[str, tuple[list[torch.Tensor], str]] = {}
    slow = slow_fallbacks(first)
    for name in stacks:
        if name not in slow:
            few_rows[name] = kernels.measure_rows(dev, DTYPES[name], nbytes=min(nbytes, 2**30))
            row_xs[name] = ([torch.randn(r, 4096, device=dev).to(DTYPES[name]) for r in kernels.ROWS_SAMPLED],
                            max(few_rows[name], key=few_rows[name].get))
    samples: dict[str, list[float]] = {"read": [], "copy": [], **{f"matmul {d}": [] for d in dtypes},
                                       **{f"matvec {d}": [] for d in ways}, **{f"layers {d}": [] for d in stacks},
                                       **{f"rows {d}": [] for d in row_xs}}
    allow = torch.backends.cuda.matmul.allow_tf32
    try:
        for _ in range(rounds):
            samples["read"].append(measure_read_bandwidth(device=dev, x=x, repeats=3)[0])
            samples["copy"].append(measure_copy_bandwidth(nbytes, dev, repeats=3)[0])
            for name, way in ways.items():
                w = random_tensor(max(1, mv_bytes // (4096 * DTYPES[name].itemsize)), 4096, device=dev,
                                  dtype=DTYPES[name])
                v = torch.randn(4096, device=dev).to(DTYPES[name])
                t = time_fn(lambda: kernels.matvec(w, v, way), device=dev, warmup=1, repeats=3, number=None)
                samples[f"matvec {name}"].append(w.nbytes / t.median)
                del w
            for name, (ws, v, way) in stacks.items():
                t = time_fn(lambda: [kernels.matvec(w, v, way) for w in ws], device=dev, warmup=1, repeats=3,
                            number=None)
                samples[f"layers {name}"].append(sum(w.nbytes for w in ws) / t.median)
                if name in row_xs:
                    xs, way_rows = row_xs[name]
                    t = time_fn(lambda: [kernels.few_rows(w, r, way_rows) for r in xs for w in ws], device=dev,
                                warmup=1, repeats=3, number=None)
                    samples[f"rows {name}"].append(len(xs) * sum(w.nbytes for w in ws) / t.median)
            for name in dtypes:
                a, b = operands[name]
                torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
                t = time_fn(lambda: F.linear(a, b), device=dev, warmup=1, repeats=1)
                samples[f"matmul {name}"].append(2 * sizes[name] ** 3 / t.median)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow
    del x, operands, stacks, row_xs
    rates = {name: statistics.median(samples[f"matmul {name}"]) for name in dtypes}
    name = device_name(dev)
    c = Ceilings(device=name, kind=dev.type, read_bw=statistics.median(samples["read"]), copy_bw=statistics.median(samples["copy"]),
                 matmul=rates, bytes_tested=nbytes, matmul_sizes=sizes,
                 datasheet=datasheet_for(name) if dev.type == "cuda" else None,
                 samples={k: tuple(v) for k, v in samples.items()}, matvec=matvec, matvec_failed=failed,
                 matvec_layer=layer, measured_at=datetime.now().strftime("%Y-%m-%d %H:%M"))
    call = {}
    for name in matvec:
        # the fixed cost a call, on small weights, so a small model's layers take the path quickest for them
        call[name] = kernels.measure_call_cost(tuple(layer[name]), dev, DTYPES[name])
    # the few-rows rates, where the precision's matmul is not a slow fallback by the final rates either
    c = replace(c, few_rows={k: v for k, v in few_rows.items() if k not in c.fallbacks}, matvec_call=call)
    for name in matvec:
        kernels.set_matvec_costs(dev, DTYPES[name], c.matvec_costs(name))
    # and rows longer than 4096 elements, whole against stored as blocks of their columns (a CPU only), through the
    # one-row paths just chosen
    long = {name: r for name in matvec if (r := kernels.measure_blocks(dev, DTYPES[name], nbytes=min(nbytes, 2**30)))}
    c = replace(c, long_rows=long)
    # A matrix-vector product reads its matrix once too: when one streams faster than `sum`, the memory can deliver
    # at least that much, so it is the read bandwidth (and MBU, measured against it, stays at or below one).
    best = max(((c.matvec_bw(d), f"matrix-vector {d}, {c.matvec_ceiling_path(d)}") for d in matvec if matvec[d]),
               default=(0.0, ""))
    if best[0] > c.read_bw:
        c = replace(c, read_bw=best[0], read_kernel=best[1])
    c = _save(key, c, path)
    _CEILINGS[key] = c
    return c


def bandwidth_sweep(sizes: list[int], device: torch.device | str | None = None, *,
                    repeats: int = 7) -> list[tuple[int, float]]:
    """Read bandwidth (bytes/s) at each tensor size: where the caches end and memory begins (chapter 00)."""
    from .build import progress
    dev = as_device(device)
    out = []
    for nbytes in progress(sizes, desc="bandwidth sweep"):
        bw, _ = measure_read_bandwidth(nbytes, dev, repeats=repeats)
        out.append((int(nbytes), bw))
    return out


def sweep_sizes(device: torch.device | str | None = None, points_per_octave: int = 1) -> list[int]:
    """Tensor sizes from 16 KiB up to the bandwidth test size, doubling (chapter 00)."""
    top = bandwidth_test_bytes(device)
    sizes, s = [], 16 * 2**10
    while s <= top:
        sizes.append(s)
        s = int(s * 2 ** (1 / points_per_octave))
    return sizes


def reference_suite(device: torch.device | str | None = None, quick: bool = False) -> dict:
    """The preface's recorded results: measured ceilings and read bandwidth against tensor size; `quick`: one round
    of ceilings over 64 MiB tensors and every third size (chapter 00)."""
    dev = as_device(device)
    c = measured_ceilings(dev, refresh=True, rounds=1 if quick else 5, nbytes=64 * 2**20 if quick else None)
    values = {"read_bw_gbs": c.read_bw / GB, "copy_bw_gbs": c.copy_bw / GB, "bytes_tested": float(c.bytes_tested)}
    values.update({f"matmul_{k}_tflops": v / TFLOP for k, v in c.matmul.items()})
    sizes = sweep_sizes(dev)
    sweep = bandwidth_sweep(sizes[::3] if quick else sizes, dev, repeats=3 if quick else 7)
    return {"values": values,
            "series": {"read_bw_vs_size": {"x": [s for s, _ in sweep], "y": [bw / GB for _, bw in sweep],
                                           "x_label": "tensor size (bytes)", "y_label": "read bandwidth (GB/s)"}}}
