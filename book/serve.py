"""Serving many requests with the book's decoder: requests and their timestamps, an iteration-level (continuous
batching) engine on a slot or paged KV cache, static batching as the baseline, Poisson load, and the report that
turns a run into throughput and latency percentiles (chapter 04).

Every time in a `Report` is read from a real clock while the model runs; the clock can be replaced only so that unit
tests run fast.
"""
from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .decode import SLO, Latency, percentile, summarize
from .device import synchronize
from .kvcache import CacheFull, PagedCache, Segment, SlotCache
from .speculative import lookup, verify

__all__ = ["Request", "Served", "Step", "Report", "Engine", "POLICIES", "CACHES", "run_static", "static_batches",
           "reject_reason", "admit", "poisson_arrivals", "workload", "requests_from", "gantt", "table"]

POLICIES = ("mixed", "prefill-first", "decode-first")
CACHES = ("paged", "slot")


@dataclass(frozen=True)
class Request:
    """One request: prompt token ids, how many tokens to generate, when it arrives (seconds after the run starts),
    an optional end-of-sequence id, and greedy (temperature 0) or sampled decoding (chapter 04)."""
    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival: float = 0.0
    eos_token_id: int | None = None
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", tuple(int(t) for t in self.prompt))
        if not self.prompt:
            raise ValueError("a request needs a prompt of at least one token; got an empty prompt")
        if min(self.prompt) < 0:
            raise ValueError(f"token ids are >= 0; the prompt holds {min(self.prompt)}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not math.isfinite(self.arrival) or self.arrival < 0:
            raise ValueError(f"arrival must be a time >= 0 in seconds, got {self.arrival}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")


@dataclass
class Served:
    """What happened to one request: its tokens, when each was ready (seconds after the request arrived), when it
    left the queue, and whether it finished or was rejected, and why (chapter 04)."""
    request: Request
    index: int
    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    started: float | None = None        # seconds after arrival when its first step began: the queueing delay
    status: str = "pending"             # pending, waiting, running, finished, rejected
    reason: str = ""
    preemptions: int = 0

    @property
    def latency(self) -> Latency:
        """TTFT (queueing included), TPOT and E2E of this request, as in chapter 01 (chapter 04)."""
        return Latency.from_times(self.times)


@dataclass(frozen=True)
class Step:
    """One step of a run: when it began and ended (seconds after the run started), which requests it prefilled and
    how many tokens of each, which it decoded, which rows it computed for requests already done (static batching's
    padding), the host time spent scheduling rather than in the model, how many requests were left waiting in the
    queue (-1: not logged), and with speculative decoding the tokens drafted and accepted (chapter 04)."""
    start: float
    end: float
    prefill: tuple[tuple[int, int], ...]
    decode: tuple[int, ...]
    padding: tuple[int, ...] = ()
    schedule_s: float = 0.0
    waiting: int = -1
    drafted: int = 0                    # speculative decoding (chapter 05): tokens drafted for the decodes,
    accepted: int = 0                   # how many of them the target kept,
    draft_s: float = 0.0                # and the seconds the drafting took

    @property
    def tokens(self) -> int:
        """Tokens the model processed for real requests in this step (chapter 04)."""
        return sum(n for _, n in self.prefill) + len(self.decode) + self.drafted


@dataclass
class Report:
    """A run: every request's fate and every step, with throughput and latency percentiles (chapter 04)."""
    name: str
    served: list[Served]
    steps: list[Step]

    def check(self) -> None:
        """Every request either finished with exactly its tokens or was rejected with a reason; none lost or twice
        (chapter 04)."""
        seen = sorted(s.index for s in self.served)
        if seen != list(range(len(self.served))):
            raise AssertionError(f"{self.name}: requests lost or duplicated: {seen}")
        for s in self.served:
            r = s.request
            if s.status == "rejected":
                if not s.reason or s.tokens:
                    raise AssertionError(f"{self.name}: request {s.index} rejected without a reason or with tokens")
            elif s.status != "finished":
                raise AssertionError(f"{self.name}: request {s.index} is {s.status}, not finished or rejected")
            elif not (len(s.tokens) == r.max_new_tokens or (r.eos_token_id is not None and s.tokens
                                                             and s.tokens[-1] == r.eos_token_id)):
                raise AssertionError(f"{self.name}: request {s.index} has {len(s.tokens)} of {r.max_new_tokens} "
                                     f"tokens")
            elif len(s.times) != len(s.tokens):
                raise AssertionError(f"{self.name}: request {s.index} has a timestamp missing")

    @property
    def finished(self) -> list[Served]:
        return [s for s in self.served if s.status == "finished"]

    @property
    def rejected(self) -> list[Served]:
        return [s for s in self.served if s.status == "rejected"]

    @property
    def wall(self) -> float:
        """Seconds from the first arrival to the last token (chapter 04)."""
        ends = [s.request.arrival + s.times[-1] for s in self.served if s.times]
        return max(ends) - min(s.request.arrival for s in self.served) if ends else 0.0

    @property
    def generated(self) -> int:
        return sum(len(s.tokens) for s in self.served)

    @property
    def throughput(self) -> float:
        """Generated tokens per second of the run (chapter 04)."""
        return self.generated / self.wall if self.wall > 0 else 0.0

    def latencies(self) -> list[Latency]:
        return [s.latency for s in self.finished]

    def percentiles(self, ps: Sequence[float] = (50, 95, 99)) -> dict[str, dict[float, float]]:
        """TTFT, TPOT, E2E and queueing delay at each percentile, in seconds, over finished requests (chapter 04)."""
        out = summarize(self.latencies(), ps)
        q = [s.started for s in self.finished if s.started is not None]
        out["queue"] = {p: percentile(q, p) for p in ps} if q else {}
        return out

    def meets(self, slo: SLO) -> bool:
        """Whether TTFT and TPOT at the SLO's percentile are within its bounds, and nothing was rejected
        (chapter 04)."""
        return not self.rejected and all(ok for _, _, ok in slo.check(self.latencies()).values())

    @property
    def schedule_share(self) -> float:
        """Host time spent scheduling as a share of all step time; nan when the server logged none (static batching
        has no per-step scheduler; Hugging Face logs no steps) (chapter 04)."""
        busy = sum(s.end - s.start for s in self.steps)
        sched = sum(s.schedule_s for s in self.steps)
        return sched / busy if busy > 0 and sched > 0 else math.nan

    @property
    def mean_batch(self) -> float:
        """Requests served per step (prefilled or decoded), averaged over steps; nan with no steps logged
        (chapter 04)."""
        if not self.steps:
            return math.nan
        return sum(len(s.prefill) + len(s.decode) for s in self.steps) / len(self.steps)

    @property
    def saturated_batch(self) -> float:
        """Requests served per step over the steps that left requests waiting, after the first tenth of them (the
        start): chapter 03's allocator simulation averages the same way; nan when no step left one waiting or the
        server does not log its queue (chapter 04)."""
        busy = self._saturated_steps()
        return sum(len(s.prefill) + len(s.decode) for s in busy) / len(busy) if busy else math.nan

    def _saturated_steps(self) -> list[Step]:
        """The steps that left requests waiting, after the first tenth of them (the start)."""
        busy = [s for s in self.steps if s.waiting > 0]
        return busy[len(busy) // 10:]

    @property
    def saturated_throughput(self) -> float:
        """Generated tokens per second while requests waited: the tokens ready from the start of the first step that
        left one waiting (after the first tenth of those steps, the start) to the end of the last, over that span;
        the rate a server sustains at full load, where `throughput` also counts a burst's draining tail; nan when no
        step left one waiting or the server does not log its queue (chapter 04)."""
        busy = self._saturated_steps()
        if not busy or busy[-1].end <= busy[0].start:
            return math.nan
        t0, t1 = busy[0].start, busy[-1].end
        ready = sum(t0 < s.request.arrival + t <= t1 for s in self.served for t in s.times)
        return ready / (t1 - t0)

    @property
    def padding_share(self) -> float:
        """Rows computed for requests already done, as a share of all rows (static batching's waste) (chapter 04)."""
        rows = sum(len(s.decode) + len(s.padding) for s in self.steps)
        return sum(len(s.padding) for s in self.steps) / rows if rows else 0.0

    @property
    def preemptions(self) -> int:
        return sum(s.preemptions for s in self.served)

    @property
    def acceptance(self) -> float:
        """Drafted tokens the target accepted, as a share of all drafted (speculative decoding, chapter 05); nan
        when nothing was drafted."""
        drafted = sum(s.drafted for s in self.steps)
        return sum(s.accepted for s in self.steps) / drafted if drafted else math.nan

    @property
    def tokens_per_decode(self) -> float:
        """Tokens a decoding sequence gains per step: 1 without speculation, 1 + accepted drafts with it
        (chapter 05); nan with no decodes logged."""
        decodes = sum(len(s.decode) for s in self.steps)
        return (decodes + sum(s.accepted for s in self.steps)) / decodes if decodes else math.nan

    def row(self) -> dict[str, float]:
        """The run in numbers: throughput, TTFT/TPOT P50/P95/P99 in ms, mean batch, preemptions (chapter 04)."""
        p = self.percentiles()
        out = {"tokens/s": self.throughput, "mean batch": self.mean_batch}
        for name in ("ttft", "tpot", "queue"):
            for q in (50, 95, 99):
                out[f"{name} p{q} ms"] = p[name].get(q, float("nan")) * 1e3
        out["preemptions"] = self.preemptions
        out["rejected"] = len(self.rejected)
        return out


# ------------------------------------------------------------------------------------------------------- the engine

class _Seq:
    """A request inside an engine: the tokens it knows (prompt, then generated) and how many are in the cache."""

    def __init__(self, served: Served, device: torch.device):
        self.s = served
        self.known = list(served.request.prompt)
        self.cached = 0
        r = served.request
        self.gen = torch.Generator(device=device).manual_seed(r.seed) if r.temperature > 0 else None

    @property
    def remaining(self) -> int:
        return len(self.known) - self.cached


def _draw(logits: torch.Tensor, q: _Seq) -> tuple[int, torch.Tensor]:
    """A token drawn for a sampled sequence from one row of logits at its temperature, with its own generator, and
    the probabilities it was drawn from."""
    probs = torch.softmax(logits.float() / q.s.request.temperature, -1)
    return int(torch.multinomial(probs, 1, generator=q.gen)[0]), probs


def _pick(logits: torch.Tensor, seqs: Sequence[_Seq]) -> list[int]:
    """Next token of each sequence: greedy rows in one argmax, sampled rows with their own generator."""
    out = logits.argmax(-1).tolist()           # one host sync per step
    for i, q in enumerate(seqs):
        if q.s.request.temperature > 0:
            out[i] = _draw(logits[i], q)[0]
    return out


def reject_reason(r: Request, max_len: int, fits: Callable[[int], bool]) -> str:
    """Why a request can never be served ('' if it can): a prompt that fills the context, prompt plus output past
    `max_len` positions, or more positions than the KV budget could ever hold (chapter 04)."""
    need = len(r.prompt) + r.max_new_tokens
    if len(r.prompt) >= max_len:
        return f"a prompt of {len(r.prompt)} tokens leaves no room to generate within {max_len} positions"
    if need > max_len:
        return f"prompt {len(r.prompt)} + {r.max_new_tokens} new tokens = {need} positions; the limit is {max_len}"
    if not fits(need):
        return f"{need} positions can never fit the KV budget"
    return ""


def admit(s: Served, max_len: int, fits: Callable[[int], bool]) -> bool:
    """Mark an arrived request waiting, or rejected with its `reject_reason`; True if it may be served
    (chapter 04)."""
    reason = reject_reason(s.request, max_len, fits)
    s.status, s.reason = ("rejected", reason) if reason else ("waiting", "")
    return not reason


def _make_cache(arch, *, cache: str, kv_tokens: int, max_len: int, max_batch: int, block_size: int,
                dtype: torch.dtype, device: torch.device) -> SlotCache | PagedCache:
    shape = dict(dtype=dtype, device=device)
    if cache == "slot":
        n_slots = min(max_batch, kv_tokens // max_len)
        if n_slots < 1:
            raise ValueError(f"a KV budget of {kv_tokens} positions is smaller than one slot of max_len "
                             f"{max_len}: no request could ever run; raise kv_tokens or lower max_len")
        return SlotCache(arch.n_layers, n_slots, arch.n_kv_heads, max_len, arch.head_dim, **shape)
    n_blocks = kv_tokens // block_size
    if n_blocks < 1:
        raise ValueError(f"a KV budget of {kv_tokens} positions is smaller than one block of {block_size}")
    return PagedCache(arch.n_layers, n_blocks, arch.n_kv_heads, block_size, arch.head_dim, **shape)


class _LookupDrafts:
    """Prompt lookup for every decoding sequence (chapter 05): no model, so no cache and no cost but the search."""

    def __init__(self, ngram: int = 3):
        self.ngram, self.name = ngram, f"prompt lookup ({ngram}-gram)"

    def propose(self, seqs: Sequence[_Seq], ks: Sequence[int]) -> list[tuple[list[int], torch.Tensor | None]]:
        return [(lookup(q.known, k, self.ngram), None) for q, k in zip(seqs, ks)]

    def accepted(self, q: _Seq, known_before: int, n: int) -> None:
        pass

    def free(self, seq: int) -> None:
        pass


class _ModelDrafts:
    """A draft model for every decoding sequence (chapter 05): its own KV cache of the engine's kind and size, and
    one packed pass per drafted position for all the sequences together; rejected drafts are rewound by lowering the
    count of cached positions (their keys and values are overwritten later)."""

    def __init__(self, model, cache: SlotCache | PagedCache):
        self.model, self.cache = model, cache
        self.name = f"draft model {model.arch.name}"
        self.cached: dict[int, int] = {}

    def propose(self, seqs: Sequence[_Seq], ks: Sequence[int]) -> list[tuple[list[int], torch.Tensor | None]]:
        out: dict[int, tuple[list[int], list[torch.Tensor]]] = {q.s.index: ([], []) for q in seqs}
        by_index = {q.s.index: (q, k) for q, k in zip(seqs, ks)}
        segs = []
        for q, k in zip(seqs, ks):
            if k > 0:
                i, c = q.s.index, self.cached.get(q.s.index, 0)
                self.cache.allocate(i, len(q.known) + k - 1)   # the target already holds more: this cannot fail
                segs.append(Segment(i, tuple(q.known[c:]), c, True))
        while segs:
            packed = self.cache.pack(segs)
            logits = self.model.forward_packed(packed, self.cache)
            best = logits.argmax(-1).tolist()
            segs = []
            for row, seg in enumerate(packed.segments):
                q, k = by_index[seg.seq]
                drafted, qs = out[seg.seq]
                if q.s.request.temperature > 0:
                    token, probs = _draw(logits[row], q)
                    drafted.append(token)
                    qs.append(probs)
                else:
                    drafted.append(best[row])
                if len(drafted) < k:
                    segs.append(Segment(seg.seq, (drafted[-1],), seg.start + len(seg.tokens), True))
        for q, k in zip(seqs, ks):
            if k > 0:
                self.cached[q.s.index] = len(q.known) + k - 1      # the last drafted token is never fed
        return [(out[q.s.index][0], torch.stack(out[q.s.index][1]) if out[q.s.index][1] else None) for q in seqs]

    def accepted(self, q: _Seq, known_before: int, n: int) -> None:
        """The target kept n drafts: the draft's cache stays valid up to the last of them it has fed."""
        i = q.s.index
        self.cached[i] = min(self.cached.get(i, 0), known_before + n)

    def free(self, seq: int) -> None:
        self.cache.free(seq)
        self.cached.pop(seq, None)


class Engine:
    """Iteration-level scheduling on the book's decoder (continuous batching) (chapter 04).

    Every step runs one decode step for every running sequence plus the prefills the policy admits, all packed into
    one pass of the model (`Llama.forward_packed`): requests join between steps and leave as soon as they finish.

    - policy "mixed": decodes and prefills share a step; "prefill-first": a step that can admit a prompt runs only
      prefills, and decodes wait (the best TTFT, and the TPOT spikes it costs); "decode-first": a step with
      sequences to decode runs only decodes, and prompts start when none is left (smooth TPOT, long queues).
    - chunk: the most prompt tokens one step prefills (chunked prefill); None prefills whole prompts.
    - cache "slot": each sequence reserves max_len positions; "paged": blocks of block_size positions as it grows,
      and when none is free the newest sequence is preempted and later recomputed.
    - kv_tokens: the KV budget in positions (default: max_batch sequences of max_len); max_len: the longest
      sequence, prompt plus output (default: the model's context).
    - draft: speculative decoding (chapter 05). "lookup" (prompt lookup) or a draft model (the book's decoder, same
      vocabulary) proposes up to `gamma` tokens for every decoding sequence, and the step verifies them all in its
      one pass of the model; greedy and sampled requests keep exactly their output (`speculative.verify`). A draft
      model gets its own KV cache of the same kind and size.
    """

    def __init__(self, model, *, cache: str = "paged", kv_tokens: int | None = None, max_len: int | None = None,
                 max_batch: int = 16, policy: str = "mixed", chunk: int | None = None, block_size: int = 16,
                 draft=None, gamma: int = 4):
        if cache not in CACHES:
            raise ValueError(f"unknown cache {cache!r}; use one of {', '.join(CACHES)}")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
        limit = model.arch.max_context
        max_len = limit if max_len is None else max_len
        for name, v in (("max_batch", max_batch), ("max_len", max_len), ("block_size", block_size)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if max_len > limit:
            raise ValueError(f"max_len {max_len} is longer than {model.arch.name} allows ({limit} tokens)")
        if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"chunk must be None (whole prompts) or an integer >= 1, got {chunk!r}")
        kv_tokens = max_batch * max_len if kv_tokens is None else kv_tokens
        if not isinstance(kv_tokens, int) or kv_tokens < 1:
            raise ValueError(f"kv_tokens must be a positive number of positions, got {kv_tokens!r}")
        sizes = dict(cache=cache, kv_tokens=kv_tokens, max_len=max_len, max_batch=max_batch, block_size=block_size)
        self.cache = _make_cache(model.arch, dtype=model.dtype, device=model.device, **sizes)
        self.model, self.kind, self.policy, self.chunk = model, cache, policy, chunk
        self.max_batch, self.max_len = max_batch, max_len
        self.name = f"continuous ({cache}, {policy}" + (f", chunk {chunk}" if chunk else "")
        self.drafts, self.gamma = None, gamma
        if draft is not None:
            if not isinstance(gamma, int) or gamma < 1:
                raise ValueError(f"gamma (tokens drafted per step) must be an integer >= 1, got {gamma!r}")
            if isinstance(draft, str):
                if draft != "lookup":
                    raise ValueError(f"unknown draft {draft!r}: use 'lookup' (prompt lookup) or a draft model")
                self.drafts = _LookupDrafts()
            else:
                if draft.arch.vocab != model.arch.vocab:
                    raise ValueError(f"the draft's vocabulary ({draft.arch.vocab} tokens) differs from the "
                                     f"target's ({model.arch.vocab}): their token ids do not mean the same thing")
                if draft.arch.max_context < max_len:
                    raise ValueError(f"the draft {draft.arch.name} allows {draft.arch.max_context} positions, "
                                     f"fewer than max_len {max_len}")
                self.drafts = _ModelDrafts(draft, _make_cache(draft.arch, dtype=draft.dtype, device=draft.device,
                                                              **sizes))
            self.name += f", {self.drafts.name} gamma {gamma}"
        self.name += ")"

    def __repr__(self) -> str:
        return (f"Engine({self.name}, max_batch={self.max_batch}, KV {self.cache.capacity} positions = "
                f"{self.cache.nbytes / 2**20:.1f} MiB)")

    # ------------------------------------------------------------------------------------------------ scheduling

    def _preempt(self, victim: _Seq) -> None:
        """Recompute later: free the victim's cache, send it to the front of the queue (chapter 04)."""
        self.cache.free(victim.s.index)
        if self.drafts:
            self.drafts.free(victim.s.index)
        victim.cached = 0
        victim.s.preemptions += 1
        victim.s.status = "waiting"
        self.running.remove(victim)
        self.waiting.appendleft(victim)

    def _reserve(self, q: _Seq, n: int) -> bool:
        """Room for positions 0..n-1 of q, preempting the newest sequences if needed; False if q itself went."""
        while True:
            try:
                self.cache.allocate(q.s.index, n)
                return True
            except CacheFull:
                victim = self.running[-1]
                self._preempt(victim)
                if victim is q:
                    return False

    def _draft_room(self, q: _Seq) -> int:
        """How many tokens may be drafted for q this step: gamma, but none past its last token."""
        if self.drafts is None:
            return 0
        return max(0, min(self.gamma, q.s.request.max_new_tokens - len(q.s.tokens) - 1))

    def _decodes(self) -> list[Segment]:
        segs = []
        for q in [q for q in self.running if q.remaining == 1]:
            if q in self.running and self._reserve(q, q.cached + 1 + self._draft_room(q)):
                segs.append(Segment(q.s.index, (q.known[-1],), q.cached, True))
        return segs

    def _speculate(self, segs: list[Segment]) -> list[Segment]:
        """Draft tokens for the decoding sequences among `segs`; their segments become verifications (chapter 05)."""
        decoding = [(i, self._by_index[s.seq]) for i, s in enumerate(segs)
                    if len(s.tokens) == 1 and s.start == len(self._by_index[s.seq].known) - 1]
        ks = [self._draft_room(q) for _, q in decoding]
        if not decoding or not any(ks):
            return segs
        proposals = self.drafts.propose([q for _, q in decoding], ks)
        segs = list(segs)
        for (i, q), k, (drafted, probs) in zip(decoding, ks, proposals):
            drafted = drafted[:k]
            self._q[q.s.index] = None if probs is None else probs[:len(drafted)]
            segs[i] = Segment(q.s.index, (q.known[-1], *drafted), q.cached, True, verify=True)
        return segs

    def _prefills(self) -> list[Segment]:
        budget = self.chunk or math.inf
        segs = []
        for q in [q for q in self.running if q.remaining > 1]:          # chunks of prompts already started
            if budget <= 0 or q not in self.running:
                break
            k = int(min(q.remaining, budget))
            if self._reserve(q, q.cached + k):
                segs.append(Segment(q.s.index, tuple(q.known[q.cached:q.cached + k]), q.cached,
                                    q.cached + k == len(q.known)))
                budget -= k
        while budget > 0 and self.waiting and len(self.running) < self.max_batch:   # first come, first served
            q = self.waiting[0]
            k = int(min(q.remaining, budget))
            if not self.cache.can_start(k):
                break
            self.waiting.popleft()
            self.cache.allocate(q.s.index, k)
            self.running.append(q)
            q.s.status = "running"
            if q.s.started is None:
                q.s.started = self._now() - q.s.request.arrival
            segs.append(Segment(q.s.index, tuple(q.known[:k]), 0, k == len(q.known)))
            budget -= k
        return segs

    def _schedule(self) -> list[Segment]:
        if self.policy == "prefill-first":
            segs = self._prefills() or self._decodes()
        elif self.policy == "decode-first":
            segs = self._decodes() or self._prefills()
        else:
            segs = self._decodes() + self._prefills()
        # a sequence scheduled early in the step may have been preempted later in it to make room
        return [s for s in segs if self._by_index[s.seq] in self.running]

    def _choose(self, logits: torch.Tensor, segments: Sequence[Segment]) -> dict[int, tuple[int, list[int]]]:
        """For each segment that samples: (drafts accepted, the new tokens). A plain segment gains one token; a
        verification keeps the drafts `speculative.verify` accepts plus the target's own next token (chapter 05)."""
        best = logits.argmax(-1).tolist()                   # one host sync for all greedy rows
        out, row = {}, 0
        for seg in segments:
            if not (seg.sample or seg.verify):
                continue
            q = self._by_index[seg.seq]
            t = q.s.request.temperature
            rows = len(seg.tokens) if seg.verify else 1
            if seg.verify:
                drafted = list(seg.tokens[1:])
                scores = logits[row:row + rows]
                if t > 0:
                    scores = torch.softmax(scores.float() / t, -1)
                    n, nxt = verify(scores, self._q.pop(seg.seq, None), drafted, temperature=t, generator=q.gen)
                else:                                        # greedy verify on the argmaxes already fetched
                    n = 0
                    while n < len(drafted) and best[row + n] == drafted[n]:
                        n += 1
                    nxt = best[row + n]
                out[seg.seq] = (n, drafted[:n] + [nxt])
            elif t > 0:
                out[seg.seq] = (0, [_draw(logits[row], q)[0]])
            else:
                out[seg.seq] = (0, [best[row]])
            row += rows
        return out

    # ------------------------------------------------------------------------------------------------------ run

    def _now(self) -> float:
        return self._clock() - self._t0

    def run(self, requests: Sequence[Request], *, clock: Callable[[], float] = time.perf_counter,
            sleep: Callable[[float], None] = time.sleep) -> Report:
        """Serve `requests`, each released when its arrival time comes (real time), until every one has finished or
        been rejected; returns the report (chapter 04)."""
        served = [Served(r, i) for i, r in enumerate(requests)]
        if not served:
            raise ValueError("no requests to serve")
        self._clock, self._t0 = clock, clock()
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self._by_index: dict[int, _Seq] = {}
        self._q: dict[int, torch.Tensor | None] = {}     # the draft's probabilities for this step's drafts
        pending = deque(sorted(served, key=lambda s: (s.request.arrival, s.index)))
        steps: list[Step] = []
        dev = self.model.device
        while pending or self.waiting or self.running:
            now = self._now()
            while pending and pending[0].request.arrival <= now:
                s = pending.popleft()
                if not admit(s, self.max_len, self.cache.fits):
                    continue
                q = _Seq(s, dev)
                self._by_index[s.index] = q
                self.waiting.append(q)
            if not self.waiting and not self.running:
                if pending:
                    sleep(max(0.0, pending[0].request.arrival - now))
                continue
            t_a = self._now()
            segs = self._schedule()
            if not segs:
                if self.running or not self.waiting:
                    raise RuntimeError("the scheduler found nothing to run while requests wait: a bug")
                raise RuntimeError("the first waiting request cannot start on an empty cache: a bug")
            draft_s = 0.0
            if self.drafts is not None:
                t_draft = self._now()
                segs = self._speculate(segs)
                synchronize(dev)
                draft_s = self._now() - t_draft
            packed = self.cache.pack(segs)
            t_b = self._now()
            logits = self.model.forward_packed(packed, self.cache)
            chosen = self._choose(logits, packed.segments)
            synchronize(dev)
            t_c = self._now()
            prefill, decode, drafted, accepted = [], [], 0, 0
            for seg in packed.segments:
                q = self._by_index[seg.seq]
                is_decode = bool(q.s.tokens) and seg.start == len(q.known) - 1
                (decode.append(seg.seq) if is_decode else prefill.append((seg.seq, len(seg.tokens))))
                if seg.seq not in chosen:                                 # a prompt chunk that samples nothing
                    q.cached += len(seg.tokens)
                    continue
                n, new = chosen[seg.seq]
                known_before = len(q.known)
                q.cached = seg.start + len(seg.tokens) if not seg.verify else seg.start + 1 + n
                drafted += len(seg.tokens) - 1 if seg.verify else 0
                accepted += n
                if self.drafts is not None:
                    self.drafts.accepted(q, known_before, n)
                s, r = q.s, q.s.request
                for tok in new:
                    q.known.append(tok)
                    s.tokens.append(tok)
                    s.times.append(t_c - r.arrival)
                    if len(s.tokens) == r.max_new_tokens or tok == r.eos_token_id:
                        s.status = "finished"
                        self.cache.free(s.index)
                        if self.drafts is not None:
                            self.drafts.free(s.index)
                        self.running.remove(q)
                        break
            t_d = self._now()
            steps.append(Step(t_a, t_d, tuple(prefill), tuple(decode), (), (t_b - t_a - draft_s) + (t_d - t_c),
                              len(self.waiting), drafted, accepted, draft_s))
        return Report(self.name, served, steps)


# ------------------------------------------------------------------------------------------- static batching

def run_static(model, requests: Sequence[Request], *, batch: int = 8, timeout: float = 0.05,
               clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep
               ) -> Report:
    """Static batching, the baseline (chapter 04): wait until `batch` requests are queued (or the oldest has waited
    `timeout` seconds, or no more are coming), prefill them together right-padded, then decode them together until
    the longest is done; rows of requests already done are computed anyway (padding), and newcomers wait for the
    whole batch."""
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    if not timeout >= 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout}")
    served = [Served(r, i) for i, r in enumerate(requests)]
    if not served:
        raise ValueError("no requests to serve")
    dev = model.device
    # a padded row keeps decoding until its batch's longest output is done: room for the longest prompt plus it
    room = max(len(s.request.prompt) for s in served) + max(s.request.max_new_tokens for s in served)
    model.setup_cache(min(batch, len(served)), room)
    steps: list[Step] = []
    static_batches(served, batch=batch, timeout=timeout, max_len=model.arch.max_context,
                   run=lambda group, now: _static_batch(model, group, steps, now, dev), clock=clock, sleep=sleep)
    return Report(f"static (batch {batch})", served, steps)


def static_batches(served: Sequence[Served], *, batch: int, timeout: float, max_len: int,
                   run: Callable[[list[Served], Callable[[], float]], None],
                   clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep
                   ) -> None:
    """The static server's queue (chapter 04): release requests at their arrival times, and whenever `batch` are
    queued (or the oldest has waited `timeout` seconds, or no more are coming) hand them to `run(group, now)`,
    which serves them to the end; `now()` is seconds since the run started."""
    t0 = clock()
    now = lambda: clock() - t0  # noqa: E731
    pending = deque(sorted(served, key=lambda s: (s.request.arrival, s.index)))
    queue: deque[Served] = deque()
    while pending or queue:
        t = now()
        while pending and pending[0].request.arrival <= t:
            s = pending.popleft()
            if admit(s, max_len, lambda n: True):
                queue.append(s)
        if not queue:
            if pending:
                sleep(max(0.0, pending[0].request.arrival - t))
            continue
        if len(queue) < batch and pending and t - queue[0].request.arrival < timeout:
            sleep(max(0.0, min(pending[0].request.arrival, queue[0].request.arrival + timeout) - t))
            continue
        run([queue.popleft() for _ in range(min(batch, len(queue)))], now)


def _static_batch(model, group: list[Served], steps: list[Step], now: Callable[[], float], dev) -> None:
    """Run one static batch to its longest request, logging every step."""
    seqs = [_Seq(s, dev) for s in group]
    idx = [s.index for s in group]
    t_a = now()
    for s in group:
        s.status, s.started = "running", t_a - s.request.arrival
    prompts = [list(s.request.prompt) for s in group]
    tok = _pick(model.prefill(prompts), seqs)
    longest = max(s.request.max_new_tokens for s in group)
    done = [False] * len(group)
    prefill = tuple((i, len(p)) for i, p in zip(idx, prompts))
    for step in range(longest):
        if step > 0:
            t_a = now()
            tok = _pick(model.decode_step(torch.tensor(tok, device=dev)), seqs)
        synchronize(dev)
        t = now()
        live = []
        for j, (s, q) in enumerate(zip(group, seqs)):
            if done[j]:
                continue
            live.append(s.index)
            s.tokens.append(tok[j])
            s.times.append(t - s.request.arrival)
            if len(s.tokens) == s.request.max_new_tokens or tok[j] == s.request.eos_token_id:
                done[j] = True
                s.status = "finished"
        pad = tuple(i for i, d in zip(idx, done) if d and i not in live)
        steps.append(Step(t_a, now(), prefill if step == 0 else (), () if step == 0 else tuple(live), pad))


# --------------------------------------------------------------------------------------------------------- load

def poisson_arrivals(rate: float, n: int, *, seed: int = 0) -> list[float]:
    """n arrival times (seconds) of a Poisson process of `rate` requests per second: exponential gaps, seeded
    (chapter 04)."""
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"the arrival rate must be a positive number of requests per second, got {rate}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def workload(n: int, *, vocab: int, rate: float | None = None, prompt_median: float = 64,
             output_median: float = 32, sigma: float = 0.6, max_len: int = 512, seed: int = 0,
             eos_token_id: int | None = None, first_token: int = 3) -> list[Request]:
    """n requests whose prompt and output lengths are lognormal (chapter 03's `sample_requests`: the given medians
    and log-sd, total capped at max_len), prompts of random token ids, arriving all at once (rate None) or as a
    Poisson process of `rate` per second (chapter 04)."""
    from .memory import sample_requests
    prompts, outputs = sample_requests(n, max_len=max_len, prompt_median=prompt_median,
                                       output_median=output_median, sigma=sigma, seed=seed)
    arrivals = [0.0] * n if rate is None else poisson_arrivals(rate, n, seed=seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    return [Request(tuple(torch.randint(first_token, vocab, (p,), generator=g).tolist()), o, a,
                    eos_token_id=eos_token_id) for p, o, a in zip(prompts, outputs, arrivals)]


def requests_from(rows: Sequence[tuple[float, Sequence[int], int]]) -> list[Request]:
    """Replay a list of (arrival seconds, prompt token ids, output length) (chapter 04)."""
    return [Request(tuple(p), int(n), float(a)) for a, p, n in rows]


# ------------------------------------------------------------------------------------------------------ figures

def gantt(ax, report: Report, *, first: int = 0, count: int | None = None, title: str | None = None) -> None:
    """A request-scheduling timeline of a real run: one row per request, from its arrival: waiting (grey), the
    steps that prefilled it (dark blue), decoded it (orange), and, in static batching, computed its row after it had
    finished (red hatch) (chapter 04)."""
    rows = report.served[first:first + count if count else None]
    pos = {s.index: i for i, s in enumerate(rows)}
    bars: dict[str, dict[int, list[tuple[float, float]]]] = {k: {} for k in ("prefill", "decode", "padding")}
    for st in report.steps:
        w = st.end - st.start
        for kind, idx in (("prefill", [i for i, _ in st.prefill]), ("decode", st.decode), ("padding", st.padding)):
            for i in idx:
                if i in pos:
                    bars[kind].setdefault(i, []).append((st.start, w))
    style = {"prefill": dict(facecolors="tab:blue"), "decode": dict(facecolors="tab:orange"),
             "padding": dict(facecolors="none", edgecolors="tab:red", hatch="////", linewidth=0)}
    for s in rows:
        y = pos[s.index]
        r = s.request
        if s.status == "rejected":
            ax.plot([r.arrival], [y], "x", color="tab:red", ms=6)
            continue
        if s.started is not None and s.started > 0:
            ax.broken_barh([(r.arrival, s.started)], (y - 0.35, 0.7), facecolors="0.85")
        for kind, opts in style.items():
            if s.index in bars[kind]:
                ax.broken_barh(bars[kind][s.index], (y - 0.35, 0.7), **opts)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("request")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(facecolor="0.85", label="waiting"), Patch(facecolor="tab:blue", label="prefill"),
                       Patch(facecolor="tab:orange", label="decode")]
              + ([Patch(facecolor="none", edgecolor="tab:red", hatch="////", label="padding\n(done, still\ncomputed)")]
                 if bars["padding"] else []), fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or report.name)


def table(reports: Sequence[Report], *, columns: Sequence[str] = ("tokens/s", "ttft p50 ms", "ttft p95 ms",
          "tpot p50 ms", "tpot p95 ms", "queue p95 ms")) -> str:
    """Reports side by side, one line each, as fixed-width text; latencies in ms (chapter 04)."""
    width = max([len(r.name) for r in reports] + [len("(latencies in ms)")])
    labels = [c.replace(" ms", "").replace("ttft", "TTFT").replace("tpot", "TPOT") for c in columns]
    sizes = [max(9, len(lab) + 1) for lab in labels]
    lines = [f"{'(latencies in ms)':<{width}}" + "".join(f"{lab:>{n}}" for lab, n in zip(labels, sizes))]
    for r in reports:
        row = r.row()
        cells = ("n/a" if math.isnan(row[c]) else f"{row[c]:,.1f}" if row[c] < 100 else f"{row[c]:,.0f}"
                 for c in columns)
        lines.append(f"{r.name:<{width}}" + "".join(f"{v:>{n}}" for v, n in zip(cells, sizes)))
    return "\n".join(lines)
