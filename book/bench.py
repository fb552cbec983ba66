"""Benchmarks from the command line: `python -m book.bench decode` times the book's decoder against Hugging Face
`generate` on the same weights and reports bytes per step, bandwidth and MBU (chapter 02); `python -m book.bench
serve` serves one workload with the book's static and continuous-batching engines and with Hugging Face's, all at
once and then under Poisson load, and reports throughput and latency percentiles (chapter 04); `python -m book.bench
speculative` measures speculative decoding with the book's model pair against its formula and against Hugging Face
assisted generation (chapter 05)."""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch

from .device import as_device, device_name, last_level_cache_bytes, synchronize
from . import kernels
from .hardware import GB, _random_tensor, measured_ceilings, random_tensor
from .llama import Llama
from .models import Architecture, architecture, build_random
from .timing import Timing, format_seconds, time_fn

__all__ = ["DecodeResult", "bench_decode", "ServeRun", "ServeResult", "bench_serve", "SpecResult", "bench_speculative",
           "held_out_prompts", "main"]

DTYPE_NAMES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class DecodeResult:
    """What `bench_decode` measured: per-step times, bytes, bandwidths and MBU of the book and of HF (chapter 02)."""

    device: str
    dtype: str
    model: str
    batch: int
    bytes_per_step: float          # weights + KV, mean over the timed steps
    weight_bytes: float
    kv_bytes: float
    read_bw: float                 # measured_ceilings: the denominator of decode MBU
    copy_bw: float
    matvec_bw: float               # measured_ceilings: the best single matrix-vector product over the same bytes
    path: str                      # how the book's decode step ran: "eager (<matvec path>)" or "compiled"
    bw_samples: tuple[float, ...]  # read bandwidth (bytes/s) next to each timed step: max(sum, matrix-vector)
    mv_samples: tuple[float, ...]  # matrix-vector bandwidth (bytes/s) sampled next to each timed step
    book: Timing
    hf: Timing | None
    mbu_book: float                # per step against the read-bandwidth sample beside it (median over steps)
    mbu_mv_book: float             # the same against the matrix-vector sample beside it
    mbu_hf: float | None
    speedup: float | None          # book tokens/s over HF tokens/s (median of per-step paired ratios)
    logits_rel_err: float | None
    tokens_equal: int | None
    sum_samples: tuple[float, ...] = ()   # the `sum` alone next to each timed step (one unwarmed call each)


def _arch(model: str, layers: int | None, **shape: int | None) -> tuple[Architecture, str]:
    base = architecture(model)
    a = base.with_layers(layers) if layers and layers != base.n_layers else base
    changes = {k: v for k, v in shape.items() if v}
    if changes:
        if "hidden" in changes or "n_heads" in changes:
            changes.setdefault("head_dim", changes.get("hidden", a.hidden) // changes.get("n_heads", a.n_heads))
        a = replace(a, name=a.name + " (resized)", **changes)
    what = f"{base.name} shape" + (f" with {a.n_layers} of its {base.n_layers} layers" if a.n_layers != base.n_layers
                                   else "") + (f", resized {changes}" if changes else "")
    return a, what


def bench_decode(model: str = "Llama-2-7B", *, layers: int | None = None, dtype: str | None = None, batch: int = 1,
                 prompt: int = 64, steps: int | None = None, device: str | None = None, compile: str = "auto",
                 hf: bool = True, bw_bytes: int | None = None, seed: int = 0, out: Callable[[str], None] = print,
                 **shape: int | None) -> DecodeResult:
    """Time greedy decoding with the book's decoder and with HF `generate` on the same random weights, step by step
    and interleaved with read-bandwidth samples, and print bytes, bandwidth and MBU (chapter 02)."""
    dev = as_device(device)
    gpu = dev.type == "cuda"
    if dtype is not None and dtype not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_NAMES)}")
    layers = layers if layers is not None else (None if gpu else 4)
    steps = steps or (64 if gpu else 32)
    if batch < 1 or prompt < 1 or steps < 2:
        raise ValueError(f"need batch >= 1, prompt >= 1, steps >= 2; got {batch}, {prompt}, {steps}")
    arch, what = _arch(model, layers, **shape)
    if compile not in ("auto", "on", "off"):
        raise ValueError(f"compile must be auto, on or off, got {compile!r}")
    use_compile = {"auto": None, "on": True, "off": False}[compile]   # None: measure both, keep the faster

    out(f"decode benchmark: book.llama vs Hugging Face generate, greedy, batch {batch}, prompt {prompt} tokens, "
        f"{steps} steps")
    llc = last_level_cache_bytes(dev)
    out(f"device: {dev.type} - {device_name(dev)}; torch {torch.__version__}"
        + (f"; last-level cache {llc / 2**20:,.0f} MiB" if llc else ""))
    c = measured_ceilings(dev)
    # the precision whose one-row products stream the most weights per second here (chapter 02)
    if dtype is None:
        dtype = c.decode_dtype()
        out(f"{c.decode_text()}: chosen (--dtype picks another)")
    if dtype not in c.matvec:
        raise ValueError(f"no one-row product was measured in {dtype} on {c.device}; use --dtype "
                         f"{' or '.join(c.matvec)}")
    t0 = time.perf_counter()
    ref = build_random(arch, dtype=dtype, device=dev, seed=seed)
    book = Llama.from_hf(ref)
    if not hf:
        del ref
    n_params = arch.n_params()
    out(f"model: {what} (random weights), {dtype}: {_gb(n_params * book.embed.element_size())} of weights "
        f"({n_params / 1e6:,.0f}M parameters); built in {time.perf_counter() - t0:.0f} s")

    read_bw, copy_bw, matvec_bw = c.read_bw, c.copy_bw, c.matvec_bw(dtype)
    mv_path, mv_used = one_row_paths(book)
    tested = bw_bytes or c.bytes_tested
    out(f"ceilings (measured once, {c.bytes_tested / 2**20:,.0f} MiB): read {read_bw / GB:.1f} GB/s "
        f"({c.read_kernel}, range {c.spread(c.read_samples):.0%}), copy {copy_bw / GB:.1f} GB/s; matrix-vector "
        f"ceiling {dtype} "
        f"{matvec_bw / GB:.1f} GB/s")
    layer_rates = c.matvec_layer.get(dtype) or c.matvec[dtype]
    out(f"one row of {dtype}: {kernels.describe(dev, DTYPE_NAMES[dtype], layer_rates)}")
    ceiling_path = c.matvec_ceiling_path(dtype)
    big = _random_tensor(tested, dev)
    w_mv = random_tensor(max(1, tested // (4096 * book.embed.element_size())), 4096, device=dev,
                         dtype=DTYPE_NAMES[dtype])
    x_mv = torch.randn(4096, device=dev).to(DTYPE_NAMES[dtype])
    max_len = prompt + steps + 2
    book.setup_cache(batch, max_len)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(3, arch.vocab, (batch, prompt), generator=g).to(dev)

    # warm-up: every kernel (and, compiled, every CUDA graph) both sides will use
    t0 = time.perf_counter()
    book.generate(x, steps + 2)
    if hf:
        _hf_generate(ref, x, 3, None)
    path = f"eager PyTorch, one row via {mv_used}"
    if use_compile is not False:
        book.compile_decode()
        book.generate(x, steps + 2)                       # compiles every shape the timed steps use
        # eager and compiled steps taken in turn, so a drifting machine slows both alike
        eager_ms, compiled_ms = _paired_step_ms(book, x, dev, min(6, (steps + 1) // 2))
        how = "torch.compile(mode='reduce-overhead'), CUDA graphs" if gpu else "torch.compile"
        if book._compiled is None:
            path += " (torch.compile failed here)"
        elif use_compile is True or compiled_ms < eager_ms:
            path = how + ("" if use_compile is True else
                          f": measured faster here ({compiled_ms:.1f} vs {eager_ms:.1f} ms per step eager)")
        else:
            book._compiled = None
            path += f": measured faster here than {how} ({eager_ms:.1f} vs {compiled_ms:.1f} ms per step)"
    out(f"decode path: {path}; warm-up {time.perf_counter() - t0:.1f} s")

    # Timed: inside HF's own generate loop, a logits processor runs one book step and one read-bandwidth sample
    # between consecutive HF steps, so all three see the same machine state (this VM's bandwidth drifts).
    book_times, hf_times, bw_samples, mv_samples, step_bytes, book_tokens = [], [], [], [], [], []
    margins = []                       # HF's gap between its top two logits at each token, per sequence
    state = {"tok": book.prefill(x).argmax(-1), "last": None}

    def book_step() -> None:
        kv = book.decode_kv_len()
        synchronize(dev)
        t = time.perf_counter()
        state["tok"] = book.decode_step(state["tok"]).argmax(-1)
        synchronize(dev)
        book_times.append(time.perf_counter() - t)
        step_bytes.append(book.weight_bytes_per_step(batch) + book.kv_bytes_per_step(batch, kv))
        book_tokens.append(state["tok"])
        bw_samples.append(big.numel() * big.element_size() / time_fn(big.sum, device=dev, warmup=0, repeats=1).median)
        mv_samples.append(w_mv.numel() * w_mv.element_size()
                          / time_fn(lambda: kernels.matvec(w_mv, x_mv, ceiling_path), device=dev, warmup=0,
                                    repeats=1).median)

    def hook(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        synchronize(dev)
        now = time.perf_counter()
        if state["last"] is not None:
            hf_times.append(now - state["last"])
        top = scores.float().topk(2, dim=-1).values
        margins.append(top[:, 0] - top[:, 1])
        if len(book_times) < steps:
            book_step()
        synchronize(dev)
        state["last"] = time.perf_counter()
        return scores

    hf_tokens = None
    if hf:
        hf_tokens = _hf_generate(ref, x, steps + 1, hook)[:, prompt + 1:]
    while len(book_times) < steps:
        book_step()

    kv_bytes = statistics.fmean(step_bytes) - book.weight_bytes_per_step(batch)
    nbytes = statistics.fmean(step_bytes)
    # The read bandwidth beside each step, as the ceilings define it: the faster of the two ways of reading once.
    read_samples = [max(s, m) for s, m in zip(bw_samples, mv_samples)]
    tb, bw = Timing(tuple(book_times), str(dev)), statistics.median(read_samples)
    mbu_book = statistics.median(b / t / s for b, t, s in zip(step_bytes, book_times, read_samples))
    mbu_mv = statistics.median(b / t / s for b, t, s in zip(step_bytes, book_times, mv_samples))
    out(f"bytes read per step: {_gb(book.weight_bytes_per_step(batch))} weights (every weight but the embedding "
        f"table) + {_gb(kv_bytes)} KV (mean over steps) = {_gb(nbytes)}")
    out(f"sampled beside every step: sum {statistics.median(bw_samples) / GB:.1f} GB/s, matrix-vector "
        f"{statistics.median(mv_samples) / GB:.1f} GB/s; read bandwidth (the faster of the two, as in the "
        f"ceilings) median {bw / GB:.1f} GB/s (range {min(read_samples) / GB:.1f}-{max(read_samples) / GB:.1f}); "
        f"MBU = bytes / step time / the read sample beside that step (median over steps); 'of the matrix-vector "
        f"sample' divides by the product's sample alone")
    drift = c.moved(bw, c.read_samples)     # one call each beside a step, against the ceilings' medians
    if drift is not None:
        out(f"the memory read {abs(drift):.0%} {'faster' if drift > 0 else 'slower'} beside the steps (one call of "
            f"each, unwarmed) than the ceilings' read bandwidth (medians of warmed samples, range "
            f"{c.spread(c.read_samples):.0%}): against the ceiling the book's MBU would be "
            f"{nbytes / tb.median / read_bw:.2f}")

    def line(name: str, t: Timing, mbu: float, mbu_mv: float) -> str:
        return (f"{name}: median {format_seconds(t.median)}, IQR {format_seconds(t.iqr)} (spread {t.spread:.1%}), "
                f"{batch / t.median:.2f} tokens/s, {nbytes / t.median / GB:.1f} GB/s, MBU {mbu:.2f}, "
                f"{mbu_mv:.2f} of the matrix-vector sample beside it; time beyond its bytes at the sampled read "
                f"bandwidth "
                f"{format_seconds(max(0.0, t.median - nbytes / bw))}")

    out(line("book decode step", tb, mbu_book, mbu_mv))
    th = mbu_hf = speedup = err = same = None
    if hf:
        th = Timing(tuple(hf_times), str(dev))
        mbu_hf = statistics.median(b / t / s for b, t, s in zip(step_bytes, hf_times, read_samples))
        mbu_mv_hf = statistics.median(b / t / s for b, t, s in zip(step_bytes, hf_times, mv_samples))
        # each HF step is paired with the book step and bandwidth sample beside it; the median of the paired
        # ratios is robust to the machine's drift, the ratio of the two medians is not
        speedup = statistics.median(h / b for h, b in zip(hf_times, book_times))
        out(line("HF   generate step", th, mbu_hf, mbu_mv_hf))
        with torch.no_grad():
            want = ref(x).logits[:, -1].float()
            book.setup_cache(batch, max_len)
            diff = (book.prefill(x).float() - want).abs().max().item()
            err = diff / want.abs().max().item()
        got = torch.stack(book_tokens, 1)[:, :hf_tokens.shape[1]]
        agree = (got == hf_tokens).all(0).long()
        same = int(agree.cumprod(0).sum())
        out(f"check: last prefill logits |book - HF| / max|HF| = {err:.1e}; greedy tokens equal for the first "
            f"{same} of {got.shape[1]} steps")
        if same < got.shape[1]:        # why they parted: a near tie, or logits that differ beyond rounding
            out(tie_text(same + 1, float(margins[same + 1][got[:, same] != hf_tokens[:, same]].min()), diff))
        out(f"book/HF tokens/s: {speedup:.2f}x (median of per-step paired ratios; ratio of the median step times "
            f"{th.median / tb.median:.2f}x)")
    short = f"{arch.name.split(' ')[0]}[{arch.n_layers}L]"
    out(f"SUMMARY device={dev.type} dtype={dtype} model={short} batch={batch} bytes/step={nbytes / GB:.2f}GB "
        f"MBU(book)={mbu_book:.2f} MBU(HF)=" + (f"{mbu_hf:.2f}" if hf else "n/a")
        + f" of_matvec(book)={mbu_mv:.2f} path={'compiled' if book._compiled is not None else 'eager-' + mv_path}"
        + " book/HF tokens/s=" + (f"{speedup:.2f}x" if hf else "n/a"))
    return DecodeResult(device=device_name(dev), dtype=dtype, model=what, batch=batch, bytes_per_step=nbytes,
                        weight_bytes=book.weight_bytes_per_step(batch), kv_bytes=kv_bytes, read_bw=read_bw,
                        copy_bw=copy_bw, matvec_bw=matvec_bw, path=path, bw_samples=tuple(read_samples),
                        mv_samples=tuple(mv_samples), book=tb, hf=th, mbu_book=mbu_book, mbu_mv_book=mbu_mv,
                        mbu_hf=mbu_hf, speedup=speedup, logits_rel_err=err, tokens_equal=same,
                        sum_samples=tuple(bw_samples))


def one_row_paths(model: Llama) -> tuple[str, str]:
    """The one-row path each of the decoder's weight matrices takes at its size (`book.llama.linear`): a short tag
    ("linear", "linear+mulsum") and a phrase for a reader ("linear on 16 and mulsum on 1 of the 17 weight
    matrices (each by its size)") (chapter 02)."""
    ws = {id(p): p for n, p in model.named_parameters() if p.dim() in (2, 3) and n != "embed"}
    ws[id(model.lm_head)] = model.lm_head           # the embedding is read as the LM head only when tied
    by: dict[str, int] = {}
    for w in ws.values():                           # 3-D: stored as blocks of columns (kernels.blocked_linear)
        path = ("blocks" if w.dim() == 3 else
                kernels.matvec_path(w.device, w.dtype, w.numel() * w.element_size()))
        by[path] = by.get(path, 0) + 1
    name = {"blocks": "mulsum over column blocks"}   # a reader's words for the tag
    if len(by) == 1:
        return next(iter(by)), f"{name.get(next(iter(by)), next(iter(by)))} on all {len(ws)} weight matrices"
    parts = [f"{name.get(p, p)} on {n}" for p, n in sorted(by.items(), key=lambda kv: -kv[1])]
    how = "its size and row length" if "blocks" in by else "its size"
    return "+".join(sorted(by)), f"{' and '.join(parts)} of the {len(ws)} weight matrices (each by {how})"


def _kernel_choice(dev: torch.device, dtype: str) -> str:
    """Load (or measure once) the device's ceilings, which set the decoder's per-device kernel choice, and say what
    was chosen: the one-row path by weight size and the path for a few rows (chapters 02 and 04)."""
    c = measured_ceilings(dev)
    if dtype not in c.matvec:
        return f"kernels: {dtype} has no measured matrix-vector paths on {c.device}; F.linear throughout"
    t = DTYPE_NAMES[dtype]
    big, small = kernels.matvec_path(dev, t, 64 * 2**20), kernels.matvec_path(dev, t, 2**20)
    rows = c.rows_path(dtype)
    return (f"kernels (chosen by the build's measured ceilings): one row via {big} on large weights and {small} on "
            f"1 MiB ones; 2-{kernels.FEW_ROWS} rows via {rows} ({kernels.ROW_PATHS[rows]}); more rows via F.linear")


def _paired_step_ms(model: Llama, x: torch.Tensor, dev: torch.device, n: int = 6) -> tuple[float, float]:
    """Median ms of `n` eager and `n` compiled decode steps, taken in turn after one prefill, for choosing between
    them on a machine whose speed drifts (chapter 02); the compiled median is inf where the compiled step failed
    (it then falls back, with a line, and stays off)."""
    compiled = model._compiled
    tok = model.prefill(x).argmax(-1)
    ts: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 * n):
        use = i % 2 == 1 and compiled is not None
        model._compiled = compiled if use else None
        synchronize(dev)
        t = time.perf_counter()
        tok = model.decode_step(tok).argmax(-1)
        synchronize(dev)
        if use and model._compiled is None:           # failed when run: the plain step from now on
            compiled = None
        ts[use].append(time.perf_counter() - t)
    model._compiled = compiled
    return statistics.median(ts[False]) * 1e3, statistics.median(ts[True]) * 1e3 if ts[True] else float("inf")


def _gb(n: float) -> str:
    return f"{n / GB:.3f} GB" if n >= 1e8 else f"{n / 2**20:.2f} MiB"


def tie_text(step: int, gap: float, diff: float) -> str:
    """Why the book's greedy tokens parted from HF's at `step`: HF's top two logits there were `gap` apart, against
    `diff`, the largest difference between the two decoders' logits after the prompt (chapter 02)."""
    apart = "tied (0 apart)" if gap == 0 else f"{gap:.2g} apart"
    if gap <= diff:
        return (f"  at step {step} HF's top two logits were {apart}, within the {diff:.2g} (in logit units) by which the two "
                f"decoders' logits differ after the prompt (each rounds differently): a near tie that rounding can "
                f"flip, after which the two texts go their own ways")
    return (f"  at step {step} HF's top two logits were {apart}, more than the {diff:.2g} by which the two "
            f"decoders' logits differ after the prompt: a difference beyond rounding, worth a look")


def _hf_generate(model, x: torch.Tensor, n: int, hook) -> torch.Tensor:
    """HF greedy generate of exactly n tokens (end-of-sequence suppressed), with an optional per-step hook."""
    from transformers import LogitsProcessorList
    procs = LogitsProcessorList([hook]) if hook is not None else None
    with torch.no_grad():
        return model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                              min_new_tokens=n, logits_processor=procs, pad_token_id=0)


# ------------------------------------------------------------------------------------------------------ serving

SERVE_WORKLOAD = dict(prompt_median=48, output_median=32, sigma=0.6)   # book.serve.workload's lognormal lengths
SERVE_BLOCK = 16                                                       # KV positions per block, book and HF


@dataclass(frozen=True)
class ServeRun:
    """One server in one phase of `bench_serve`: throughput, TTFT and TPOT P50/P95/P99 in ms, the scheduler's share
    of step time (None where the server does not log it), and how many requests got the reference tokens
    (chapter 04)."""

    phase: str                         # "a" (all at once) or "b" (Poisson arrivals)
    server: str
    tokens_per_s: float
    ttft_ms: tuple[float, float, float]
    tpot_ms: tuple[float, float, float]
    schedule_share: float | None
    mean_batch: float | None
    wall_s: float
    tokens_equal: int                  # requests whose greedy tokens equal book continuous (paged)'s in this phase


@dataclass(frozen=True)
class ServeResult:
    """What `bench_serve` measured: the workload, every run of both phases, and the ratios of its SUMMARY line
    (chapter 04)."""

    device: str
    model: str
    dtype: str
    requests: int
    max_batch: int
    mean_prompt: float
    mean_output: float
    capacity: float                    # requests/s: book continuous (paged) tokens/s in phase (a) / mean output
    rate: float                        # phase (b)'s Poisson arrival rate, requests/s
    rate_measured: bool                # True: load_factor x capacity; False: given
    runs: tuple[ServeRun, ...]
    paged_over_hf: tuple[float, float]         # book continuous (paged) / HF continuous tokens/s in (a) and (b)
    continuous_over_static: tuple[float, float]  # book continuous (paged) / book static tokens/s in (a) and (b)
    ttft_p95_static_over_continuous: float     # phase (b): book static TTFT P95 / book continuous (paged)'s

    def run(self, phase: str, server: str) -> ServeRun:
        """The run of `server` (its name as printed) in phase "a" or "b" (chapter 04)."""
        for r in self.runs:
            if r.phase == phase and r.server == server:
                return r
        raise KeyError(f"no run of {server!r} in phase {phase!r}")


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def _spread(xs: Sequence[int]) -> str:
    """P5/P50/P95 and the mean of a list of lengths."""
    from .decode import percentile
    return (f"P5/P50/P95 {percentile(xs, 5):.0f}/{percentile(xs, 50):.0f}/{percentile(xs, 95):.0f}, "
            f"mean {statistics.fmean(xs):.1f}")


def _serve_run(phase: str, rep, reference: Sequence[Sequence[int]]) -> ServeRun:
    p = rep.percentiles()
    return ServeRun(phase=phase, server=rep.name, tokens_per_s=rep.throughput,
                    ttft_ms=tuple(p["ttft"].get(q, float("nan")) * 1e3 for q in (50, 95, 99)),
                    tpot_ms=tuple(p["tpot"].get(q, float("nan")) * 1e3 for q in (50, 95, 99)),
                    schedule_share=None if math.isnan(rep.schedule_share) else rep.schedule_share,
                    mean_batch=None if math.isnan(rep.mean_batch) else rep.mean_batch, wall_s=rep.wall,
                    tokens_equal=sum(s.tokens == list(w) for s, w in zip(rep.served, reference)))


def _serve_table(runs: Sequence[ServeRun], n: int) -> list[str]:
    width = max(len(r.server) for r in runs)
    lines = [f"  {'server':<{width}} {'tokens/s':>9} {'TTFT p50/p95/p99 ms':>20} {'TPOT p50/p95/p99 ms':>20} "
             f"{'sched/step':>10} {'mean batch':>10} {'wall s':>7} {'tokens ok':>9}"]
    for r in runs:
        sched = "n/a" if r.schedule_share is None else f"{r.schedule_share:.1%}"
        batch = "n/a" if r.mean_batch is None else f"{r.mean_batch:.1f}"
        lines.append(f"  {r.server:<{width}} {r.tokens_per_s:>9,.0f} {'/'.join(f'{x:.0f}' for x in r.ttft_ms):>20} "
                     f"{'/'.join(f'{x:.1f}' for x in r.tpot_ms):>20} {sched:>10} {batch:>10} {r.wall_s:>7.2f} "
                     f"{f'{r.tokens_equal}/{n}':>9}")
    return lines


def bench_serve(model_path: str | None = None, *, requests: int = 48, rate: float | None = None, max_batch: int = 8,
                seed: int = 0, device: str | None = None, dtype: str = "fp32", load_factor: float = 0.75,
                out: Callable[[str], None] = print) -> ServeResult:
    """Serve one workload with book static batching, book continuous batching (slot and paged cache), HF continuous
    batching and HF padded static `generate`: (a) all requests at once, (b) Poisson arrivals at `rate` (default:
    load_factor x the capacity book continuous (paged) showed in (a)); print throughput, TTFT/TPOT percentiles and
    the ratios, last a SUMMARY line (chapter 04)."""
    import gc
    from pathlib import Path

    import transformers

    from .models import load
    from .peers import hf_continuous, hf_continuous_unavailable, hf_static
    from .serve import Engine, run_static, workload

    for name, v in (("requests", requests), ("max_batch", max_batch)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a positive number of requests per second, got {rate}")
    if not (load_factor > 0 and math.isfinite(load_factor)):
        raise ValueError(f"load_factor must be > 0, got {load_factor}")
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_NAMES)}")
    why = hf_continuous_unavailable()
    if why:
        raise RuntimeError(f"the serving benchmark compares with Hugging Face's continuous batching: {why}")
    dev = as_device(device)

    out(f"serving benchmark: book static and continuous batching vs Hugging Face continuous batching and padded "
        f"static generate; greedy, at most {max_batch} requests per step")
    out(f"device: {dev.type} - {device_name(dev)}; torch {torch.__version__}, transformers {transformers.__version__}")
    t0 = time.perf_counter()
    hf = load(model_path or "coder", dtype=dtype, device=dev)
    book = Llama.from_hf(hf)
    a = book.arch
    short = "coder" if model_path is None else Path(model_path).name
    out(f"model: {short} ({a.n_layers} layers, hidden {a.hidden}, vocab {a.vocab:,}, context {a.max_context}; "
        f"{a.n_params() / 1e6:,.1f}M parameters), {dtype}; loaded in {time.perf_counter() - t0:.1f} s")
    out(_kernel_choice(dev, dtype))

    reqs = workload(requests, vocab=a.vocab, max_len=a.max_context, seed=seed, **SERVE_WORKLOAD)
    prompts, outputs = [len(r.prompt) for r in reqs], [r.max_new_tokens for r in reqs]
    out(f"workload: {requests} requests of random token ids (seed {seed}); lengths lognormal, sigma "
        f"{SERVE_WORKLOAD['sigma']} (book.serve.workload): prompt median {SERVE_WORKLOAD['prompt_median']} -> "
        f"{_spread(prompts)}; output median {SERVE_WORKLOAD['output_median']} -> {_spread(outputs)} tokens; "
        f"{sum(outputs):,} tokens to generate; every request runs to its length (no end-of-sequence)")
    max_len = max(p + o for p, o in zip(prompts, outputs))
    blocks = max_batch * math.ceil(max_len / SERVE_BLOCK)
    kv = blocks * SERVE_BLOCK
    out(f"servers: static ones fill a batch of {max_batch} (or wait 50 ms); continuous ones run up to {max_batch} "
        f"requests per step and hold the KV of {kv:,} positions ({max_batch} x the longest request, {max_len} "
        f"tokens): slot cache {max_batch} slots, paged (book and HF) {blocks} blocks of {SERVE_BLOCK}; "
        f"whole prompts are prefilled in one step")

    slot = Engine(book, cache="slot", kv_tokens=kv, max_len=max_len, max_batch=max_batch)
    paged = Engine(book, cache="paged", kv_tokens=kv, max_len=max_len, max_batch=max_batch, block_size=SERVE_BLOCK)
    servers = [
        (f"book static (batch {max_batch})", lambda rs: run_static(book, rs, batch=max_batch)),
        ("book continuous (slot cache)", slot.run),
        ("book continuous (paged cache)", paged.run),
        ("HF continuous (paged)", lambda rs: hf_continuous(hf, rs, max_batch=max_batch, page_size=SERVE_BLOCK,
                                                            num_blocks=blocks)),
        (f"HF static (batch {max_batch}, padded)", lambda rs: hf_static(hf, rs, batch=max_batch)),
    ]
    static_name, paged_name, hf_name = servers[0][0], servers[2][0], servers[3][0]

    t0 = time.perf_counter()
    warm = [replace(r, arrival=0.0) for r in reqs[:min(4, requests)]]
    for _, serve in servers:
        serve(warm).check()
    out(f"warm-up: every server once on {len(warm)} requests ({time.perf_counter() - t0:.1f} s)")

    def phase(label: str, rs) -> dict[str, ServeRun]:
        reports = {}
        for name, serve in servers:
            gc.collect()
            rep = serve(rs)
            rep.check()
            rep.name = name
            reports[name] = rep
        reference = [s.tokens for s in reports[paged_name].served]
        runs = {name: _serve_run(label, rep, reference) for name, rep in reports.items()}
        for line in _serve_table(list(runs.values()), len(rs)):
            out(line)
        return runs

    out(f"phase (a): all {requests} requests at t = 0 (offline throughput)")
    ra = phase("a", reqs)
    mean_out = statistics.fmean(outputs)
    capacity = ra[paged_name].tokens_per_s / mean_out
    measured = rate is None
    rate = load_factor * capacity if measured else float(rate)
    out(f"(a) book continuous (paged) / HF continuous tokens/s: "
        f"{_ratio(ra[paged_name].tokens_per_s, ra[hf_name].tokens_per_s):.2f}x; book continuous (paged) / book "
        f"static: {_ratio(ra[paged_name].tokens_per_s, ra[static_name].tokens_per_s):.2f}x; capacity of book "
        f"continuous (paged): {ra[paged_name].tokens_per_s:,.0f} tokens/s / {mean_out:.1f} mean output tokens = "
        f"{capacity:.2f} requests/s")

    reqs_b = workload(requests, vocab=a.vocab, max_len=a.max_context, seed=seed, rate=rate, **SERVE_WORKLOAD)
    assert [r.prompt for r in reqs_b] == [r.prompt for r in reqs], "phase (b) must serve the same requests"
    how = f"{load_factor:g} x" if measured else f"given; {_ratio(rate, capacity):.2f} x"
    out(f"phase (b): the same requests arriving as a Poisson process at {rate:.2f} requests/s ({how} the capacity "
        f"measured in (a)); the last arrives at {reqs_b[-1].arrival:.2f} s")
    rb = phase("b", reqs_b)
    paged_hf = (_ratio(ra[paged_name].tokens_per_s, ra[hf_name].tokens_per_s),
                _ratio(rb[paged_name].tokens_per_s, rb[hf_name].tokens_per_s))
    cont_static = (_ratio(ra[paged_name].tokens_per_s, ra[static_name].tokens_per_s),
                   _ratio(rb[paged_name].tokens_per_s, rb[static_name].tokens_per_s))
    ttft_ratio = _ratio(rb[static_name].ttft_ms[1], rb[paged_name].ttft_ms[1])
    out(f"(b) book continuous (paged) / HF continuous tokens/s: {paged_hf[1]:.2f}x; book continuous (paged) / book "
        f"static tokens/s: {cont_static[1]:.2f}x; TTFT P95 book static / book continuous (paged): {ttft_ratio:.2f}x")
    runs = tuple(ra.values()) + tuple(rb.values())
    equal = sum(r.tokens_equal for r in runs)
    out(f"check: greedy tokens equal to book continuous (paged)'s for {equal} of {len(runs) * requests} "
        f"(request, run) pairs; sched/step = host time scheduling / step time (n/a: not logged; static batching has "
        f"no per-step scheduler, HF logs no steps)")
    out(f"SUMMARY device={dev.type} dtype={dtype} model={short} requests={requests} max_batch={max_batch} "
        f"rate={rate:.2f}/s({'measured' if measured else 'given'}) book_paged/HF_cb(a)={paged_hf[0]:.2f}x "
        f"book_paged/HF_cb(b)={paged_hf[1]:.2f}x book_cont/book_static(b)={cont_static[1]:.2f}x "
        f"ttft_p95_static/cont(b)={ttft_ratio:.2f}x tokens_equal={equal}/{len(runs) * requests}")
    return ServeResult(device=device_name(dev), model=short, dtype=dtype, requests=requests, max_batch=max_batch,
                       mean_prompt=statistics.fmean(prompts), mean_output=mean_out, capacity=capacity, rate=rate,
                       rate_measured=measured, runs=runs, paged_over_hf=paged_hf, continuous_over_static=cont_static,
                       ttft_p95_static_over_continuous=ttft_ratio)


def held_out_prompts(tokenizer, n: int = 8, length: int = 64) -> list[list[int]]:
    """n prompts of `length` tokens from the book's validation files (code the models never trained on), spread
    evenly over them (chapter 05)."""
    from .speculative import windows
    from .train import encode, load_corpus
    val = encode(tokenizer, list(load_corpus().val.values()))
    w = windows(val, length)
    step = max(1, len(w) // n)
    return [r.tolist() for r in w[::step][:n]]


@dataclass(frozen=True)
class SpecResult:
    """What `bench_speculative` measured (chapter 05)."""
    device: str
    dtype: str
    alpha: float
    c: float
    plain_tokens_per_s: float
    gammas: tuple[int, ...]
    measured: tuple[float, ...]
    predicted: tuple[float, ...]
    predicted_isolated: tuple[float, ...]
    lookup: tuple[float, ...]
    identical: int
    hf_plain_tokens_per_s: float
    hf_assisted_tokens_per_s: float
    book_over_hf: float
    hf_sampling: dict | None = None       # peers.hf_sampling_test at one position, without the raw tensors


def bench_speculative(*, prompts: int = 8, new_tokens: int = 128, gammas: Sequence[int] = (1, 2, 3, 4, 6, 8),
                      device: str | None = None, dtype: str = "fp32", hf: bool = True, sampling_eps: float = 0.1,
                      out: Callable[[str], None] = print) -> SpecResult:
    """Greedy speculative decoding of held-out prompts with `coder` as target: the draft `coder-draft` and prompt
    lookup at each gamma, against plain decoding and against the formula from measured alpha and c; then Hugging
    Face assisted generation on the same pair, and (sampling_eps > 0) the exactness of its sampling, tested like the
    book's own rule at one position (`peers.hf_sampling_test`); last a SUMMARY line (chapter 05)."""
    import transformers

    from .models import load, load_tokenizer
    from .peers import hf_assisted
    from .speculative import (ModelDraft, PromptLookup, acceptance_rates, expected_tokens, predicted_speedup,
                              compare, step_costs)

    gammas = tuple(gammas)
    if not gammas or any(not isinstance(g, int) or g < 1 for g in gammas):
        raise ValueError(f"gammas must be integers >= 1, got {gammas}")
    for name, v in (("prompts", prompts), ("new_tokens", new_tokens)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_NAMES)}")
    if not 0 <= sampling_eps < 1:
        raise ValueError(f"sampling_eps must be in [0, 1) (0 skips the sampling test), got {sampling_eps}")
    dev = as_device(device)
    out("speculative decoding benchmark: target coder, draft coder-draft and prompt lookup; greedy")
    out(f"device: {dev.type} - {device_name(dev)}; torch {torch.__version__}, transformers {transformers.__version__}")
    hf_t, hf_d = load("coder", dtype=dtype, device=dev), load("coder-draft", dtype=dtype, device=dev)
    target, draft = Llama.from_hf(hf_t), Llama.from_hf(hf_d)
    tok = load_tokenizer("coder")
    ps = held_out_prompts(tok, prompts)
    if len(ps[0]) + new_tokens > target.arch.max_context:
        raise ValueError(f"64 prompt tokens plus {new_tokens} new ones exceed coder's context "
                         f"({target.arch.max_context})")
    out(f"workload: {len(ps)} held-out prompts of {len(ps[0])} tokens, {new_tokens} new tokens each, {dtype}")
    out(_kernel_choice(dev, dtype))

    drafts = {"coder-draft": ModelDraft(draft), "lookup": PromptLookup(3)}
    compare(target, drafts, ps[:1], 16, gammas[:2])                     # warm-up
    cmp = compare(target, drafts, ps, new_tokens, gammas)
    ref = cmp.reference
    plain_tps = len(ps) * new_tokens / cmp.plain_seconds
    own = torch.tensor([p + r for p, r in zip(ps, ref)], device=dev)
    alpha = acceptance_rates(target, draft, own, skip=len(ps[0]))["greedy"]
    mid = ps[0] + ref[0][:new_tokens // 2]
    costs = step_costs(target, draft, mid, ks=tuple(sorted({g + 1 for g in gammas} | {1})))
    out(f"plain decoding (book): {plain_tps:,.1f} tokens/s, {cmp.step_s * 1e3:.2f} ms a token; greedy alpha "
        f"(teacher-forced on the target's own outputs) {alpha:.3f}")
    out(f"costs of isolated steps at context {costs.context}: target step {costs.target_step * 1e3:.2f} ms, draft "
        f"step {costs.draft_step * 1e3:.2f} ms, c = {costs.c:.3f}; target pass over k tokens / step: "
        + ", ".join(f"k={k}: {costs.v(k):.2f}" for k in sorted(costs.verify)))
    pts, look = cmp.points["coder-draft"], cmp.points["lookup"]
    out(f"{'gamma':>5} {'alpha':>6} {'tok/pass':>8} {'E[tok/pass]':>11} {'c run':>6} {'v run':>6} {'speedup':>8} "
        f"{'formula':>8} {'ratio':>6} {'isolated':>8} {'same':>5} | {'lookup':>7} {'alpha':>6} {'same':>5}")
    measured, predicted, pred_iso = [], [], []
    for p, q in zip(pts, look):
        m = cmp.speedup("coder-draft", p.gamma)
        c_run, v_run = p.draft_call_s / cmp.step_s, p.verify_s / cmp.step_s
        f = predicted_speedup(alpha, p.gamma, c_run, v_run)
        fi = predicted_speedup(alpha, p.gamma, costs.c, costs.v(p.gamma + 1))
        measured.append(m), predicted.append(f), pred_iso.append(fi)
        out(f"{p.gamma:5d} {p.alpha:6.3f} {p.tokens_per_call:8.2f} {expected_tokens(alpha, p.gamma):11.2f} "
            f"{c_run:6.3f} {v_run:6.2f} {m:7.2f}x {f:7.2f}x {m / f:6.2f} {fi:7.2f}x {p.identical:2d}/{len(ps)} | "
            f"{cmp.speedup('lookup', q.gamma):6.2f}x {q.alpha:6.3f} {q.identical:2d}/{len(ps)}")
    out("speedup = plain seconds / speculative seconds, prompt by prompt; formula = E[tok/pass] / (gamma c + v) with "
        "c and v measured inside the runs (per draft call and per verification pass, over plain seconds per token); "
        "isolated: c and v from single steps timed apart")
    identical = sum(p.identical for p in pts) + sum(q.identical for q in look)
    t_plain = cmp.plain_seconds
    best = max(range(len(gammas)), key=lambda i: measured[i])
    g_best = gammas[best]
    hf_plain = hf_ass = hf_look = None
    if hf:
        hf_assisted(hf_t, ps[:1], 8)                          # warm-up
        hf_plain = hf_assisted(hf_t, ps, new_tokens)
        hf_ass = hf_assisted(hf_t, ps, new_tokens, assistant=hf_d, gamma=g_best)
        hf_def = hf_assisted(hf_t, ps, new_tokens, assistant=hf_d)
        hf_look = hf_assisted(hf_t, ps, new_tokens, lookup=gammas[max(range(len(gammas)),
                                                                       key=lambda i: t_plain / look[i].seconds)])
        for r in (hf_plain, hf_ass, hf_def, hf_look):
            same = sum(a == b for a, b in zip(r.tokens, ref))
            out(f"{r.name:>34}: {r.tokens_per_s:8,.1f} tokens/s, {r.tokens_per_s / hf_plain.tokens_per_s:.2f}x HF "
                f"plain; output equal to the book's plain greedy for {same}/{len(ps)}")
    book_spec = len(ps) * new_tokens / pts[best].seconds
    ratio = book_spec / hf_ass.tokens_per_s if hf_ass else math.nan
    out(f"book speculative (gamma {g_best}): {book_spec:,.1f} tokens/s"
        + (f"; book / HF assisted at the same gamma: {ratio:.2f}x" if hf_ass else ""))
    sampled, verdict = None, "skipped"
    if hf and sampling_eps > 0:
        sampled = _hf_sampling(hf_t, hf_d, ps[0] + ref[0], len(ps[0]), sampling_eps, out)
        verdict = "pass" if sampled["test"]["passed"] else "FAIL"
    worst = max(abs(m / f - 1) for m, f in zip(measured, predicted))
    out(f"SUMMARY device={dev.type} dtype={dtype} alpha={alpha:.3f} c={costs.c:.3f} best_gamma={g_best} "
        f"speedup={measured[best]:.2f}x formula={predicted[best]:.2f}x worst_gap={worst:.0%} "
        f"lookup_best={max(t_plain / q.seconds for q in look):.2f}x book/HF_assisted={ratio:.2f}x "
        f"identical={identical}/{2 * len(ps) * len(gammas)} HF_sampling={verdict}")
    return SpecResult(device_name(dev), dtype, alpha, costs.c, plain_tps, gammas, tuple(measured), tuple(predicted),
                      tuple(pred_iso), tuple(t_plain / q.seconds for q in look), identical,
                      hf_plain.tokens_per_s if hf_plain else math.nan, hf_ass.tokens_per_s if hf_ass else math.nan,
                      ratio, None if sampled is None else {k: v for k, v in sampled.items() if k not in ("p", "q")})


def _hf_sampling(hf_t, hf_d, text: list[int], start: int, eps: float, out: Callable[[str], None]) -> dict:
    """The exactness test of HF assisted sampling at the position of `text` (after `start`) where the broken rules
    would land farthest from p, so the test could catch them there (chapter 05)."""
    from .peers import hf_sampling_test
    from .speculative import logits_of, output_distribution, tv_distance
    x = torch.tensor([text], device=hf_t.device)
    with torch.no_grad():
        p = torch.softmax(logits_of(hf_t, x)[0].double(), -1)
        q = torch.softmax(logits_of(hf_d, x.to(hf_d.device))[0].double(), -1).to(p.device)
    power = [min(tv_distance(output_distribution(p[i], q[i], **kw), p[i])
                 for kw in (dict(residual=False), dict(ratio=False))) for i in range(start, len(text))]
    pos = start + max(range(len(power)), key=power.__getitem__)
    r = hf_sampling_test(hf_t, hf_d, text[:pos + 1], eps=eps)
    t = r["test"]
    out(f"HF assisted sampling (T=1, one drafted token) at position {pos + 1}: {t['samples']:,} samples in "
        f"{r['seconds']:.0f} s, its speculative-sampling step ran {r['speculative_calls']:,} times; TV(p, q) = "
        f"{r['tv_pq']:.3f}; TV(output, p) = {t['tv']:.4f} over {t['categories']} outcomes, threshold "
        f"{t['threshold']:.3f}: {'pass' if t['passed'] else 'FAIL'} (any rule {eps} or more from p fails with "
        f"probability >= 0.999); "
        f"the broken rules would be " + ", ".join(f"{k} {v:.3f}" for k, v in r["broken_tv"].items()) + " from p")
    return r


def main(argv: list[str] | None = None) -> int:
    """Command line: `python -m book.bench decode|serve|speculative [options]`; see --help (chapters 02, 04, 05)."""
    p = argparse.ArgumentParser(prog="python -m book.bench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decode", help="book decoder vs HF generate: bytes per step, bandwidth, MBU",
                       description="Greedy decoding of a random-weight model of a real shape, with the book's decoder "
                                   "and with Hugging Face generate, timed step by step. Defaults: on CPU the "
                                   "Llama-2-7B shape with 4 of its 32 layers (1.9 GB read per step in bf16); on CUDA "
                                   "the full Llama-2-7B with the compiled (CUDA-graph) decode step; in the precision "
                                   "whose one-row products stream the most weights per second on this device.")
    d.add_argument("--model", default="Llama-2-7B", help="catalog architecture (default Llama-2-7B)")
    d.add_argument("--layers", type=int, default=None, help="number of layers (default: 4 on CPU, all on GPU)")
    d.add_argument("--dtype", choices=list(DTYPE_NAMES), default=None,
                   help="weights (default: the most weights per second through one-row "
                   "products here, measured; bf16 unless another streams 1.25x as many)")
    d.add_argument("--batch", type=int, default=1, help="sequences decoded together (default 1)")
    d.add_argument("--prompt", type=int, default=64, help="prompt tokens per sequence (default 64)")
    d.add_argument("--steps", type=int, default=None, help="timed decode steps (default 32 CPU, 64 GPU)")
    d.add_argument("--device", default=None, help="cpu or cuda (default: the book's device, $BOOK_DEVICE)")
    d.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                   help="torch.compile the decode step (with CUDA graphs on a GPU); auto: time both, keep the faster")
    d.add_argument("--no-hf", action="store_true", help="skip the Hugging Face baseline")
    d.add_argument("--bw-bytes", type=int, default=None, help="bytes of each read-bandwidth sample "
                   "(default: the book's bandwidth test size, 4x the last-level cache)")
    d.add_argument("--seed", type=int, default=0)
    for flag, dest in [("--hidden", "hidden"), ("--heads", "n_heads"), ("--kv-heads", "n_kv_heads"),
                       ("--head-dim", "head_dim"), ("--intermediate", "intermediate"), ("--vocab", "vocab")]:
        d.add_argument(flag, dest=dest, type=int, default=None, help=f"override the model's {dest} (smaller models)")
    v = sub.add_parser("serve", help="book static/continuous batching vs HF continuous/static: tokens/s, TTFT, TPOT",
                       description="One workload (lognormal prompt and output lengths) served by the book's static "
                                   "and continuous-batching engines (slot and paged cache) and by Hugging Face's "
                                   "continuous batching and padded static generate, on the book's coder model: "
                                   "(a) all requests at once, (b) Poisson arrivals.")
    v.add_argument("--requests", type=int, default=48, help="requests in the workload (default 48)")
    v.add_argument("--rate", type=float, default=None, help="phase (b) arrivals per second (default: 0.75 x the "
                   "capacity of book continuous (paged) measured in phase (a))")
    v.add_argument("--max-batch", type=int, default=8, help="most requests per batch or step (default 8)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--device", default=None, help="cpu or cuda (default: the book's device, $BOOK_DEVICE)")
    v.add_argument("--dtype", choices=list(DTYPE_NAMES), default="fp32", help="weights (default fp32)")
    v.add_argument("--model-path", default=None, help="a folder holding a transformers Llama (default: the book's "
                   "coder model)")
    sp = sub.add_parser("speculative", help="speculative decoding with the book's pair: alpha, c, speedup per gamma "
                        "against the formula, and HF assisted generation",
                        description="Greedy speculative decoding of held-out prompts (coder as target; coder-draft "
                                    "and prompt lookup as drafts) at each gamma, against plain decoding, against the "
                                    "formula from measured alpha and c, and against Hugging Face assisted generation.")
    sp.add_argument("--prompts", type=int, default=8, help="held-out prompts (default 8)")
    sp.add_argument("--new-tokens", type=int, default=128, help="new tokens per prompt (default 128)")
    sp.add_argument("--gammas", default="1,2,3,4,6,8", help="draft lengths, comma-separated (default 1,2,3,4,6,8)")
    sp.add_argument("--device", default=None, help="cpu or cuda (default: the book's device, $BOOK_DEVICE)")
    sp.add_argument("--dtype", choices=list(DTYPE_NAMES), default="fp32", help="weights (default fp32)")
    sp.add_argument("--no-hf", action="store_true", help="skip Hugging Face assisted generation")
    sp.add_argument("--sampling-eps", type=float, default=0.1, help="the distance from p the HF sampling exactness "
                    "test must detect (default 0.1; smaller needs more samples; 0 skips it)")
    a = p.parse_args(argv)
    if a.command == "speculative":
        try:
            gammas = tuple(int(g) for g in a.gammas.split(","))
        except ValueError:
            p.error(f"--gammas takes integers separated by commas, got {a.gammas!r}")
        bench_speculative(prompts=a.prompts, new_tokens=a.new_tokens, gammas=gammas, device=a.device, dtype=a.dtype,
                          hf=not a.no_hf, sampling_eps=a.sampling_eps)
        return 0
    if a.command == "serve":
        from .peers import hf_continuous_unavailable
        why = hf_continuous_unavailable()
        if why:
            p.exit(2, f"python -m book.bench serve compares with Hugging Face's continuous batching: {why}\n")
        bench_serve(a.model_path, requests=a.requests, rate=a.rate, max_batch=a.max_batch, seed=a.seed,
                    device=a.device, dtype=a.dtype)
        return 0
    bench_decode(a.model, layers=a.layers, dtype=a.dtype, batch=a.batch, prompt=a.prompt, steps=a.steps,
                 device=a.device, compile=a.compile, hf=not a.no_hf, bw_bytes=a.bw_bytes, seed=a.seed,
                 hidden=a.hidden, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim,
                 intermediate=a.intermediate, vocab=a.vocab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
