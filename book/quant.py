"""Weight-only quantization on the roofline: int8 and int4 weights, bf16 arithmetic, timed against bf16 and fp32
(chapter 02).

The kernels are PyTorch's own: for int8 with one scale per output row, `torch._weight_int8pack_mm` (CPU, CUDA) and
a plain dequantize-then-`F.linear`, timed against each other on the reader's device (on an H100 the packed kernel
ran at 0.16x of bf16 at B=1 and took 1.19 s at B=512, where bf16 took 1.46 ms); and the int4 "pack" kernels (`_weight_int4pack_mm_for_cpu` on CPU; the tinygemm `_weight_int4pack_mm` on CUDA,
Ampere or newer) for int4 with a scale and zero point per group of input columns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

__all__ = ["QuantLinear", "quantize", "PRECISIONS", "PACKING_ERRORS", "compare_linear"]

PRECISIONS = ("fp32", "bf16", "int8", "int4")


@dataclass
class QuantLinear:
    """A [N, K] weight stored at some precision, with the function that multiplies activations by it."""
    precision: str
    n: int
    k: int
    nbytes: int                                    # bytes a product reads for the weight (and its scales)
    act_dtype: torch.dtype
    matmul: Callable[[torch.Tensor], torch.Tensor]
    #: other kernels for the same stored weight, by name ({"pack": ..., "dequant": ...} for int8); `compare_linear`
    #: times each and keeps the fastest on this device
    kernels: dict[str, Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x)


def _int8(w: torch.Tensor, act: torch.dtype, chunk: int = 1 << 14) -> QuantLinear:
    n, k = w.shape
    q = torch.empty(n, k, dtype=torch.int8, device=w.device)
    s = torch.empty(n, dtype=act, device=w.device)
    for i in range(0, n, chunk):                  # in row chunks: no full-size fp32 temporary
        rows = w[i:i + chunk].float()
        scale = (rows.abs().amax(1) / 127).clamp_min(1e-8)
        q[i:i + chunk] = torch.round(rows / scale[:, None]).clamp(-128, 127).to(torch.int8)
        s[i:i + chunk] = scale.to(act)
    pack = lambda x: torch._weight_int8pack_mm(x, q, s)                               # noqa: E731
    dequant = lambda x: torch.nn.functional.linear(x, q.to(act)) * s                  # noqa: E731
    return QuantLinear("int8", n, k, q.numel() + s.numel() * s.element_size(), act, pack,
                       {"pack": pack, "dequant": dequant})


def _int4(w: torch.Tensor, act: torch.dtype, group: int = 128, chunk: int = 1 << 14) -> QuantLinear:
    n, k = w.shape
    if k % group or n % 64:
        raise ValueError(f"int4 needs K divisible by the group size {group} and N by 64, got [{n}, {k}]")
    cpu = w.device.type == "cpu"
    if not cpu and act != torch.bfloat16:
        raise ValueError("the CUDA int4 kernel takes bf16 activations only")
    packed, sz = [], torch.empty(k // group, n, 2, dtype=act, device=w.device)
    for i in range(0, n, chunk):                  # chunk is a multiple of 64 rows: packing works in 64-row blocks
        rows = w[i:i + chunk].float().reshape(-1, k // group, group)
        lo, hi = rows.amin(-1, keepdim=True), rows.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp_min(1e-6)
        q = torch.round((rows - lo) / scale).clamp(0, 15).to(torch.int32).reshape(-1, k)
        sz[:, i:i + chunk] = torch.cat([scale, lo + 8 * scale], -1).transpose(0, 1).to(act)
        if cpu:
            packed.append(torch._convert_weight_to_int4pack_for_cpu(q, 1))
        else:
            packed.append((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8))
    if cpu:
        wp = torch.cat(packed)
        fn = lambda x: torch._weight_int4pack_mm_for_cpu(x, wp, group, sz)          # noqa: E731
    else:
        wp = torch._convert_weight_to_int4pack(torch.cat(packed), 8)
        fn = lambda x: torch._weight_int4pack_mm(x, wp, group, sz)                  # noqa: E731
    return QuantLinear("int4", n, k, n * k // 2 + sz.numel() * sz.element_size(), act, fn)


def quantize(w: torch.Tensor, precision: str, act_dtype: torch.dtype = torch.bfloat16) -> QuantLinear:
    """`w` [N, K] (any float dtype) as a weight of `precision`: fp32 and bf16 keep it dense and multiply through the
    decoder's product (`book.llama.linear`: one row by the matrix-vector path measured fastest here, many rows by
    F.linear), so quantization is judged against the dense path the book decodes with; int8 and int4 are weight-only
    (activations stay `act_dtype`, the kernels take bf16 or fp16) (chapter 02)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight [N, K], got shape {tuple(w.shape)}")
    if precision in ("fp32", "bf16"):   # through the decoder's own product: the path measured fastest per row count
        from .llama import linear
        dt = torch.float32 if precision == "fp32" else torch.bfloat16
        dense = w.to(dt)
        return QuantLinear(precision, *w.shape, dense.numel() * dense.element_size(), dt,
                           lambda x: linear(x, dense))
    if act_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"weight-only {precision} computes in bf16 or fp16, not {act_dtype}")
    return _int8(w, act_dtype) if precision == "int8" else _int4(w, act_dtype)


def _error(matmul: Callable[[torch.Tensor], torch.Tensor], w: torch.Tensor, act: torch.dtype) -> float:
    """Relative error of a quantized product against the dense one, on a few random rows of activations."""
    x = torch.randn(4, w.shape[1], device=w.device).to(act)
    want = torch.nn.functional.linear(x.float(), w.float())
    return float((matmul(x).float() - want).norm() / want.norm())


#: What a missing or failing packing kernel raises: an old torch lacks the function (AttributeError), a device
#: lacks the kernel (RuntimeError, NotImplementedError), a shape or dtype it refuses (ValueError, TypeError).
PACKING_ERRORS = (RuntimeError, NotImplementedError, ValueError, AttributeError, TypeError)


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:70]}" if text else type(e).__name__


def compare_linear(k: int, n: int, *, batches: tuple[int, ...] = (1, 512), device=None, roof=None,
                   precisions: tuple[str, ...] = PRECISIONS, repeats: int = 3, fallbacks: tuple[str, ...] = (),
                   results: list | None = None, read_bytes: int = 0) -> list[str]:
    """Time one [n, k] linear layer at each precision and batch, every precision's kernels in turn at each batch
    (`book.timing.time_in_turn`); lines to print, with the roofline prediction
    beside each measurement when `roof` is given (chapter 02). `roof` is one `book.roofline.Roof`, or a dict of
    them by compute precision, {"fp32": ..., "bf16": ...}: fp32 weights compute in fp32, the others in bf16.

    A precision whose kernel fails on this device (int4 packing needs a recent torch and, on CUDA, an Ampere or
    newer GPU) gives one line, "note: int4 packing failed on this device (reason); int4 rows are left out", and the
    other rows still come out. Precisions in `fallbacks` (`Ceilings.fallbacks`: not clearly faster than fp32 here) are
    marked "*" and labelled a slow fallback. `results`, when given, receives one dict per timed row (precision,
    batch, seconds, nbytes, predicted seconds or None, error, the kernel kept), for verdicts computed from the table;
    with `read_bytes`, a `sum` over a tensor of that many bytes is timed in the same rounds at each batch, and each
    row carries the read bandwidth it measured ("read_bw", bytes/s)."""
    from .device import as_device, synchronize
    from .hardware import random_tensor
    from .roofline import Work, linear
    from .timing import format_seconds, time_fn, time_in_turn
    dev = as_device(device)
    w = random_tensor(n, k, device=dev, dtype=torch.bfloat16)
    lines = [f"weight [{n} x {k}] on {dev.type}, median of {repeats} runs, every kernel in turn;\n"
             "predicted: the roofline with the measured ceilings; error: relative, vs the fp32\n"
             "product of the same weights and inputs (rounding to 8 or 4 bits costs about 1e-2\n"
             "or 1e-1; over 0.2 a kernel is taken to be wrong and skipped)"]
    rows = []                                     # (precision, batch, seconds, weight bytes, error, kernel, read)
    layers = {}                                   # precision -> (layer, its kernels, error)
    for p in precisions:
        try:
            layer = quantize(w, p)
            kernels = dict(layer.kernels or {p: layer.matmul})
            errors: dict[str, float] = {}
            for name, fn in list(kernels.items()):
                try:
                    errors[name] = _error(fn, w, layer.act_dtype)
                except PACKING_ERRORS as e:
                    if len(kernels) == 1:
                        raise
                    lines.append(f"note: {p} kernel {name} failed on this device ({_reason(e)}); left out")
                    del kernels[name]
        except PACKING_ERRORS as e:
            what = "packing" if p in ("int8", "int4") else "matmul"
            lines.append(f"note: {p} {what} failed on this device ({_reason(e)}); {p} rows are left out")
            continue
        err = max(errors.values())
        if err > 0.2:
            lines.append(f"{p:>5}: kernel output disagrees with the dense product (rel. error {err:.2f}); skipped")
            continue
        layers[p] = (layer, kernels, err)
    from .hardware import read_probe
    probe = read_probe(read_bytes, dev)           # one tensor, read again in every batch's rounds
    for b in batches:     # every precision's kernels in turn, so a drifting machine slows all of them alike
        fns = {}
        for p, (layer, kernels, _) in layers.items():
            x = random_tensor(b, k, device=dev, dtype=layer.act_dtype)
            fns.update({(p, name): (lambda fn=fn, x=x: fn(x)) for name, fn in kernels.items()})
        fns.update(probe)
        try:
            times = {key: t.median for key, t in
                     time_in_turn(fns, device=dev, warmup=1, rounds=repeats).items()}
        except (torch.OutOfMemoryError, *PACKING_ERRORS):   # one at a time, so one failure leaves the others
            synchronize(dev)
            lines.append(f"note: at B={b} the kernels were timed one at a time (one failed in turn)")
            times = {}
            for key, fn in fns.items():
                if key == "read":
                    times[key] = time_fn(fn, device=dev, warmup=1, repeats=repeats).median
                    continue
                p, name = key
                try:
                    times[(p, name)] = time_fn(fn, device=dev, warmup=1, repeats=repeats).median
                except torch.OutOfMemoryError:
                    synchronize(dev)
                    lines.append(f"{p:>5} B={b} ({name}): out of memory, skipped")
                except PACKING_ERRORS as e:          # a kernel that packed but fails at this batch
                    lines.append(f"note: {p} kernel {name} failed on this device at B={b} ({_reason(e)}); "
                                 f"left out")
        for p, (layer, kernels, err) in layers.items():
            mine = {name: times[(p, name)] for name in kernels if (p, name) in times}
            if mine:
                best = min(mine, key=mine.get)
                rows.append((p, b, mine[best], layer.nbytes, err, best,
                             read_bytes / times["read"] if "read" in times else None))
                if len(mine) > 1:
                    timed = ", ".join(f"{nm} {format_seconds(t)}" for nm, t in mine.items())
                    lines.append(f"{p} kernels at B={b}: {timed}; the fastest ({best}) is kept")
    del layers, probe
    base = {b: t for p, b, t, *_ in rows if p == "bf16"}
    lines.append(f"{'B':>5} {'weights':>7} {'measured':>9} {'predicted':>9} {'GB read':>8} {'GB/s':>6} "
                 f"{'vs bf16':>8} {'error':>6}")
    for p, b, t, nbytes, err, kernel, read_bw in sorted(rows, key=lambda r: (r[1], PRECISIONS.index(r[0]))):
        act = "fp32" if p == "fp32" else "bf16"
        r = roof.get(act) if isinstance(roof, dict) else roof
        w = linear(b, k, n, p, act)
        w = Work(w.flops, w.bytes - dict(w.parts)["weights"] + nbytes)   # the weight bytes read, scales included
        secs = r.time(w) if r else None
        pred = format_seconds(secs) if secs is not None else "-"
        rel = f"{base[b] / t:.2f}x" if b in base else "-"
        name = p + ("*" if p in fallbacks else "")
        lines.append(f"{b:>5} {name:>7} {format_seconds(t):>9} {pred:>9} {nbytes / 1e9:8.2f} "
                     f"{nbytes / t / 1e9:6.1f} {rel:>8} {err:6.0e}")
        if results is not None:
            results.append({"precision": p, "batch": b, "seconds": t, "nbytes": nbytes, "predicted": secs,
                            "error": err, "kernel": kernel, **({"read_bw": read_bw} if read_bw else {})})
    shown = [p for p in fallbacks if any(row[0] == p for row in rows)]
    if shown:
        lines.append(f"* {', '.join(shown)}: a slow fallback here (its matmul rate, in the ceilings table, is under "
                     "1.25x fp32's)")
    return lines
