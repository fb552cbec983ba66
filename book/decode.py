"""Serial decoding measured: streamed generation with per-token timestamps, TTFT/TPOT/E2E, percentiles, SLOs,
and generation without a KV cache (chapter 01)."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from .device import synchronize

__all__ = ["Token", "stream", "Latency", "percentile", "summarize", "SLO", "CHAT_SLO", "generate_no_cache",
           "teacher_forced", "serial_steps", "median_gap",
           "time_prefill", "time_decode_step", "time_prefills", "time_decode_steps", "kv_cache_nbytes"]


@dataclass(frozen=True)
class Token:
    """One generated token and when it was ready, in seconds since the request started (chapter 01)."""
    id: int
    text: str
    t: float


def stream(model, prompt: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
           decode: Callable[[int], str] | None = None, eos_token_id: int | None = None,
           generator: torch.Generator | None = None, clock: Callable[[], float] = time.perf_counter
           ) -> Iterator[Token]:
    """Generate with the book's decoder (`book.llama.Llama`) one token at a time, yielding each as soon as it
    exists, with the device synchronised so its timestamp is real (chapter 01).

    The first token comes out of the prefill; every later one out of one decode step. `decode` turns a token id
    into text for display; generation stops early at `eos_token_id`.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    prompt = prompt[None] if prompt.dim() == 1 else prompt
    if prompt.shape[0] != 1:
        raise ValueError(f"stream() serves one request at a time; got a batch of {prompt.shape[0]}")
    if prompt.shape[1] < 1:
        raise ValueError("the prompt needs at least one token")
    if max_new_tokens == 0:
        return
    limit = model.arch.max_context
    if prompt.shape[1] + max_new_tokens > limit:
        raise ValueError(f"{model.arch.name} allows {limit} tokens; a prompt of {prompt.shape[1]} plus "
                         f"{max_new_tokens} new tokens is {prompt.shape[1] + max_new_tokens}")
    dev = model.device
    if model.cache is None or model.cache.batch < 1 or model.cache.max_len < prompt.shape[1] + max_new_tokens:
        model.setup_cache(1, prompt.shape[1] + max_new_tokens)

    def pick(logits: torch.Tensor) -> torch.Tensor:
        if temperature <= 0:
            return logits.argmax(-1)
        return torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=generator)[:, 0]

    start = clock()
    tok = pick(model.prefill(prompt.to(dev)))
    for i in range(max_new_tokens):
        synchronize(dev)
        tid = int(tok)
        yield Token(tid, decode(tid) if decode else "", clock() - start)
        if tid == eos_token_id or i == max_new_tokens - 1:
            return
        tok = pick(model.decode_step(tok))


@dataclass(frozen=True)
class Latency:
    """What a user of one request feels: time to first token, time per output token, end to end (chapter 01).

    TTFT: from the request to the first token. TPOT: the mean gap between later tokens, (E2E - TTFT) / (n - 1),
    undefined (None) with fewer than two tokens. E2E: to the last token; with no token at all, TTFT and E2E are
    None too.
    """
    n_tokens: int
    ttft: float | None
    tpot: float | None
    e2e: float | None

    @classmethod
    def from_times(cls, times: Sequence[float]) -> "Latency":
        """From the timestamps of the generated tokens (seconds since the request started)."""
        times = list(times)
        if any(b < a for a, b in zip(times, times[1:])) or any(t < 0 for t in times):
            raise ValueError("token timestamps must be >= 0 and non-decreasing")
        if not times:
            return cls(0, None, None, None)
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        return cls(len(times), times[0], tpot, times[-1])

    @classmethod
    def from_tokens(cls, tokens: Sequence[Token]) -> "Latency":
        return cls.from_times([t.t for t in tokens])

    def predicted_e2e(self) -> float | None:
        """TTFT + (n - 1) x TPOT: equal to the measured E2E by construction of TPOT as a mean."""
        if self.ttft is None:
            return None
        return self.ttft + (self.n_tokens - 1) * (self.tpot or 0.0)


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) with linear interpolation between order statistics (numpy's default)."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        raise ValueError("no values to take a percentile of")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be in 0..100, got {p}")
    pos = (len(vals) - 1) * p / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def summarize(latencies: Sequence[Latency], ps: Sequence[float] = (50, 95, 99)) -> dict[str, dict[float, float]]:
    """P50/P95/P99 (or `ps`) of TTFT, TPOT and E2E over requests; requests without a value are skipped."""
    out: dict[str, dict[float, float]] = {}
    for name in ("ttft", "tpot", "e2e"):
        vals = [getattr(lat, name) for lat in latencies if getattr(lat, name) is not None]
        out[name] = {p: percentile(vals, p) for p in ps} if vals else {}
    return out


@dataclass(frozen=True)
class SLO:
    """A service-level objective on latency percentiles (chapter 01)."""
    name: str
    ttft: float        # seconds
    tpot: float        # seconds
    p: float = 95

    def check(self, latencies: Sequence[Latency]) -> dict[str, tuple[float, float, bool]]:
        """For TTFT and TPOT: (the measured percentile, the bound, whether it is met)."""
        s = summarize(latencies, (self.p,))
        out = {}
        for name, bound in (("ttft", self.ttft), ("tpot", self.tpot)):
            if not s[name]:
                raise ValueError(f"no request has a {name.upper()} to check")
            value = s[name][self.p]
            out[name] = (value, bound, value <= bound)
        return out


# Interactive chat: the first token within half a second feels immediate, and 10 tokens/s (100 ms each) stays
# ahead of reading speed (roughly 4-5 words, 6-7 tokens, per second).
CHAT_SLO = SLO("interactive chat", ttft=0.5, tpot=0.1)


@torch.no_grad()
def generate_no_cache(model, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy generation that recomputes the whole sequence for every new token, with no KV cache: the same
    tokens as the cached loop, at quadratic cost (chapter 01)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    seq = prompt[None] if prompt.dim() == 1 else prompt
    seq = seq.to(model.device)
    new = []
    for _ in range(max_new_tokens):
        nxt = model(seq)[:, -1].argmax(-1)
        new.append(nxt)
        seq = torch.cat([seq, nxt[:, None]], dim=1)
    return torch.stack(new, 1)


def teacher_forced(model, tokens: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A function that runs one parallel forward pass over all of `tokens` (training's view) (chapter 01)."""
    tokens = tokens[None] if tokens.dim() == 1 else tokens
    return lambda: model(tokens)


def serial_steps(model, tokens: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A function that feeds the same tokens one decode step at a time through the KV cache (inference's view):
    N dependent steps instead of one pass (chapter 01)."""
    tokens = tokens[None] if tokens.dim() == 1 else tokens
    n = tokens.shape[1]

    def run() -> torch.Tensor:
        if model.cache is None or model.cache.max_len < n or model.cache.batch < tokens.shape[0]:
            model.setup_cache(tokens.shape[0], n)
        out = model.prefill(tokens[:, :1])
        for i in range(1, n):
            out = model.decode_step(tokens[:, i])
        return out

    return run


def median_gap(times: Sequence[float]) -> float:
    """The median time between consecutive tokens (a robust TPOT) (chapter 01)."""
    gaps = [b - a for a, b in zip(times, times[1:])]
    if not gaps:
        raise ValueError("need at least two timestamps")
    return statistics.median(gaps)


def _is_hf(model) -> bool:
    return hasattr(model, "config") and hasattr(model, "generate")


def _random_tokens(model, batch: int, n: int) -> torch.Tensor:
    vocab = model.config.vocab_size if _is_hf(model) else model.arch.vocab
    dev = _device_of(model)
    g = torch.Generator().manual_seed(n)
    return torch.randint(0, vocab, (batch, n), generator=g).to(dev)


def _prefill_fn(model, prompt_len: int, batch: int) -> Callable[[], Any]:
    """One prefill of a random prompt, as a function to time: the book's decoder (`Llama.prefill`, into a cache at
    least that long) or a transformers model (one forward pass that fills a fresh DynamicCache and keeps only the last
    position's logits, as `generate` does)."""
    x = _random_tokens(model, batch, prompt_len)
    if _is_hf(model):
        from transformers import DynamicCache
        return lambda: model(input_ids=x, past_key_values=DynamicCache(config=model.config),   # noqa: E731
                             use_cache=True, logits_to_keep=1)
    if model.cache is None or model.cache.max_len < prompt_len or model.cache.batch < batch:
        model.setup_cache(batch, prompt_len)
    return lambda: model.prefill(x)                                                              # noqa: E731


def _decode_step_fn(model, context: int, batch: int) -> Callable[[], Any]:
    """One decode step at `context` cached tokens, as a function to time. The book's decoder: a random cache (see
    `book.roofline.measure_decode_step`), set back to `context` before every step (`book.roofline.decode_step_fn`),
    so one cache filled for the longest context serves every shorter one in any order. A transformers model: its own
    DynamicCache filled with `context` random keys and values, as the book's is (a step costs the same whatever the
    cached values, and a real prefill of thousands of tokens would cost a CPU minutes), cropped back to `context`
    before every step."""
    if not _is_hf(model):
        from .roofline import decode_step_fn
        c = model.cache
        if c is None or c.batch < batch or c.max_len <= context or int(c.lengths.min()) < context:
            model.setup_cache(batch, context + 1)
            model.cache.fill_random(batch, context)
        return decode_step_fn(model, context, batch)
    from transformers import DynamicCache
    if context < 1:
        raise ValueError(f"a transformers decode step needs context >= 1, got {context}")
    x = _random_tokens(model, batch, context + 1)
    cfg = model.config
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = DynamicCache(config=cfg)
    p = next(model.parameters())
    g = torch.Generator(device=p.device).manual_seed(0)
    for layer in range(cfg.num_hidden_layers):
        k, v = (torch.randn(batch, kv_heads, context, head_dim, generator=g, device=p.device, dtype=p.dtype)
                for _ in range(2))
        cache.update(k, v, layer)

    def hf_step():
        extra = cache.get_seq_length() - context
        if extra > 0:
            cache.crop(-extra)            # forget the previous step's token
        return model(input_ids=x[:, context:], past_key_values=cache, use_cache=True).logits
    return hf_step


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def time_prefill(model, prompt_len: int, *, batch: int = 1, repeats: int = 5, warmup: int = 1):
    """Time the prefill of a random prompt by the book's decoder or a transformers model (`_prefill_fn`); `warmup`
    untimed runs first (0 once an earlier length has warmed the kernels) (chapter 01)."""
    from .timing import time_fn
    return time_fn(_prefill_fn(model, prompt_len, batch), device=_device_of(model), warmup=warmup,
                   repeats=repeats)


@torch.no_grad()
def time_decode_step(model, context: int, *, batch: int = 1, repeats: int = 7):
    """Time one decode step at `context` cached tokens: the book's decoder (via
    `book.roofline.measure_decode_step`) or a transformers model (`_decode_step_fn`) (chapter 01)."""
    from .timing import time_fn
    if not _is_hf(model):
        from .roofline import measure_decode_step
        return measure_decode_step(model, batch, context, repeats=repeats)
    return time_fn(_decode_step_fn(model, context, batch), device=_device_of(model), warmup=2, repeats=repeats)


def _models_in_turn(models: Mapping[str, Any], sizes: Sequence[int], make, *, rounds: int, warmup: int, batch: int,
                    room: int, read_bytes: int = 0) -> dict[str, Any]:
    from .timing import time_in_turn
    if not models or not sizes:
        raise ValueError("need at least one model and one size")
    if any(int(n) != n or n < 1 for n in sizes):
        raise ValueError(f"sizes must be positive whole numbers of tokens, got {list(sizes)}")
    devs = {_device_of(m) for m in models.values()}
    if len(devs) != 1:
        raise ValueError(f"the models must share one device to be timed in turn, got {sorted(map(str, devs))}")
    for m in models.values():                 # the book's cache, once, for the longest
        if not _is_hf(m):
            m.setup_cache(batch, max(sizes) + room)
            if room:
                m.cache.fill_random(batch, max(sizes))
    dev = devs.pop()
    fns: dict = {(name, n): make(m, n, batch) for name, m in models.items() for n in sizes}
    from .hardware import read_probe
    fns.update(read_probe(read_bytes, dev))
    ts = time_in_turn(fns, device=dev, warmup=warmup, rounds=rounds)
    out: dict[str, Any] = {name: [ts[(name, n)] for n in sizes] for name in models}
    if read_bytes > 0:
        out["read"] = ts["read"]
    return out


@torch.no_grad()
def time_prefills(models: Mapping[str, Any], prompt_lens: Sequence[int], *, batch: int = 1, rounds: int = 3,
                  warmup: int = 1, every_length: bool | None = None) -> dict[str, list]:
    """Prefill of every model (the book's decoder or transformers) at every prompt length, timed in turn, one pass
    of each per round (`book.timing.time_in_turn`), so a machine whose speed drifts slows all of them alike, after
    `warmup` untimed passes of each model: at every length where `every_length` (the default on a GPU, whose first
    pass at a new shape picks kernels and grows its allocator), else at the shortest only (a pass over thousands of
    tokens costs a CPU seconds): one Timing per length, by model name (chapter 01)."""
    if warmup < 0:
        raise ValueError(f"need warmup >= 0, got {warmup}")
    if every_length is None:
        every_length = any(_device_of(m).type == "cuda" for m in models.values())
    if every_length:
        return _models_in_turn(models, prompt_lens, _prefill_fn, rounds=rounds, warmup=warmup, batch=batch,
                               room=0)
    for m in models.values():
        if prompt_lens and min(prompt_lens) >= 1:
            fn = _prefill_fn(m, min(prompt_lens), batch)
            for _ in range(warmup):
                fn()
    return _models_in_turn(models, prompt_lens, _prefill_fn, rounds=rounds, warmup=0, batch=batch, room=0)


@torch.no_grad()
def time_decode_steps(models: Mapping[str, Any], contexts: Sequence[int], *, batch: int = 1, rounds: int = 5,
                      warmup: int = 2, read_bytes: int = 0) -> dict[str, Any]:
    """One decode step of every model at every context, timed in turn, one step of each per round
    (`book.timing.time_in_turn`), so a machine whose speed drifts slows all of them alike: one Timing per context,
    by model name; `read_bytes`: also a `sum` over a tensor of that many bytes in the same rounds, its one Timing
    under "read", the read bandwidth beside the steps (chapter 01)."""
    return _models_in_turn(models, contexts, _decode_step_fn, rounds=rounds, warmup=warmup, batch=batch, room=1,
                           read_bytes=read_bytes)


def kv_cache_nbytes(cache) -> int:
    """Bytes held by the keys and values of a transformers cache (or the book's KVCache, filled part only)."""
    if hasattr(cache, "k") and hasattr(cache, "lengths"):          # book.llama.KVCache
        per_pos = cache.k[:, 0, :, 0].numel() * cache.k.element_size() * 2
        return int(per_pos * int(cache.lengths.sum()))
    total = 0
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            if t is not None and hasattr(t, "numel"):
                total += t.numel() * t.element_size()
    return total


def reference_suite(device=None, quick: bool = False) -> dict:
    """The chapter's recorded results: coder's TTFT and TPOT for one request, and prefill and decode-step times of
    the book's decoder with Llama-2-7B's shapes against the floor, bytes over the measured read bandwidth, in the
    precision measured fastest on the device (fp16 included, for GPUs without bf16); `quick`: 32 tokens, three
    contexts, one layer, fewer repeats (chapter 01)."""
    from .device import as_device
    from .hardware import measured_ceilings
    from .llama import Llama
    from .models import architecture, build_random, dtype_bytes, load
    from .roofline import compiled_decode_ms, decode_step
    dev = as_device(device)
    coder = Llama.from_hf(load("coder", dtype="fp32"), device=dev)
    prompt = torch.randint(0, coder.arch.vocab, (1, 128), generator=torch.Generator().manual_seed(0)).to(dev)
    list(stream(coder, prompt, 8))                                              # warm-up
    lat = Latency.from_tokens(list(stream(coder, prompt, 32 if quick else 128)))
    c = measured_ceilings(dev)
    dtype = c.fastest(("bf16", "fp16", "fp32"))
    arch = architecture("Llama-2-7B")
    if quick or dev.type != "cuda":
        arch = arch.with_layers(1 if quick else 4)
    model = Llama.from_hf(build_random(arch, dtype=dtype, device=dev))
    ctxs = [16, 256, 1024] if quick else [16, 256, 1024, 2048]
    steps = [time_decode_step(model, n, repeats=3 if quick else 7).median for n in ctxs]
    floors = [decode_step(arch, 1, n, dtype).bytes / c.read_bw for n in ctxs]     # decode reads: read bandwidth
    values = {"coder_ttft_ms": lat.ttft * 1e3, "coder_tpot_ms": lat.tpot * 1e3, "layers": arch.n_layers,
              "dtype_bytes": float(dtype_bytes(dtype)), "fp16": float(dtype == "fp16"),
              "read_bw_gbs": c.read_bw / 1e9, "decode_1024_ms": steps[2] * 1e3,
              "decode_1024_floor_ms": floors[2] * 1e3,
              "prefill_256_ms": time_prefill(model, 256, repeats=2 if quick else 5).median * 1e3}
    fast = compiled_decode_ms(model, 1024) if dev.type == "cuda" and not quick else None
    if fast is not None:                                   # the same step with CUDA graphs: no launch overhead
        values["decode_1024_compiled_ms"] = fast
    return {"values": values, "series": {
        "decode_step_ms": {"x": [float(n) for n in ctxs], "y": [t * 1e3 for t in steps],
                           "x_label": "context (tokens)", "y_label": "ms per decode step"},
        "decode_floor_ms": {"x": [float(n) for n in ctxs], "y": [t * 1e3 for t in floors],
                            "x_label": "context (tokens)", "y_label": "bytes / measured read bandwidth (ms)"}}}
