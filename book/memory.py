"""Where device memory goes: weights, KV cache, activations, overhead; how many sequences fit; how KV allocators
waste memory; and measuring allocations on CPU or GPU (chapter 03).

Sizes are in bytes; "GB" in this module means 10^9 bytes and "GiB" 2^30. A GPU's capacity is its datasheet number
read as GiB (memory_gb x 2^30): an "80GB" A100 has 80 GiB (81,920 MiB) = 85.9 GB. Cards with ECC on GDDR memory
expose a little less than their datasheet (a T4: 15,360 MiB of 16 GiB); `capacity=` overrides the catalog and
`utilization=` keeps the share a serving engine allows itself (vLLM's gpu_memory_utilization, default 0.9).
"""
from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .device import as_device, synchronize
from .hardware import GB, GPUSpec, gpu
from .models import Architecture, architecture, dtype_bytes

__all__ = ["GB", "GIB", "DEFAULT_OVERHEAD_PER_GPU", "PREFILL_CHUNK", "DoesNotFitError", "MemoryBreakdown",
           "weight_bytes", "kv_cache_bytes", "activation_bytes", "capacity_bytes", "breakdown", "max_batch",
           "crossover_context", "max_batch_text", "Allocation", "measure_allocation", "process_rss", "sample_requests",
           "simulate_allocators", "random_model", "reference_suite"]

#: Bytes in one GiB: the unit of a GPU datasheet's "GB" of memory.
GIB = 2**30
#: Framework overhead per GPU when none is given: CUDA context (0.3-0.8 GB), cuBLAS/NCCL workspaces, and blocks
#: the caching allocator holds but no tensor uses. Measure your own; 1-3 GB is typical.
DEFAULT_OVERHEAD_PER_GPU = 2 * GB
#: Tokens per forward pass that sizes the activation reserve: serving engines prefill long prompts in chunks.
PREFILL_CHUNK = 2048


class DoesNotFitError(ValueError):
    """The model does not fit on the given GPUs at all; the message says by how much (chapter 03)."""


def _positive_int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int,)) and not (isinstance(v, float) and v.is_integer()):
        raise TypeError(f"{name} must be a whole number, got {v!r}")
    if v <= 0:
        raise ValueError(f"{name} must be positive, got {v}")
    return int(v)


def _check_context(a: Architecture, context: Any) -> int:
    context = _positive_int("context", context)
    if context > a.max_context:
        raise ValueError(f"context of {context:,} tokens is beyond {a.name}'s maximum of {a.max_context:,} "
                         f"(its max_position_embeddings)")
    return context


def weight_bytes(model: str | Architecture, dtype: str | torch.dtype = "bf16") -> float:
    """Bytes of all weights: exact parameter count x bytes per parameter; int4 = 0.5 byte, scales not counted
    (chapter 03)."""
    return architecture(model).weight_bytes(dtype)


def kv_cache_bytes(model: str | Architecture, context: int, batch: int = 1,
                   kv_dtype: str | torch.dtype = "bf16") -> float:
    """KV cache of `batch` sequences of `context` tokens: 2 x layers x KV heads x head dim x context x batch x bytes
    (chapter 03)."""
    a = architecture(model)
    context, batch = _check_context(a, context), _positive_int("batch", batch)
    return a.kv_bytes_per_token(kv_dtype) * context * batch


def activation_bytes(model: str | Architecture, tokens: int, dtype: str | torch.dtype = "bf16", *,
                     attended: int | None = None, scores: bool = False, logits_rows: int = 1,
                     logits_bytes: float = 4.0) -> float:
    """Peak temporary memory of one forward pass over `tokens` new tokens (all sequences together) (chapter 03).

    Inside a block the MLP is the peak: the residual stream (h), the fused gate/up output (2I), silu(gate) (I) and
    silu(gate) x up (I): tokens x (h + 4I) x bytes. `scores=True` adds an attention score matrix of
    heads x tokens x `attended` (what a non-fused attention materialises; flash attention does not).
    Plus the logits of `logits_rows` rows, `logits_bytes` each: fp32 as Hugging Face's models return them; the
    book's decoder returns them in its own dtype.
    """
    a = architecture(model)
    tokens = _positive_int("tokens", tokens)
    b = dtype_bytes(dtype)
    mlp = tokens * (a.hidden + 4 * a.intermediate) * b
    att = a.n_heads * tokens * (attended or tokens) * b if scores else 0.0
    if not logits_bytes > 0:
        raise ValueError(f"logits_bytes must be > 0, got {logits_bytes}")
    return mlp + att + logits_rows * a.vocab * logits_bytes


def _check_utilization(utilization: Any) -> float:
    if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) \
            or not 0 < utilization <= 1:
        raise ValueError(f"utilization must be a share in (0, 1], got {utilization!r}")
    return float(utilization)


def capacity_bytes(device: str | GPUSpec, n_gpus: int = 1, *, utilization: float = 1.0) -> float:
    """Memory of `n_gpus` catalog GPUs: the datasheet's GB read as GiB (2^30 bytes) each, times the share a serving
    engine lets itself use (`utilization`, e.g. vLLM's gpu_memory_utilization=0.9) (chapter 03)."""
    spec = device if isinstance(device, GPUSpec) else gpu(device)
    return spec.memory_gb * GIB * _positive_int("n_gpus", n_gpus) * _check_utilization(utilization)


@dataclass(frozen=True)
class MemoryBreakdown:
    """The four parts of device memory for one model, GPU set, context and batch (chapter 03)."""

    model: str
    gpu: str
    n_gpus: int
    context: int
    batch: int
    weight_dtype: str
    kv_dtype: str
    weights: float
    kv_cache: float
    activations: float
    overhead: float
    capacity: float

    @property
    def total(self) -> float:
        """Weights + KV cache + activations + overhead, in bytes (chapter 03)."""
        return self.weights + self.kv_cache + self.activations + self.overhead

    @property
    def free(self) -> float:
        """Capacity left after everything; negative when it does not fit (chapter 03)."""
        return self.capacity - self.total

    @property
    def fits(self) -> bool:
        """Whether the total fits in the GPUs' memory (chapter 03)."""
        return self.free >= 0

    def parts(self) -> dict[str, float]:
        """The four parts in bytes, in plotting order (chapter 03)."""
        return {"weights": self.weights, "KV cache": self.kv_cache, "activations": self.activations,
                "overhead": self.overhead}

    def table(self) -> str:
        """A text table of the parts in GB, with the formula behind each (chapter 03)."""
        a = architecture(self.model)
        why = {"weights": f"{a.n_params() / 1e9:.2f}B params x {dtype_bytes(self.weight_dtype):g} B ({self.weight_dtype})",
               "KV cache": f"2 x {a.n_layers} layers x {a.n_kv_heads} heads x {a.head_dim} x {self.context:,} tok "
                           f"x {self.batch} seq x {dtype_bytes(self.kv_dtype):g} B",
               "activations": (f"peak of one forward pass, {min(self.context, PREFILL_CHUNK):,}-token prefill chunk"
                               if self.activations else "given as 0: counted in the overhead"),
               "overhead": f"{self.overhead / self.n_gpus / GB:.1f} GB per GPU x {self.n_gpus}"}
        lines = [f"{self.model} on {self.n_gpus} x {self.gpu}, context {self.context:,}, batch {self.batch}"]
        for k, v in self.parts().items():
            lines.append(f"  {k:<11} {v / GB:8.2f} GB  {why[k]}")     # 85 characters: a book page's column
        lines.append(f"  {'total':<11} {self.total / GB:8.2f} GB  of {self.capacity / GB:.1f} GB: "
                     + ((f"fits, {self.free / GB:.2f} GB free" if self.free >= 1e9 else
                         f"fits on paper, {self.free / GB:.2f} GB free (under a driver's reserve)")
                        if self.fits else
                        f"does NOT fit, {-self.free / GB:.2f} GB over"))
        shown = sum(round(v / GB, 2) for v in self.parts().values())
        if abs(shown - round(self.total / GB, 2)) > 0.005:       # 13.48 + 17.18 + 0.20 + 2.00 beside 32.85
            lines.append(f"  (each part rounded on its own: the parts as printed add up to {shown:.2f})")
        return "\n".join(lines)


def breakdown(model: str | Architecture, device: str | GPUSpec = "A100 80GB", *, n_gpus: int = 1,
              context: int | None = None, batch: int = 1, weight_dtype: str = "bf16", kv_dtype: str | None = None,
              overhead: float | None = None, activations: float | None = None, capacity: float | None = None,
              utilization: float = 1.0) -> MemoryBreakdown:
    """Weights, KV cache, activations and overhead of serving `batch` sequences of `context` tokens; context defaults
    to the model's maximum, kv_dtype to the weights' unless those are int8/int4 (then bf16) (chapter 03).

    The capacity is `capacity_bytes(device, n_gpus, utilization=utilization)` unless `capacity` (bytes, all GPUs
    together, before `utilization`) is given, e.g. 160e9 for "2 x 80 GB" read as decimal GB.
    """
    a = architecture(model)
    spec = device if isinstance(device, GPUSpec) else gpu(device)
    n_gpus = _positive_int("n_gpus", n_gpus)
    context = _check_context(a, a.max_context if context is None else context)
    batch = _positive_int("batch", batch)
    if kv_dtype is None:
        kv_dtype = weight_dtype if weight_dtype in ("fp32", "bf16", "fp16") else "bf16"
    if overhead is None:
        overhead = DEFAULT_OVERHEAD_PER_GPU * n_gpus
    if overhead < 0:
        raise ValueError(f"overhead must be zero or positive, got {overhead}")
    act_dtype = weight_dtype if weight_dtype in ("fp32", "bf16", "fp16") else "bf16"
    if activations is None:
        activations = activation_bytes(a, min(context, PREFILL_CHUNK), act_dtype)
    if capacity is None:
        capacity = capacity_bytes(spec, n_gpus, utilization=utilization)
    else:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, float)) or not capacity > 0:
            raise ValueError(f"capacity must be a positive number of bytes, got {capacity!r}")
        capacity = float(capacity) * _check_utilization(utilization)
    return MemoryBreakdown(model=a.name, gpu=spec.name, n_gpus=n_gpus, context=context, batch=batch,
                           weight_dtype=weight_dtype, kv_dtype=kv_dtype, weights=a.weight_bytes(weight_dtype),
                           kv_cache=kv_cache_bytes(a, context, batch, kv_dtype), activations=float(activations),
                           overhead=float(overhead), capacity=capacity)


def max_batch(model: str | Architecture, device: str | GPUSpec = "A100 80GB", *, n_gpus: int = 1,
              context: int | None = None, weight_dtype: str = "bf16", kv_dtype: str | None = None,
              overhead: float | None = None, activations: float | None = None, capacity: float | None = None,
              utilization: float = 1.0, strict: bool = True) -> int:
    """The largest batch of `context`-token sequences whose KV cache fits beside weights, activations and overhead:
    floor(free / KV per sequence); `capacity` and `utilization` as in `breakdown` (chapter 03).

    When even the weights (plus overhead and activations) do not fit, raise DoesNotFitError saying by how much, or
    return 0 with strict=False.
    """
    b = breakdown(model, device, n_gpus=n_gpus, context=context, batch=1, weight_dtype=weight_dtype,
                  kv_dtype=kv_dtype, overhead=overhead, activations=activations, capacity=capacity,
                  utilization=utilization)
    room = b.capacity - b.weights - b.activations - b.overhead
    if room < 0:
        if strict:
            raise DoesNotFitError(
                f"{b.model} in {weight_dtype} does not fit on {n_gpus} x {b.gpu} ({b.capacity / GB:.1f} GB): weights "
                f"{b.weights / GB:.1f} GB + activations {b.activations / GB:.1f} GB + overhead {b.overhead / GB:.1f} "
                f"GB = {(b.capacity - room) / GB:.1f} GB, {-room / GB:.1f} GB too much before any KV cache. Use more "
                f"GPUs or a smaller weight dtype (int8, int4).")
        return 0
    return int(room // b.kv_cache)


def max_batch_text(model: str | Architecture, device: str | GPUSpec = "A100 80GB", **kwargs: Any) -> tuple[int, str]:
    """`max_batch` (not strict, with the same keyword arguments) and a phrase for it: the number, or why not even
    one sequence fits (chapter 03)."""
    best = max_batch(model, device, strict=False, **kwargs)
    if best:
        return best, str(best)
    b = breakdown(model, device, batch=1, **kwargs)
    if b.weights > b.capacity:
        return 0, "none: the weights do not fit"
    if b.weights + b.activations + b.overhead > b.capacity:
        return 0, "none: the weights fit, but not beside the activations and overhead"
    return 0, "none: the weights fit, but not one sequence's KV cache beside them"


def crossover_context(model: str | Architecture, batch: int, weight_dtype: str = "bf16",
                      kv_dtype: str = "bf16") -> float:
    """The context (tokens) at which `batch` sequences' KV cache equals the weights; may exceed the model's maximum
    (chapter 03)."""
    a = architecture(model)
    return a.weight_bytes(weight_dtype) / (a.kv_bytes_per_token(kv_dtype) * _positive_int("batch", batch))


# ------------------------------------------------------------------------------------------------- measurement

def _statm_rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _psutil_rss() -> int | None:
    try:
        import psutil   # a dependency of the book (requirements.txt)
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)


def process_rss() -> int:
    """This process's resident memory now, in bytes: /proc/self/statm on Linux, psutil elsewhere (chapter 03).

    Not ru_maxrss: that is the process's peak, so a difference of two readings would not be what a call kept."""
    rss = _statm_rss()
    if rss is None:
        rss = _psutil_rss()
    if rss is None:
        raise RuntimeError("cannot read this process's current resident memory: there is no /proc/self/statm here "
                           "and psutil is not installed (pip install psutil)")
    return rss


def _reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark of resident memory (Linux >= 4.0): write 5 to /proc/self/clear_refs."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


_MALLOC_FIXED = False


def _fix_malloc_threshold() -> None:
    """glibc raises its mmap threshold after large frees (up to 32 MiB), so freed tensors stay in the heap and in the
    resident memory; fixing it at 128 KiB makes freed tensors give their pages back, so RSS follows live tensors."""
    global _MALLOC_FIXED
    if _MALLOC_FIXED:
        return
    _MALLOC_FIXED = True
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)   # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _peak_rss() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


@dataclass(frozen=True)
class Allocation:
    """What a function allocated on a device: bytes still held after it returns, and its peak above the start
    (chapter 03)."""

    device: str
    method: str
    retained: int
    peak: int
    seconds: float
    result: Any = None

    def __repr__(self) -> str:
        return (f"Allocation({self.device}: retained {self.retained / 2**20:,.1f} MiB, peak {self.peak / 2**20:,.1f} "
                f"MiB, by {self.method})")


def measure_allocation(fn: Callable[[], Any], device: torch.device | str | None = None) -> Allocation:
    """Run fn() and measure the memory it allocates: on CUDA the caching allocator's statistics (memory_allocated,
    max_memory_allocated); on Apple GPUs the MPS allocator's live bytes, its peak sampled; on a CPU the process's
    resident memory and its reset high-water mark (VmHWM on Linux; elsewhere sampled every millisecond) (chapter 03).

    `retained` counts what fn's result (or anything else) still holds after it returns; `peak` the most held at
    once while it ran, both relative to the start. The result of fn is kept in `.result`. On the CPU, resident
    memory counts only pages that were written: torch.empty allocates address space, not memory, until it is
    filled; and the first CPU call fixes glibc's mmap threshold so that freed tensors leave the resident set.
    """
    if not callable(fn):
        raise TypeError(f"measure_allocation needs a function to call, got {fn!r}")
    dev = as_device(device)
    import gc
    gc.collect()
    if dev.type == "cuda":
        synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        t0 = time.perf_counter()
        result = fn()
        synchronize(dev)
        dt = time.perf_counter() - t0
        after, peak = torch.cuda.memory_allocated(dev), torch.cuda.max_memory_allocated(dev)
        return Allocation(str(dev), "torch.cuda.memory_allocated / max_memory_allocated", after - before,
                          max(peak - before, after - before), dt, result)
    if dev.type == "mps":
        return _measure_mps(fn, dev)
    _fix_malloc_threshold()
    synchronize(dev)
    before = process_rss()
    hwm = _reset_peak_rss() and _peak_rss() is not None
    # no resettable high-water mark: sample the resident memory every millisecond
    result, dt, samples = _run_sampled(fn, dev, None if hwm else process_rss)
    after = process_rss()
    if hwm:
        peak, method = (_peak_rss() or after), "resident memory (/proc/self/statm) and its high-water mark (VmHWM)"
    else:
        src = "/proc/self/statm" if _statm_rss() is not None else "psutil"
        peak, method = max(samples + [before, after]), f"resident memory ({src}), sampled every millisecond"
    return Allocation(f"{dev.type} (process memory)", method, after - before, max(peak - before, after - before),
                      dt, result)


def _run_sampled(fn: Callable[[], Any], dev: torch.device,
                 read: Callable[[], int] | None) -> tuple[Any, float, list[int]]:
    """Run fn() to completion on dev, a thread calling read() every millisecond meanwhile (when given): the result,
    the seconds it took and the readings."""
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(read())
            time.sleep(0.001)
    th = threading.Thread(target=sample, daemon=True) if read else None
    if th:
        th.start()
    t0 = time.perf_counter()
    try:
        result = fn()
        synchronize(dev)
    finally:
        stop.set()
    dt = time.perf_counter() - t0
    if th:
        th.join()
    return result, dt, samples


def _measure_mps(fn: Callable[[], Any], dev: torch.device) -> Allocation:
    """Apple GPUs: the MPS allocator's live bytes before and after; it keeps no peak, so a thread samples it every
    millisecond (a lower bound on the peak). Process memory would miss Metal buffers or count them twice."""
    synchronize(dev)
    before = torch.mps.current_allocated_memory()
    result, dt, samples = _run_sampled(fn, dev, torch.mps.current_allocated_memory)
    after = torch.mps.current_allocated_memory()
    peak = max(samples + [before, after])
    return Allocation("mps", "torch.mps.current_allocated_memory, sampled every millisecond (peak: a lower bound)",
                      after - before, max(peak - before, after - before), dt, result)


# ------------------------------------------------------------------------------------------------ fragmentation

def sample_requests(n: int, *, max_len: int = 4096, prompt_median: float = 256, output_median: float = 192,
                    sigma: float = 1.0, seed: int = 0) -> tuple[list[int], list[int]]:
    """n (prompt, output) token lengths, each lognormal with the given median and log-sd, the total capped at
    max_len; seeded and deterministic (chapter 03)."""
    import random
    n, max_len = _positive_int("n", n), _positive_int("max_len", max_len)
    if max_len < 2:
        raise ValueError("max_len must allow at least one prompt and one output token")
    rng = random.Random(seed)
    prompts, outputs = [], []
    for _ in range(n):
        p = min(max_len - 1, max(1, round(rng.lognormvariate(math.log(prompt_median), sigma))))
        o = min(max_len - p, max(1, round(rng.lognormvariate(math.log(output_median), sigma))))
        prompts.append(p)
        outputs.append(o)
    return prompts, outputs


def simulate_allocators(capacity_tokens: int, prompts: list[int], outputs: list[int], *, max_len: int = 4096,
                        block: int = 16, steps: int | None = None) -> dict[str, dict[str, Any]]:
    """Serve the requests (a queue that never runs dry) with a KV pool of `capacity_tokens` token slots, one token
    per running request per step, under two allocators (chapter 03):

    - "contiguous": each request reserves max_len slots up front (its output length is unknown) and frees them at
      the end;
    - "paged": memory is handed out in blocks of `block` tokens as the sequence grows; when a block is needed and
      none is free, the newest request is preempted (its blocks freed, it restarts later).

    Returns per allocator the time series of real tokens held, reserved-but-empty slots and free slots (shares of the
    pool), running requests and whether requests were waiting; their averages over the saturated steps (requests
    waiting), and the number of steps to serve everything.
    """
    capacity_tokens = _positive_int("capacity_tokens", capacity_tokens)
    block = _positive_int("block", block)
    if len(prompts) != len(outputs) or not prompts:
        raise ValueError("give one output length per prompt length, and at least one request")
    if capacity_tokens < max_len:
        raise ValueError(f"a pool of {capacity_tokens} tokens cannot hold one request of max_len {max_len}")
    total = sum(p + o for p, o in zip(prompts, outputs))
    if steps is None:
        steps = 4 * total // max(1, capacity_tokens // max_len) // 2 + 1
    results = {}
    for kind in ("contiguous", "paged"):
        queue = list(range(len(prompts)))
        queue.reverse()                       # pop() from the end = first come, first served
        running: list[list[int]] = []         # [request, current length, target length, slots held]
        free = capacity_tokens
        real_s, reserved_s, free_s, batch_s, busy, done = [], [], [], [], [], 0
        for _ in range(steps):
            # admit while there is room (contiguous: max_len slots; paged: the prompt's blocks plus one)
            while queue:
                r = queue[-1]
                need = max_len if kind == "contiguous" else -(-(prompts[r] + 1) // block) * block
                if need > free:
                    break
                queue.pop()
                free -= need
                running.append([r, prompts[r], prompts[r] + outputs[r], need])
            if not running:
                break
            # one decode step: every running request adds a token (paged: a new block when the last one is full)
            i = 0
            while i < len(running):
                item = running[i]
                if kind == "paged" and item[1] + 1 > item[3]:
                    while free < block and len(running) - 1 > i:     # preempt the newest request
                        victim = running.pop()
                        free += victim[3]
                        queue.append(victim[0])
                    if free < block:                                 # it is itself the newest: preempt it
                        running.pop(i)
                        free += item[3]
                        queue.append(item[0])
                        continue
                    free -= block
                    item[3] += block
                item[1] += 1
                i += 1
            keep = []
            for item in running:
                if item[1] >= item[2]:
                    free += item[3]
                    done += 1
                else:
                    keep.append(item)
            running = keep
            real = sum(it[1] for it in running)
            held = sum(it[3] for it in running)
            real_s.append(real / capacity_tokens)
            reserved_s.append((held - real) / capacity_tokens)
            free_s.append(free / capacity_tokens)
            batch_s.append(len(running))
            busy.append(bool(queue))
            if not queue and not running:
                break
        # averages over the saturated steps (requests still waiting), after the first tenth (the start transient)
        idx = [i for i, b in enumerate(busy) if b]
        idx = idx[len(idx) // 10:] or list(range(len(real_s)))
        avg = lambda xs: sum(xs[i] for i in idx) / len(idx)  # noqa: E731
        results[kind] = {"real": real_s, "reserved": reserved_s, "free": free_s, "batch": batch_s, "busy": busy,
                         "real_share": avg(real_s), "reserved_share": avg(reserved_s), "free_share": avg(free_s),
                         "mean_batch": avg(batch_s), "finished": done, "steps": len(real_s)}
    return results


# ------------------------------------------------------------------------------------------------ reference suite

def random_model(arch: str | Architecture, *, dtype: str = "bf16", device: torch.device | str | None = None,
                 seed: int = 0):
    """The book's decoder with random weights actually written to memory (never zeros, never untouched pages)
    (chapter 03)."""
    from .llama import Llama
    from .models import fill_random_
    model = Llama(architecture(arch), dtype=dtype, device=device)
    fill_random_(list(model.parameters()), seed=seed)
    return model


def reference_suite(device: torch.device | str | None = None, dtype: str | None = None, quick: bool = False) -> dict:
    """The chapter's recorded results: measured KV-cache and weight allocations of the book's decoder against the
    estimate, and the activation peak of prefill and decode, in `dtype` (default: the fastest of bf16, fp16 and
    fp32 measured on the device, as in the chapter); `quick`: one layer, caches and prefills a quarter as long
    (chapter 03)."""
    dev = as_device(device)
    if dtype is None:
        from .hardware import measured_ceilings
        dtype = measured_ceilings(dev).fastest(("bf16", "fp16", "fp32"))
    arch = architecture("Llama-2-7B").with_layers(1 if quick else 2)
    ctx = 256 if quick else 1024
    own = dtype_bytes(dtype)                       # the book's decoder returns logits in its own dtype
    alloc = measure_allocation(lambda: random_model(arch, dtype=dtype, device=dev), dev)
    model = alloc.result
    values = {"weights_measured_gb": alloc.retained / GB, "weights_estimated_gb": arch.weight_bytes(dtype) / GB}
    xs, ys, es = [], [], []
    for batch, n in [(1, ctx), (4, ctx), (4, 4 * ctx), (8, 4 * ctx)]:
        model.cache = None
        a = measure_allocation(lambda: model.setup_cache(batch, n), dev)
        xs.append(float(batch * n))
        ys.append(a.retained / GB)
        es.append(kv_cache_bytes(arch, n, batch, dtype) / GB)
        del a
    model.cache = None
    model.setup_cache(1, ctx + 1)                                     # the longest prefill, one decoded token
    tokens = torch.randint(0, arch.vocab, (1, ctx), device=dev)
    model.prefill(tokens[:, :64])                                     # warm-up
    for n in (ctx // 4, ctx):
        pre = measure_allocation(lambda: model.prefill(tokens[:, :n]), dev)
        values[f"prefill_{n}_peak_gb"] = pre.peak / GB
        values[f"prefill_{n}_estimated_gb"] = activation_bytes(arch, n, dtype, logits_bytes=own) / GB
    dec = measure_allocation(lambda: model.decode_step(tokens[:, -1]), dev)
    values.update(decode_peak_gb=dec.peak / GB,
                  decode_estimated_gb=activation_bytes(arch, 1, dtype, logits_bytes=own) / GB)
    return {"values": values,
            "series": {"kv_measured_vs_tokens": {"x": xs, "y": ys, "x_label": "batch x context (tokens)",
                                                 "y_label": "KV cache allocated (GB)"},
                       "kv_estimated_vs_tokens": {"x": xs, "y": es, "x_label": "batch x context (tokens)",
                                                  "y_label": "KV cache estimated (GB)"}}}
