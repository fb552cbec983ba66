"""The roofline: arithmetic intensity, attainable rate, where a decode step sits, MBU and MFU (chapter 02)."""
from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Sequence

import torch

from .hardware import GPUSpec, call_bound, gpu
from .models import Architecture, architecture, dtype_bytes

__all__ = ["Roof", "Work", "dot", "matvec", "matmul", "linear", "decode_step", "compiled_decode_ms", "prefill",
           "extend", "critical_batch", "mbu", "mfu", "measure_decode_step", "measure_decode_steps", "decode_step_fn",
           "measure_extend", "linear_sweep", "measured_knee", "first_compute_bound", "step_shortfall", "busy_while",
           "silence_native_stderr", "plot_roofline", "reference_suite"]


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def _count(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class Roof:
    """Two ceilings of one device at one precision: memory bandwidth (bytes/s) and peak rate (FLOP/s) (chapter 02)."""
    name: str
    bandwidth: float
    peak: float

    def __post_init__(self) -> None:
        _positive("bandwidth", self.bandwidth)
        _positive("peak", self.peak)

    @classmethod
    def datasheet(cls, name: str | GPUSpec, dtype: str = "bf16") -> "Roof":
        """A catalog GPU's datasheet roof (dense peak of `dtype`)."""
        spec = name if isinstance(name, GPUSpec) else gpu(name)
        return cls(f"{spec.name} {dtype} (datasheet)", spec.bandwidth_gbs * 1e9, spec.peak_flops(dtype))

    @classmethod
    def measured(cls, ceilings, dtype: str = "fp32", bandwidth: str = "read") -> "Roof":
        """The roof of this device from `book.hardware.measured_ceilings()`: the read bandwidth (decode reads; the
        book's one MBU denominator) or, to compare, the copy bandwidth."""
        if dtype not in ceilings.matmul:
            raise ValueError(f"no measured matmul rate for {dtype}; measured: {sorted(ceilings.matmul)}")
        bw = {"copy": ceilings.copy_bw, "read": ceilings.read_bw}.get(bandwidth)
        if bw is None:
            raise ValueError(f"bandwidth must be 'copy' or 'read', got {bandwidth!r}")
        return cls(f"{ceilings.device} {dtype} (measured)", bw, ceilings.matmul[dtype])

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the roof bends: below it memory limits, above it arithmetic does."""
        return self.peak / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The best FLOP/s an operation of this intensity can reach: min(peak, intensity x bandwidth)."""
        if intensity < 0:
            raise ValueError(f"intensity must be >= 0 FLOPs/byte, got {intensity}")
        return min(self.peak, intensity * self.bandwidth)

    def time(self, work: "Work") -> float:
        """Predicted seconds: the slower of moving the bytes and doing the FLOPs, max(bytes/bw, FLOPs/peak)."""
        return max(work.bytes / self.bandwidth, work.flops / self.peak)

    def bound(self, work: "Work") -> str:
        """'memory' or 'compute': which ceiling sets the predicted time."""
        return "memory" if work.intensity < self.ridge else "compute"


@dataclass(frozen=True)
class Work:
    """FLOPs done and bytes moved to or from memory by an operation (chapter 02)."""
    flops: float
    bytes: float
    parts: tuple[tuple[str, float], ...] = ()     # named shares of `bytes`, for a breakdown

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per byte moved."""
        return self.flops / self.bytes


def dot(n: int, dtype: str = "fp32") -> Work:
    """x . y of two n-vectors: 2n FLOPs, reads 2n numbers (intensity 1 / bytes per number)."""
    b = dtype_bytes(dtype)
    return Work(2 * _count("n", n), (2 * n + 1) * b)


def matvec(m: int, n: int, dtype: str = "fp32") -> Work:
    """A [m, n] matrix times an n-vector: 2mn FLOPs; the matrix dominates the bytes (intensity ~ 2 / bytes)."""
    b = dtype_bytes(dtype)
    return Work(2 * _count("m", m) * _count("n", n), (m * n + n + m) * b)


def matmul(m: int, n: int, k: int, dtype: str = "fp32") -> Work:
    """[m, k] @ [k, n]: 2mnk FLOPs; reads both inputs and writes the output once."""
    b = dtype_bytes(dtype)
    m, n, k = _count("m", m), _count("n", n), _count("k", k)
    return Work(2 * m * n * k, (m * k + k * n + m * n) * b)


def linear(batch: int, d_in: int, d_out: int, weight_dtype: str = "bf16", act_dtype: str | None = None) -> Work:
    """B tokens through a [d_out, d_in] weight: intensity grows with B until the activations dominate."""
    wb, ab = dtype_bytes(weight_dtype), dtype_bytes(act_dtype or weight_dtype)
    batch, d_in, d_out = _count("batch", batch), _count("d_in", d_in), _count("d_out", d_out)
    weights, acts = d_in * d_out * wb, batch * (d_in + d_out) * ab
    return Work(2 * batch * d_in * d_out, weights + acts, (("weights", weights), ("activations", acts)))


def _matmul_params(a: Architecture) -> int:
    """Weights a token multiplies: every block matrix and the LM head (not the embedding lookup)."""
    h, q, kv = a.hidden, a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    return a.n_layers * (h * q + 2 * h * kv + q * h + 3 * h * a.intermediate) + a.vocab * h


def _weights_read(a: Architecture) -> int:
    """Parameters one forward pass reads: all but the embedding table (only a few rows of it are touched)."""
    return a.n_params() - (0 if a.tied_embeddings else a.vocab * a.hidden)


def decode_step(model: str | Architecture, batch: int = 1, context: int = 0, weight_dtype: str = "bf16",
                kv_dtype: str | None = None) -> Work:
    """One decode step of B sequences that each have `context` cached tokens (chapter 02).

    FLOPs: 2 per matmul weight per sequence, plus attention (Q.K and weights.V: 4 x heads x head dim per cached
    token per layer). Bytes: the weights once, plus every sequence's K and V, plus the token activations.
    """
    a = architecture(model)
    batch, context = _count("batch", batch), _count("context", context, 0)
    if context >= a.max_context:
        raise ValueError(f"{a.name} allows {a.max_context} tokens; a context of {context} leaves no room to decode")
    kv_dtype = kv_dtype or weight_dtype
    attn = 4 * a.n_layers * a.n_heads * a.head_dim * (context + 1)
    flops = batch * (2 * _matmul_params(a) + attn)
    weights = _weights_read(a) * dtype_bytes(weight_dtype)
    kv = batch * (context + 1) * a.kv_bytes_per_token(kv_dtype)
    acts = batch * (a.hidden * 2 + a.vocab) * dtype_bytes("bf16")    # the token in, its logits out (small)
    return Work(flops, weights + kv + acts, (("weights", weights), ("KV cache", kv), ("activations", acts)))


def prefill(model: str | Architecture, tokens: int, batch: int = 1, weight_dtype: str = "bf16") -> Work:
    """One forward pass over `tokens` prompt tokens per sequence: the weights are read once for all of them, and the
    LM head runs on the last token only (its logits start decoding; the book's decoder and HF's `generate` both
    skip the others) (chapter 01)."""
    a = architecture(model)
    tokens, batch = _count("tokens", tokens), _count("batch", batch)
    if tokens > a.max_context:
        raise ValueError(f"{a.name} allows {a.max_context} tokens, got a prompt of {tokens}")
    causal_pairs = tokens * (tokens + 1) / 2
    head = a.vocab * a.hidden
    flops = batch * (2 * (_matmul_params(a) - head) * tokens + 2 * head
                     + 4 * a.n_layers * a.n_heads * a.head_dim * causal_pairs)
    weights = _weights_read(a) * dtype_bytes(weight_dtype)
    kv = batch * tokens * a.kv_bytes_per_token(weight_dtype)        # written once
    acts = batch * (tokens * a.hidden * 2 + a.vocab) * dtype_bytes("bf16")
    return Work(flops, weights + kv + acts, (("weights", weights), ("KV cache", kv), ("activations", acts)))


def extend(model: str | Architecture, tokens: int, batch: int = 1, context: int = 0, weight_dtype: str = "bf16",
           kv_dtype: str | None = None) -> Work:
    """One pass over `tokens` new tokens per sequence after `context` cached ones, e.g. verifying drafted tokens
    (chapter 05): the weights are read once for all of them, so it costs about one decode step while memory-bound
    and `tokens` decode steps once compute-bound. tokens=1 is `decode_step`."""
    a = architecture(model)
    tokens, batch, context = _count("tokens", tokens), _count("batch", batch), _count("context", context, 0)
    if context + tokens > a.max_context:
        raise ValueError(f"{a.name} allows {a.max_context} tokens; {context} cached + {tokens} new do not fit")
    kv_dtype = kv_dtype or weight_dtype
    pairs = tokens * context + tokens * (tokens + 1) / 2               # (query, key) pairs, causal
    flops = batch * (2 * _matmul_params(a) * tokens + 4 * a.n_layers * a.n_heads * a.head_dim * pairs)
    weights = _weights_read(a) * dtype_bytes(weight_dtype)
    kv = batch * (context + tokens) * a.kv_bytes_per_token(kv_dtype)
    acts = batch * tokens * (a.hidden * 2 + a.vocab) * dtype_bytes("bf16")
    return Work(flops, weights + kv + acts, (("weights", weights), ("KV cache", kv), ("activations", acts)))


def critical_batch(model: str | Architecture, roof: Roof, context: int = 0, weight_dtype: str = "bf16",
                   kv_dtype: str | None = None) -> int | None:
    """The smallest batch whose decode step is compute-bound on `roof`; None if no batch ever is (chapter 02).

    With B sequences, FLOPs = B f and bytes = W + B k (f: FLOPs per sequence, W: weights, k: KV and activations
    per sequence). Compute-bound when B f / peak >= (W + B k) / bandwidth, i.e. B >= W / (f / ridge - k).
    """
    one, two = decode_step(model, 1, context, weight_dtype, kv_dtype), decode_step(model, 2, context, weight_dtype,
                                                                                 kv_dtype)
    f = two.flops - one.flops
    k = two.bytes - one.bytes
    w = one.bytes - k
    per_seq = f / roof.ridge - k
    if per_seq <= 0:
        return None
    return max(1, math.ceil(w / per_seq - 1e-9))


def mbu(bytes_moved: float, seconds: float, bandwidth: float) -> float:
    """Model bandwidth utilisation: achieved bytes/s over the bandwidth ceiling (chapter 02)."""
    _positive("seconds", seconds)
    _positive("bandwidth", bandwidth)
    return bytes_moved / seconds / bandwidth


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak rate (chapter 02)."""
    _positive("seconds", seconds)
    _positive("peak", peak)
    return flops / seconds / peak


def step_shortfall(nbytes: float, seconds: float, stream_bw: float,
                   kernels: str = "one-row products over 4096-row layers", *, margin: float = 1.25,
                   per_call: tuple[float, float] | None = None, graph: bool = False,
                   memory_steady: bool = False) -> str:
    """Why a step that moved `nbytes` in `seconds` ran below the read bandwidth, split in two: the time its bytes
    take at the rate its kernels stream layer-sized weights on this device (`stream_bw`, bytes/s, named by
    `kernels`), and what is left over, a fixed cost per step (dispatch, small operations, launches) that no
    bandwidth explains; the step counts as the kernels' when it is within `margin` of their time. `per_call`
    (seconds one 4096-row call takes, seconds of it the call's fixed cost; `Ceilings.layer_call`) says when that
    rate is set by calls rather than by memory, as with a GPU's launches one at a time; `graph`: the step was
    replayed as a CUDA graph, which pays no dispatch or launch a call, so the rest is named as the GPU's own work;
    `memory_steady`: a read sampled beside the step ran no slower than the ceilings', so a slower machine is not
    offered as a cause (chapters 02 and 04)."""
    from .timing import format_seconds
    _positive("bytes", nbytes)
    _positive("seconds", seconds)
    _positive("stream_bw", stream_bw)
    at_kernels = nbytes / stream_bw
    head = (f"{kernels} stream {stream_bw / 1e9:,.1f} GB/s here, which reads its bytes in "
            f"{format_seconds(at_kernels)}")
    calls = call_bound(per_call)
    if calls:
        head += (f" (a 4096-row call takes {format_seconds(per_call[0])}, a call on a small weight "
                 f"{format_seconds(per_call[1])}, dispatch and a kernel launch, which overlap the kernel: that rate "
                 f"is set by calls more than by memory)")
    if seconds < at_kernels / 1.1:
        why = ("it paid less of that per-call cost (a CUDA graph replays its kernels without it), or its kernels "
               "ran faster during it than when the ceilings were measured" if calls else
               "its kernels streamed faster during it than when the ceilings were measured (this machine's speed "
               "varies)")
        return f"{head}, and the step took less than that: {why}, so this step cannot say where its time went"
    if seconds <= margin * at_kernels:
        rest = seconds - at_kernels
        return (f"{head}: " + ("the kernels' calls account" if calls else
                                 "the kernels' streaming rate, below the read bandwidth, accounts")
                + f" for the step ({format_seconds(seconds)}, {seconds / at_kernels:.2f}x that"
                + (f"; the other {format_seconds(rest)}: a fixed cost per step"
                   + (")" if memory_steady else " or the machine's drift)")
                   if rest > 0.05 * seconds else ")"))
    likely = ("likely the GPU's own work beside those products: many small kernels (norms, rotary embedding, "
              "attention, the cache write), each with its start and its tail, which a graph replays but does not "
              "remove" if graph else
              "likely a fixed cost per step (Python and operator dispatch, small operations, kernel launches on a "
              "GPU)" + ("" if memory_steady else ", or a machine running slower than when the ceilings were measured"))
    return (f"{head}: the other {format_seconds(seconds - at_kernels)} of its {format_seconds(seconds)} is not "
            + ("those calls" if calls else "the weights' streaming at that rate") + f"; {likely}")


def measure_decode_step(model, batch: int, context: int, *, warmup: int = 3, repeats: int = 10):
    """Time one decode step of the book's decoder for `batch` sequences at `context` cached tokens (chapter 02).

    The cache is filled with random keys and values instead of a prefill (the bytes read are the same), and
    rewound before every step, so each timed step decodes the same position."""
    from .timing import time_fn
    batch, context = _count("batch", batch), _count("context", context, 0)
    if model.cache is None or model.cache.batch < batch or model.cache.max_len <= context:
        model.setup_cache(batch, context + 1)
    model.cache.fill_random(batch, context)
    tokens = torch.randint(0, model.arch.vocab, (batch,), device=model.device)

    def step():
        model.rewind(context)
        return model.decode_step(tokens)

    return time_fn(step, device=model.device, warmup=warmup, repeats=repeats)


def measure_decode_steps(model, batches: Sequence[int], context: int, *, warmup: int = 1, rounds: int = 3,
                         read_bytes: int = 0) -> list:
    """Time one decode step of the book's decoder at each batch size, in turn (`book.timing.time_in_turn`: one step
    of each batch per round, so a machine whose speed drifts slows every batch alike instead of the last ones), from
    one random cache sized for the largest batch; one Timing per batch, in order. `read_bytes`: also time a `sum`
    over a tensor of that many bytes in the same rounds, its Timing last, so the read bandwidth beside the steps
    can be set beside the ceilings' (chapters 02 and 04)."""
    from .hardware import read_probe
    from .timing import time_in_turn
    batches = [_count("batch", b) for b in batches]
    context = _count("context", context, 0)
    if not batches:
        raise ValueError("need at least one batch size")
    top = max(batches)
    model.setup_cache(top, context + 1)
    model.cache.fill_random(top, context)
    fns: dict = {b: decode_step_fn(model, context, b) for b in dict.fromkeys(batches)}
    fns.update(read_probe(read_bytes, model.device))
    ts = time_in_turn(fns, device=model.device, warmup=warmup, rounds=rounds)
    return [ts[b] for b in batches] + ([ts["read"]] if read_bytes > 0 else [])


def decode_step_fn(model, context: int, batch: int):
    """One decode step of the book's decoder for the first `batch` sequences of its cache, each set back to
    `context` cached tokens before every step, as a function to time: the cache, filled once with random keys
    (`KVCache.fill_random`) for the most sequences and the longest context, serves every batch and context in any
    order (chapters 01 and 02)."""
    c = model.cache
    if c is None or c.batch < batch or c.max_len <= context:
        raise ValueError(f"a step of {batch} sequences at context {context} needs a cache of at least that batch "
                         f"and {context + 1} positions: call setup_cache and cache.fill_random first")
    tokens = torch.randint(0, model.arch.vocab, (batch,), device=model.device)
    return _at_context(model, context, batch, lambda: model.decode_step(tokens))


def _at_context(model, context: int, batch: int, call):
    """`call` as a function to time, after setting the first `batch` sequences of the cache back at `context`."""
    def run():
        model.cache.reset(batch)
        model.cache.seek(context)
        return call()
    return run


def measure_extend(model, tokens: int, batch: int, context: int, *, warmup: int = 2, repeats: int = 5):
    """Time one pass of the book's decoder over `tokens` new tokens for each of `batch` sequences at `context` cached
    tokens (random keys and values, rewound before every pass), as verification of drafted tokens runs (chapter 05).
    """
    from .timing import time_fn
    tokens, batch, context = _count("tokens", tokens), _count("batch", batch), _count("context", context, 0)
    if model.cache is None or model.cache.batch < batch or model.cache.max_len < context + tokens:
        model.setup_cache(batch, context + tokens)
    model.cache.fill_random(batch, context)
    x = torch.randint(0, model.arch.vocab, (batch, tokens), device=model.device)

    def run():
        model.rewind(context)
        return model.extend(x)

    return time_fn(run, device=model.device, warmup=warmup, repeats=repeats)


def measure_extends(model, shapes: Sequence[tuple[int, int]], context: int, *, warmup: int = 1,
                    rounds: int = 3) -> dict:
    """Time one pass over `tokens` new tokens for each of `batch` sequences at `context` cached tokens, for every
    (batch, tokens) in `shapes`, in turn (`book.timing.time_in_turn`: every shape warmed up first, then one pass of
    each per round, so neither the first shape timed nor a drifting machine weighs on one shape alone), from one
    random cache sized for the largest; {(batch, tokens): Timing} (chapter 05)."""
    from .timing import time_in_turn
    shapes = [(_count("batch", b), _count("tokens", k)) for b, k in shapes]
    context = _count("context", context, 0)
    if not shapes:
        raise ValueError("need at least one (batch, tokens) shape")
    top, longest = max(b for b, _ in shapes), max(k for _, k in shapes)
    model.setup_cache(top, context + longest)
    model.cache.fill_random(top, context)

    def run_fn(batch: int, tokens: int):
        x = torch.randint(0, model.arch.vocab, (batch, tokens), device=model.device)
        return _at_context(model, context, batch, lambda: model.extend(x))
    return time_in_turn({s: run_fn(*s) for s in dict.fromkeys(shapes)}, device=model.device, warmup=warmup,
                        rounds=rounds)


def linear_sweep(batches: list[int], d_in: int, d_out: int, dtype: str = "bf16", device=None, *,
                 repeats: int = 3, read_bytes: int = 0) -> list[dict]:
    """Time y = x W^T for a [d_out, d_in] weight at each batch size, through the decoder's own product
    (`book.llama.linear`, which picks the kernel measured fastest here for one row and for a few), every batch in
    turn (`book.timing.time_in_turn`: one product of each per round, `repeats` rounds), so a machine whose speed
    drifts slows every batch alike: the roofline, measured; each row carries its time's spread (chapter 02).
    `read_bytes`: also a `sum` over a tensor of that many bytes in the same rounds; each row then carries the read
    bandwidth it measured ("read_bw"), the memory's speed while the products ran."""
    from .llama import linear as decoder_linear
    from .device import as_device
    from .hardware import random_tensor, read_probe
    from .models import _torch_dtype
    from .timing import time_in_turn
    dev, dt = as_device(device), _torch_dtype(dtype)
    w = random_tensor(d_out, d_in, device=dev, dtype=dt)
    xs = {b: random_tensor(_count("batch", b), d_in, device=dev, dtype=dt) for b in batches}
    fns: dict = {b: (lambda x=x: decoder_linear(x, w)) for b, x in xs.items()}
    fns.update(read_probe(read_bytes, dev))
    ts = time_in_turn(fns, device=dev, warmup=1, rounds=repeats)
    rows = []
    for b in batches:
        t, work = ts[b], linear(b, d_in, d_out, dtype)
        rows.append({"batch": b, "seconds": t.median, "spread": t.spread, "flops": work.flops, "bytes": work.bytes,
                     "intensity": work.intensity, "flop_rate": work.flops / t.median,
                     "byte_rate": work.bytes / t.median,
                     **({"read_bw": read_bytes / ts["read"].median} if read_bytes > 0 else {})})
    return rows


def measured_knee(rows: list[dict]) -> float:
    """The batch where a sweep's two measured asymptotes cross: the flat, memory-bound time of the smallest
    batches against the best FLOP rate reached (chapter 02)."""
    if len(rows) < 2:
        raise ValueError("need a sweep of at least two batch sizes")
    rows = sorted(rows, key=lambda r: r["batch"])
    t_flat = min(r["seconds"] for r in rows[:3])
    best_rate = max(r["flop_rate"] for r in rows)
    flops_per_row = rows[0]["flops"] / rows[0]["batch"]
    return t_flat * best_rate / flops_per_row


def first_compute_bound(work, roof: Roof, limit: int = 1 << 20) -> int | None:
    """The smallest batch b with work(b) compute-bound on `roof`, or None up to `limit` (chapter 02)."""
    lo, hi = 1, 1
    while roof.bound(work(hi)) == "memory":
        if hi >= limit:
            return None
        lo, hi = hi, min(limit, hi * 2)
    while lo < hi:               # intensity grows with the batch, so bisect
        mid = (lo + hi) // 2
        if roof.bound(work(mid)) == "compute":
            hi = mid
        else:
            lo = mid + 1
    return hi


def busy_while(fn, device=None, *, seconds: float = 2.0, sample_gpu: bool | None = None) -> dict:
    """Call `fn` repeatedly for about `seconds` and report how busy the device looked meanwhile (chapter 02).

    cpu_busy: process CPU time / wall time / torch threads (what `top` shows, per core); cpu_cores: process CPU
    time / wall time (1.0: one core busy all the time, as the Python thread that launches a GPU's kernels can be,
    which cpu_busy hides on a many-core host); threads: torch's threads. gpu_busy: NVML's
    utilisation (the share of time some kernel ran, as nvidia-smi shows it), sampled every 20 ms on CUDA
    (`sample_gpu`, default: on CUDA) when the `pynvml` package is installed. When sampling fails (no pynvml, NVML
    unavailable), one line says so, "note: NVML utilisation sampling failed on this device (reason); ...", gpu_busy
    is None and the other numbers still come out.
    """
    import threading
    import time
    from .device import as_device, synchronize
    _positive("seconds", seconds)
    dev = as_device(device)
    samples: list[float] = []
    failed: list[str] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                samples.append(torch.cuda.utilization(dev) / 100)
            except Exception as e:     # no pynvml, or NVML unavailable: the fast path falls back
                text = str(e).strip().splitlines()
                failed.append(f"{type(e).__name__}: {text[0][:70]}" if text else type(e).__name__)
                return
            time.sleep(0.02)

    if sample_gpu is None:
        sample_gpu = dev.type == "cuda"
    sampler = threading.Thread(target=sample, daemon=True) if sample_gpu else None
    if sampler:
        sampler.start()
    calls, cpu0, t0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds or calls == 0:
        fn()
        calls += 1
    synchronize(dev)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    stop.set()
    if sampler:
        sampler.join()
    if failed:
        print(f"note: NVML utilisation sampling failed on this device ({failed[0]}); the GPU busy share is "
              f"left out")
        samples.clear()
    return {"calls": calls, "wall": wall, "cpu_busy": cpu / wall / torch.get_num_threads(),
            "cpu_cores": cpu / wall, "threads": torch.get_num_threads(),
            "gpu_busy": sum(samples) / len(samples) if samples else None}


@contextlib.contextmanager
def silence_native_stderr():
    """Discard what C++ code writes to the process's stderr inside the block: PyTorch's profiler (Kineto) prints
    two "USDT ... profiler_start/stop" lines on every run (chapter 02), and on CUDA (torch 2.11) a Python warning
    that it "clears events at the end of each cycle", which one profiled call never reaches. Python's own
    sys.stderr is flushed first."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Profiler clears events")
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def plot_roofline(ax, roofs: list[Roof], points: list[tuple[str, float, float]] = (), *,
                  x_range: tuple[float, float] = (0.1, 1e4), styles: list[str] | None = None):
    """Draw roofs (log-log, FLOP/s against FLOPs/byte) and labelled (name, intensity, FLOP/s) points (chapter 02)."""
    import numpy as np
    xs = np.logspace(math.log10(x_range[0]), math.log10(x_range[1]), 200)
    styles = styles or ["-", "--", ":", "-."]
    for i, roof in enumerate(roofs):
        ys = [roof.attainable(x) for x in xs]
        ridge = f"{roof.ridge:,.0f}" if roof.ridge >= 10 else f"{roof.ridge:.1f}"
        line, = ax.plot(xs, ys, styles[i % len(styles)], lw=1.6, label=f"{roof.name}: ridge {ridge}")
        ax.axvline(roof.ridge, color=line.get_color(), lw=0.6, alpha=0.5)
    for name, x, y in points:
        ax.plot([x], [y], "o", ms=5)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte)")
    ax.set_ylabel("FLOP/s")
    return ax


def compiled_decode_ms(model, context: int = 64) -> float | None:
    """Median ms of the B=1 decode step at `context` cached tokens with `Llama.compile_decode` (CUDA graphs on a
    GPU), or None with a note when torch.compile fails here: what the same step costs once per-kernel launch
    overhead is gone (chapter 02)."""
    try:
        model.cache = None
        model.setup_cache(1, context + 1)
        model.compile_decode()
        if model._compiled is None:
            return None
        t = measure_decode_step(model, 1, context, warmup=5, repeats=20).median * 1e3
        return None if model._compiled is None else t     # None: the step fell back to eager while timed
    except Exception as e:  # noqa: BLE001 - a compiler failure costs this one value, not the recording
        print(f"note: the compiled decode step could not be timed here ({type(e).__name__}: {e})")
        return None
    finally:
        model._compiled = None


def reference_suite(device=None, quick: bool = False) -> dict:
    """The chapter's recorded results: measured ceilings, the matmul sweep and its knee, and decode steps of the
    book's decoder (Llama-2-7B shape, bf16) against the prediction; `quick`: batches up to 64, one layer, two
    decode batches (chapter 02)."""
    from .device import as_device
    from .hardware import bandwidth_test_bytes, measured_ceilings
    from .llama import Llama
    from .models import build_random
    dev = as_device(device)
    c = measured_ceilings(dev)
    dtype = c.fastest(("bf16", "fp32"))
    roof = Roof.measured(c, dtype)
    d_in = 4096
    d_out = max(4096, bandwidth_test_bytes(dev) // (2 * d_in) // 256 * 256)
    batches = [2**i for i in range(7 if quick else 13 if dev.type == "cuda" else 10)]   # up to 64 / 4096 / 512
    rows = linear_sweep(batches, d_in, d_out, dtype, dev)
    arch = architecture("Llama-2-7B")
    if quick or dev.type != "cuda":
        arch = arch.with_layers(1 if quick else 4)
    model = Llama.from_hf(build_random(arch, dtype=dtype, device=dev))
    dec_b = [1, 4] if quick else [1, 4, 16, 64, 256] if dev.type == "cuda" else [1, 4, 16, 64]
    measured = [measure_decode_step(model, b, 64, repeats=4 if quick else 10).median for b in dec_b]
    predicted = [roof.time(decode_step(arch, b, 64, dtype)) for b in dec_b]
    fast = compiled_decode_ms(model) if dev.type == "cuda" and not quick else None
    values = {"dtype_bytes": float(dtype_bytes(dtype)), "copy_bw_gbs": c.copy_bw / 1e9,
              "read_bw_gbs": c.read_bw / 1e9,
              "peak_tflops": c.matmul[dtype] / 1e12, "ridge": roof.ridge, "sweep_d_out": d_out,
              "knee_measured": measured_knee(rows),
              "knee_predicted": float(first_compute_bound(lambda b: linear(b, d_in, d_out, dtype), roof) or 0),
              "decode_b1_ms": measured[0] * 1e3, "decode_b1_predicted_ms": predicted[0] * 1e3}
    if fast is not None:
        values["decode_b1_compiled_ms"] = fast
    return {"values": values, "series": {
        "matmul_flop_rate": {"x": [float(r["batch"]) for r in rows], "y": [r["flop_rate"] / 1e12 for r in rows],
                             "x_label": "batch", "y_label": "TFLOP/s"},
        "decode_step_measured": {"x": [float(b) for b in dec_b], "y": [t * 1e3 for t in measured],
                                 "x_label": "batch", "y_label": "ms per decode step"},
        "decode_step_predicted": {"x": [float(b) for b in dec_b], "y": [t * 1e3 for t in predicted],
                                  "x_label": "batch", "y_label": "ms per decode step"}}}
