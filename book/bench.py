"""Benchmarks from the command line: `python -m book.bench decode` times the book's decoder against Hugging Face
`generate` on the same weights and reports bytes per step, bandwidth and MBU (chapter 02)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from .device import as_device, device_name, last_level_cache_bytes, synchronize
from . import kernels
from .hardware import GB, _random_tensor, measured_ceilings, random_tensor
from .llama import Llama
from .models import Architecture, architecture, build_random
from .timing import Timing, format_seconds, time_fn

__all__ = ["DecodeResult", "bench_decode", "main"]

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
    dtype = dtype or "bf16"
    if dtype not in DTYPE_NAMES:
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
    t0 = time.perf_counter()
    ref = build_random(arch, dtype=dtype, device=dev, seed=seed)
    book = Llama.from_hf(ref)
    if not hf:
        del ref
    n_params = arch.n_params()
    out(f"model: {what} (random weights), {dtype}: {_gb(n_params * book.embed.element_size())} of weights "
        f"({n_params / 1e6:,.0f}M parameters); built in {time.perf_counter() - t0:.0f} s")

    c = measured_ceilings(dev)
    if dtype not in c.matvec:
        raise ValueError(f"{dtype} is only a slow fallback on {c.device} (not clearly faster than fp32); use --dtype "
                         f"{c.fastest(('bf16', 'fp32'))}")
    read_bw, copy_bw, matvec_bw, mv_path = c.read_bw, c.copy_bw, c.matvec_bw(dtype), c.matvec_path(dtype)
    tested = bw_bytes or c.bytes_tested
    out(f"ceilings (measured once, {c.bytes_tested / 2**20:,.0f} MiB): read {read_bw / GB:.1f} GB/s "
        f"(+-{c.spread('read') / 2:.0%}), copy {copy_bw / GB:.1f} GB/s; matrix-vector ceiling {dtype} "
        f"{matvec_bw / GB:.1f} GB/s")
    out(f"one row of {dtype}: {kernels.describe(dev, DTYPE_NAMES[dtype], c.matvec[dtype])}")
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
    path = f"eager PyTorch, one row via {mv_path}"
    if use_compile is not False:
        eager_ms = _step_ms(book, x, dev, min(6, steps))
        book.compile_decode()
        book.generate(x, steps + 2)                       # compiles every shape the timed steps use
        compiled_ms = _step_ms(book, x, dev, min(6, steps)) if book._compiled is not None else float("inf")
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
                          / time_fn(lambda: kernels.matvec(w_mv, x_mv, mv_path), device=dev, warmup=0,
                                    repeats=1).median)

    def hook(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        synchronize(dev)
        now = time.perf_counter()
        if state["last"] is not None:
            hf_times.append(now - state["last"])
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
        f"ceiling' uses the matrix-vector sample alone")

    def line(name: str, t: Timing, mbu: float, mbu_mv: float) -> str:
        return (f"{name}: median {format_seconds(t.median)}, IQR {format_seconds(t.iqr)} (spread {t.spread:.1%}), "
                f"{batch / t.median:.2f} tokens/s, {nbytes / t.median / GB:.1f} GB/s, MBU {mbu:.2f}, "
                f"{mbu_mv:.2f} of the matrix-vector ceiling; time beyond its bytes at the sampled read bandwidth "
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
            err = ((book.prefill(x).float() - want).abs().max() / want.abs().max()).item()
        got = torch.stack(book_tokens, 1)[:, :hf_tokens.shape[1]]
        agree = (got == hf_tokens).all(0).long()
        same = int(agree.cumprod(0).sum())
        out(f"check: last prefill logits |book - HF| / max|HF| = {err:.1e}; greedy tokens equal for the first "
            f"{same} of {got.shape[1]} steps")
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
                        mbu_hf=mbu_hf, speedup=speedup, logits_rel_err=err, tokens_equal=same)


def _step_ms(model: Llama, x: torch.Tensor, dev: torch.device, n: int = 6) -> float:
    """Median ms of `n` decode steps after a prefill (for choosing between eager and compiled)."""
    tok = model.prefill(x).argmax(-1)
    ts = []
    for _ in range(n):
        synchronize(dev)
        t = time.perf_counter()
        tok = model.decode_step(tok).argmax(-1)
        synchronize(dev)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def _gb(n: float) -> str:
    return f"{n / GB:.3f} GB" if n >= 1e8 else f"{n / 2**20:.2f} MiB"


def _hf_generate(model, x: torch.Tensor, n: int, hook) -> torch.Tensor:
    """HF greedy generate of exactly n tokens (end-of-sequence suppressed), with an optional per-step hook."""
    from transformers import LogitsProcessorList
    procs = LogitsProcessorList([hook]) if hook is not None else None
    with torch.no_grad():
        return model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                              min_new_tokens=n, logits_processor=procs, pad_token_id=0)


def main(argv: list[str] | None = None) -> int:
    """Command line: `python -m book.bench decode [options]`; see --help (chapter 02)."""
    p = argparse.ArgumentParser(prog="python -m book.bench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decode", help="book decoder vs HF generate: bytes per step, bandwidth, MBU",
                       description="Greedy decoding of a random-weight model of a real shape, with the book's decoder "
                                   "and with Hugging Face generate, timed step by step. Defaults: on CPU the "
                                   "Llama-2-7B shape with 4 of its 32 layers in bf16 (1.9 GB read per step); on CUDA "
                                   "the full Llama-2-7B in bf16 with the compiled (CUDA-graph) decode step.")
    d.add_argument("--model", default="Llama-2-7B", help="catalog architecture (default Llama-2-7B)")
    d.add_argument("--layers", type=int, default=None, help="number of layers (default: 4 on CPU, all on GPU)")
    d.add_argument("--dtype", choices=list(DTYPE_NAMES), default=None, help="weights (default bf16)")
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
    a = p.parse_args(argv)
    bench_decode(a.model, layers=a.layers, dtype=a.dtype, batch=a.batch, prompt=a.prompt, steps=a.steps,
                 device=a.device, compile=a.compile, hf=not a.no_hf, bw_bytes=a.bw_bytes, seed=a.seed,
                 hidden=a.hidden, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim,
                 intermediate=a.intermediate, vocab=a.vocab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
