"""The same requests served by Hugging Face transformers, so chapters 04 and 05 can put the book's engines beside a
library's (chapters 04 and 05).

- `hf_continuous`: transformers' own continuous batching (`init_continuous_batching`: a background loop over a paged
  cache, requests joining and leaving between steps), each request added when its arrival time comes.
- `hf_static`: static batching with plain `generate` on left-padded prompts, with the same batching rule as
  `book.serve.run_static`.

- `hf_assisted`: one prompt at a time through `generate`, plain, with an assistant model (assisted generation) or
  with prompt lookup: the peer of `book.speculative` (chapter 05).

The first two return a `book.serve.Report`, so `book.serve.table` lists them with the book's engines. Times come from the same
clock (`time.perf_counter`): HF's own per-token stamps for the continuous manager, a logits-processor hook after each
forward pass for `generate`. Only greedy requests (temperature 0) are served; a request without an end-of-sequence id
never stops early, and one with an id stops after producing it, as in the book's engines.
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from .device import synchronize
from .serve import Report, Request, Served, Step, admit, static_batches

__all__ = ["hf_continuous", "hf_continuous_unavailable", "hf_static", "hf_assisted", "hf_sampling_test", "HFRun", "SCHEDULERS"]

SCHEDULERS = ("fifo", "prefill_first")
CB_LOGGER = "ContinuousBatchingLogger"   # transformers' continuous batching logs here, apart from its own logger
_RESULT_WAIT_S = 600.0                   # a loop that returns nothing for this long has hung


def _check_requests(requests: Sequence[Request], who: str) -> list[Request]:
    """A non-empty list of greedy `Request`s, or a clear error (chapter 04)."""
    requests = list(requests)
    if not requests:
        raise ValueError("no requests to serve")
    for i, r in enumerate(requests):
        if not isinstance(r, Request):
            raise TypeError(f"request {i} is a {type(r).__name__}, not a book.serve.Request")
        if r.temperature > 0:
            raise NotImplementedError(f"{who} serves greedy requests only; request {i} samples at temperature "
                                      f"{r.temperature} (the book's Engine serves sampled requests with their seeds)")
    return requests


def _positive(name: str, v) -> int:
    """v if it is an integer >= 1, else a ValueError naming it (chapter 04)."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return v


#: What `hf_continuous` passes to transformers' ContinuousBatchingConfig (its fields, by name).
_CB_FIELDS = ("page_size", "num_blocks", "max_batch_tokens", "max_requests_per_batch", "scheduler_type",
              "allow_block_sharing", "auto_switch_to_flash", "seed")


def hf_continuous_unavailable() -> str | None:
    """None when the installed transformers has the continuous-batching API `hf_continuous` drives, else a sentence
    that says why not; transformers 4.57 (Colab's for a while) has an older API (chapter 04)."""
    import inspect

    import transformers
    version = transformers.__version__
    try:
        from transformers import ContinuousBatchingConfig
    except ImportError:
        return (f"transformers {version} has no ContinuousBatchingConfig: Hugging Face's continuous batching, as "
                f"this book drives it, needs a newer transformers (the book is tested with 5.23; 5.17 lacks fields it sets); "
                f"pip install -U transformers")
    fields = inspect.signature(ContinuousBatchingConfig).parameters
    missing = [f for f in _CB_FIELDS if f not in fields]
    if missing:
        return (f"transformers {version}'s ContinuousBatchingConfig lacks {', '.join(missing)}, which this book "
                f"sets (it is tested with transformers 5.23); pip install -U transformers")
    return None


def _context(hf) -> int:
    """The longest sequence (prompt plus output) the HF model can hold (chapter 04)."""
    return int(getattr(hf.config, "max_position_embeddings", None) or 2**31)


@contextmanager
def _quiet_cb_logs(level: int = logging.ERROR) -> Iterator[None]:
    """Silence transformers' continuous-batching logger (its own handler, not reached by set_verbosity) (chapter 04)."""
    log = logging.getLogger(CB_LOGGER)
    old = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(old)


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' own warnings about how assisted generation combines its configs, silenced for one call."""
    from transformers.utils import logging as hf_logging
    old = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(old)


def _cut(tokens: Sequence[int], r: Request) -> list[int]:
    """A request's own tokens from a row run longer: up to its max_new_tokens, and up to its EOS included
    (chapter 04)."""
    out = [int(t) for t in tokens[:r.max_new_tokens]]
    if r.eos_token_id is not None and r.eos_token_id in out:
        out = out[:out.index(r.eos_token_id) + 1]
    return out


# ------------------------------------------------------------------------------------------- continuous batching

def hf_continuous(hf, requests: Sequence[Request], *, max_batch: int = 8, page_size: int = 16,
                  num_blocks: int | None = None, max_batch_tokens: int | None = None, scheduler: str = "fifo",
                  name: str | None = None) -> Report:
    """Serve `requests` with transformers' continuous batching manager, each added when its arrival time comes (real
    time), and report them like `book.serve.Engine.run` does; `steps` stays empty: HF logs no steps (chapter 04).

    - max_batch: the most requests in one step (`max_requests_per_batch`);
    - page_size: KV positions per page; num_blocks: KV capacity in pages of every layer (default: max_batch of the
      longest request, so nothing is ever evicted);
    - max_batch_tokens: the most tokens one step processes, longer prompts are split (default: the max_batch longest
      prompts plus max_batch, so prompts are prefilled whole, like `Engine(chunk=None)`);
    - scheduler: "fifo" (decodes first, then prefills) or "prefill_first".
    """
    requests = _check_requests(requests, "hf_continuous")
    _positive("max_batch", max_batch)
    if not isinstance(page_size, int) or page_size < 4:
        raise ValueError(f"page_size must be an integer >= 4 (transformers' minimum), got {page_size!r}")
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; use one of {', '.join(SCHEDULERS)}")
    longest = max(len(r.prompt) + r.max_new_tokens for r in requests)
    if num_blocks is None:
        num_blocks = max_batch * math.ceil(longest / page_size)
    _positive("num_blocks", num_blocks)
    if max_batch_tokens is None:
        prompts = sorted((len(r.prompt) for r in requests), reverse=True)
        max_batch_tokens = sum(prompts[:max_batch]) + max_batch
    _positive("max_batch_tokens", max_batch_tokens)
    name = name or f"HF continuous (paged, {scheduler})"
    why = hf_continuous_unavailable()
    if why:
        raise RuntimeError(why)
    from transformers import ContinuousBatchingConfig, GenerationConfig

    served = [Served(r, i) for i, r in enumerate(requests)]
    limit = _context(hf)
    gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0,
                           max_new_tokens=max(r.max_new_tokens for r in requests))
    cfg = ContinuousBatchingConfig(page_size=page_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens,
                                   max_requests_per_batch=max_batch, scheduler_type=scheduler,
                                   allow_block_sharing=False,   # no prefix caching: random prompts share nothing
                                   auto_switch_to_flash=False, seed=0)
    with _quiet_cb_logs():
        manager = hf.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
        try:
            manager.warmup()                   # builds the cache and buffers now, not in the loop's first step
            manager.start()
            # one tiny request first, so the first real one does not pay first-call costs
            manager.add_request(list(requests[0].prompt[:4]), request_id="warm-up", max_new_tokens=2,
                                eos_token_id=-1)
            _collect(manager, {"warm-up"}, lambda out: None, math.inf)
            t0 = time.perf_counter()
            order = deque(sorted(served, key=lambda s: (s.request.arrival, s.index)))
            waiting: set[str] = set()
            results: dict[str, object] = {}
            while order or waiting:
                deadline = t0 + order[0].request.arrival if order else math.inf
                if time.perf_counter() >= deadline:
                    s = order.popleft()
                    if admit(s, limit, lambda n: math.ceil(n / page_size) <= num_blocks):
                        r = s.request
                        manager.add_request(list(r.prompt), request_id=str(s.index), max_new_tokens=r.max_new_tokens,
                                            record_timestamps=True,
                                            eos_token_id=-1 if r.eos_token_id is None else r.eos_token_id)
                        waiting.add(str(s.index))
                    continue
                if waiting:
                    _collect(manager, waiting, lambda out: results.__setitem__(out.request_id, out), deadline)
                else:
                    time.sleep(max(0.0, deadline - time.perf_counter()))
        finally:
            manager.stop(block=True, timeout=30)
            manager.destroy()
    for rid, out in results.items():
        _fill(served[int(rid)], out, t0)
    return Report(name, served, [])


def _collect(manager, waiting: set[str], keep: Callable, deadline: float) -> None:
    """Take finished results off the manager's queue until `waiting` is empty or `deadline` (perf_counter) passes;
    a failed request or a silent loop raises (chapter 04)."""
    while waiting:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        out = manager.get_result(timeout=min(left, _RESULT_WAIT_S))
        if out is None:
            if not manager.is_running():
                raise RuntimeError("transformers' continuous batching loop stopped with requests still running")
            if left > _RESULT_WAIT_S:
                raise RuntimeError(f"transformers' continuous batching returned nothing for {_RESULT_WAIT_S:.0f} s")
            continue
        if not out.is_finished():
            continue
        if out.error is not None:
            raise RuntimeError(f"transformers failed request {out.request_id}: {out.error}")
        waiting.discard(out.request_id)
        keep(out)


def _fill(s: Served, out, t0: float) -> None:
    """A finished HF result into a `Served`: tokens, each token's time since the request arrived, queueing delay
    (chapter 04)."""
    arrived = t0 + s.request.arrival
    stamps = list(out.timestamps or [])
    s.tokens = [int(t) for t in out.generated_tokens]
    if len(stamps) < len(s.tokens):
        # transformers restarts a request it evicts (soft reset) with new stamps: the first tokens' times are lost
        raise RuntimeError(f"request {s.index}: {len(stamps)} timestamps for {len(s.tokens)} tokens; transformers "
                           f"evicted it from a full cache and restarted its clock. Give hf_continuous a larger "
                           f"num_blocks (the default holds max_batch of the longest request)")
    s.times = [t - arrived for t in stamps[:len(s.tokens)]]
    s.started = out.lifespan[0] - arrived
    s.status = "finished"


# ----------------------------------------------------------------------------------------------- static batching

def hf_static(hf, requests: Sequence[Request], *, batch: int = 8, timeout: float = 0.05,
              pad_token_id: int = 0) -> Report:
    """Static batching with plain `generate`, the batching rule of `book.serve.run_static`: wait until `batch`
    requests are queued (or the oldest has waited `timeout` seconds, or no more are coming), then run them together,
    left-padded with an attention mask, until the longest is done; tokens and times come from a hook after each
    forward pass (chapter 04)."""
    requests = _check_requests(requests, "hf_static")
    _positive("batch", batch)
    if not timeout >= 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout}")
    served = [Served(r, i) for i, r in enumerate(requests)]
    steps: list[Step] = []
    static_batches(served, batch=batch, timeout=timeout, max_len=_context(hf),
                   run=lambda group, now: _generate_batch(hf, group, steps, now, pad_token_id))
    return Report(f"HF static (batch {batch}, left-padded)", served, steps)


def _generate_batch(hf, group: list[Served], steps: list[Step], now: Callable[[], float], pad: int) -> None:
    """One left-padded `generate` call for a static batch, run to its longest request; a logits processor stamps
    every step, and each step is logged with its padding rows (requests already done) (chapter 04)."""
    from transformers import LogitsProcessorList

    dev = hf.device
    width = max(len(s.request.prompt) for s in group)
    ids = torch.tensor([[pad] * (width - len(s.request.prompt)) + list(s.request.prompt) for s in group], device=dev)
    mask = torch.tensor([[0] * (width - len(s.request.prompt)) + [1] * len(s.request.prompt) for s in group],
                        device=dev)
    longest = max(s.request.max_new_tokens for s in group)
    stamps: list[float] = []

    def stamp(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        synchronize(dev)
        stamps.append(now())
        return scores

    t_a = now()
    for s in group:
        s.status, s.started = "running", t_a - s.request.arrival
    with torch.no_grad():
        # eos_token_id=None: no row stops early and no logit is changed (min_new_tokens would mask the EOS logit);
        # each request is cut at its own length and end-of-sequence token below
        out = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=longest, eos_token_id=None,
                          pad_token_id=pad, logits_processor=LogitsProcessorList([stamp]))
    if len(stamps) != longest or out.shape[1] != width + longest:
        raise RuntimeError(f"generate ran {len(stamps)} steps and returned {out.shape[1] - width} tokens per row; "
                           f"expected {longest}")
    rows = out[:, width:].tolist()
    for s, row in zip(group, rows):
        s.tokens = _cut(row, s.request)
        s.times = [t - s.request.arrival for t in stamps[:len(s.tokens)]]
        s.status = "finished"
    idx = [s.index for s in group]
    prefill = tuple((s.index, len(s.request.prompt)) for s in group)
    starts = [t_a] + stamps[:-1]
    for k, (start, end) in enumerate(zip(starts, stamps)):
        live = tuple(s.index for s in group if len(s.tokens) > k)
        pad_rows = tuple(i for i, s in zip(idx, group) if len(s.tokens) <= k)
        steps.append(Step(start, end, prefill if k == 0 else (), () if k == 0 else live, () if k == 0 else pad_rows))


# ------------------------------------------------------------------------------------------ assisted generation

@dataclass
class HFRun:
    """Prompts through Hugging Face `generate` (chapter 05): the new tokens of each and the wall seconds of all."""
    name: str
    tokens: list[list[int]]
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return sum(len(t) for t in self.tokens) / self.seconds if self.seconds > 0 else math.nan


@torch.no_grad()
def hf_assisted(hf, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, assistant=None,
                gamma: int | None = None, lookup: int | None = None, temperature: float = 0.0,
                seed: int = 0) -> HFRun:
    """Each prompt through `hf.generate` on its own (chapter 05): plain decoding; with `assistant` (a smaller
    transformers model with the same vocabulary) assisted generation, drafting `gamma` tokens a round (constant,
    no confidence cut-off) or, with gamma None, transformers' default schedule; with `lookup` prompt lookup that
    drafts `lookup` tokens a round. Greedy at temperature 0, else sampled (seeded once)."""
    import copy
    if assistant is not None and lookup is not None:
        raise ValueError("give an assistant model or prompt lookup, not both")
    if gamma is not None and (not isinstance(gamma, int) or gamma < 1):
        raise ValueError(f"gamma must be an integer >= 1 or None (transformers' schedule), got {gamma!r}")
    if lookup is not None and (not isinstance(lookup, int) or lookup < 1):
        raise ValueError(f"lookup must be an integer >= 1, got {lookup!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    # no end-of-sequence stop, like the book's decoder: every prompt gets exactly max_new_tokens
    kw: dict = dict(max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
    kw.update(do_sample=False) if temperature <= 0 else kw.update(do_sample=True, temperature=temperature, top_k=0,
                                                                   top_p=1.0)
    name = "HF generate"
    if assistant is not None:
        if assistant.config.vocab_size != hf.config.vocab_size:
            raise ValueError(f"the assistant's vocabulary ({assistant.config.vocab_size}) differs from the "
                             f"target's ({hf.config.vocab_size})")
        assistant = copy.copy(assistant)
        assistant.generation_config = copy.deepcopy(assistant.generation_config)
        if gamma is not None:
            assistant.generation_config.num_assistant_tokens = gamma
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            assistant.generation_config.assistant_confidence_threshold = 0.0
        kw["assistant_model"] = assistant
        name = f"HF assisted ({'gamma ' + str(gamma) if gamma else 'its default schedule'})"
    elif lookup is not None:
        kw["prompt_lookup_num_tokens"] = lookup
        kw["eos_token_id"] = -1    # an id that never occurs: transformers 4.57's prompt lookup fails on None
        name = f"HF prompt lookup ({lookup} tokens)"
    dev = hf.device
    torch.manual_seed(seed)
    out = []
    synchronize(dev)
    t0 = time.perf_counter()
    with _quiet_transformers():
        for p in prompts:
            x = torch.tensor([list(p)], device=dev)
            y = hf.generate(x, attention_mask=torch.ones_like(x), **kw)
            out.append(y[0, x.shape[1]:].tolist())
    synchronize(dev)
    return HFRun(name, out, time.perf_counter() - t0)


@contextmanager
def _count_speculative_sampling() -> Iterator[list[int]]:
    """Count the calls of transformers' speculative-sampling step (its acceptance rule), to show a run used it."""
    from transformers.generation import utils
    original, calls = utils._speculative_sampling, [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    utils._speculative_sampling = counted
    try:
        yield calls
    finally:
        utils._speculative_sampling = original


def hf_sampling_test(hf, assistant, context: Sequence[int], *, temperature: float = 1.0, eps: float = 0.1,
                     delta: float = 1e-3, seed: int = 0) -> dict:
    """Is Hugging Face assisted generation with sampling exact (chapter 05)? The first token after `context` is drawn
    many times with the assistant drafting one token, and its distribution tested against the target's own p at
    that temperature (`speculative.tv_test`: tokens rarer than eps/8 pooled, the sample size its guarantee needs).
    Also returns TV(p, q) and how far the two broken rules (no residual, no ratio) would land from p here: where
    that is under eps, this position could not catch them."""
    from .speculative import logits_of, output_distribution, tv_distance, tv_samples_needed, tv_test
    if not temperature > 0:
        raise ValueError(f"the sampling test needs a temperature > 0, got {temperature}")
    x = torch.tensor([list(context)], device=hf.device)
    with torch.no_grad():
        p, q = (torch.softmax(logits_of(m, x.to(m.device))[0, -1].double() / temperature, -1).cpu()
                for m in (hf, assistant))
    min_mass = eps / 8
    n = tv_samples_needed(int((p >= min_mass).sum()) + 1, eps, delta)
    with _count_speculative_sampling() as calls:
        run = hf_assisted(hf, [list(context)] * n, 2, assistant=assistant, gamma=1, temperature=temperature,
                          seed=seed)
    samples = [t[0] for t in run.tokens]
    broken = {"no residual": output_distribution(p, q, residual=False),
              "no ratio": output_distribution(p, q, ratio=False)}
    return {"test": tv_test(samples, p, eps=eps, delta=delta, min_mass=min_mass), "samples": samples,
            "speculative_calls": calls[0], "seconds": run.seconds, "tv_pq": tv_distance(p, q),
            "broken_tv": {name: tv_distance(d, p) for name, d in broken.items()}, "p": p, "q": q}
