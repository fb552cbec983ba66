"""Speculative decoding (chapter 05): a cheap draft proposes tokens, the target checks them all in one pass and keeps
what it would have produced itself; and the acceptance rate alpha that decides how much that saves (appendix A)."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .device import synchronize

__all__ = ["logits_of", "acceptance_rates", "windows", "tail_loop", "verify", "lookup", "ModelDraft",
           "PromptLookup", "Round", "Run", "generate", "timeline", "Costs", "step_costs", "GammaPoint", "Comparison",
           "compare", "expected_tokens", "predicted_speedup", "best_gamma", "output_distribution", "tv_distance",
           "tv_samples_needed", "pooled_tv", "tv_test"]


def logits_of(model, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [batch, seq, vocab] of a transformers causal LM or of the book's decoder, in fp32."""
    if hasattr(model, "config"):                      # transformers
        return model(input_ids=tokens).logits.float()
    return model(tokens).float()                      # book.llama.Llama


def tail_loop(tokens: Sequence[int] | torch.Tensor, min_tokens: int = 12) -> tuple[int, int]:
    """The loop a token sequence ends in, as (period, tokens it covers); (0, 0) when it ends in none.

    A sequence ends in a loop of period p when its last tokens repeat the p tokens before them: at least two full
    copies of the cycle (a trailing partial copy counts too) covering at least `min_tokens` tokens. Greedy decoding
    of a small model often ends this way, the same line or word over and over (appendix A). Of the periods that
    qualify, the one covering the most tokens wins (the shortest on a tie).
    """
    t = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    if min_tokens < 2:
        raise ValueError(f"min_tokens must be at least 2, got {min_tokens}")
    best = (0, 0)
    for p in range(1, len(t) // 2 + 1):
        run = 0
        while run < len(t) - p and t[-1 - run] == t[-1 - run - p]:
            run += 1
        covered = run + p
        if run >= p and covered >= min_tokens and covered > best[1]:
            best = (p, covered)
    return best


def windows(tokens: torch.Tensor, length: int, max_windows: int | None = None, *,
            spread: bool = False) -> torch.Tensor:
    """Non-overlapping windows [n, length] cut from a 1-D token stream: the first `max_windows` of them, or with
    `spread` that many spread evenly over the whole stream, so a sample of a corpus of many files is not a few of
    its files (appendix A)."""
    if tokens.dim() != 1:
        raise ValueError(f"expected a 1-D token stream, got shape {tuple(tokens.shape)}")
    if length < 2:
        raise ValueError(f"window length must be at least 2, got {length}")
    n = len(tokens) // length
    if n < 1:
        raise ValueError(f"a stream of {len(tokens)} tokens holds no window of {length}")
    every = tokens[:n * length].view(n, length)
    if max_windows is None or max_windows >= n:
        return every
    if max_windows < 1:
        raise ValueError(f"max_windows must be at least 1, got {max_windows}")
    if not spread:
        return every[:max_windows]
    return every[torch.linspace(0, n - 1, max_windows).round().long()]


@torch.no_grad()
def acceptance_rates(target, draft, batches: torch.Tensor | Sequence[torch.Tensor], *, skip: int = 0,
                     temperatures: Sequence[float] = (1.0,), batch_size: int = 8) -> dict:
    """Alpha of `draft` against `target` at every position of `batches` [n, seq] (teacher-forced).

    greedy: the share of positions where both models' most likely next token is the same, which is the chance a
    drafted token survives greedy verification. At temperature T, sum_x min(p_T(x), q_T(x)), the chance that
    speculative sampling accepts a token drawn from the draft (Leviathan et al., 2023). `skip` ignores the first
    positions of each row (for example a prompt). "greedy_rows": the greedy share of each row, and "greedy_se" the
    standard error of their mean (rows are the independent samples; positions within a row are not).
    """
    if isinstance(batches, torch.Tensor):
        batches = [batches[i:i + batch_size] for i in range(0, len(batches), batch_size)]
    if any(t <= 0 for t in temperatures):
        raise ValueError(f"temperatures must be positive, got {list(temperatures)}; greedy is reported anyway")
    device = next(target.parameters()).device
    agree, total, rows = 0, 0, []
    mass = {float(t): 0.0 for t in temperatures}
    for x in batches:
        if x.dim() != 2 or x.shape[1] <= skip:
            raise ValueError(f"expected [batch, seq] with seq > skip={skip}, got {tuple(x.shape)}")
        x = x.to(device)
        p, q = logits_of(target, x)[:, skip:], logits_of(draft, x.to(next(draft.parameters()).device))[:, skip:]
        q = q.to(p.device)
        if p.shape != q.shape:
            raise ValueError(f"target and draft disagree on the vocabulary: {tuple(p.shape)} vs {tuple(q.shape)}")
        same = p.argmax(-1) == q.argmax(-1)
        agree += int(same.sum())
        rows += same.float().mean(-1).tolist()
        total += p.shape[0] * p.shape[1]
        for t in mass:
            mass[t] += float(torch.minimum(torch.softmax(p / t, -1), torch.softmax(q / t, -1)).sum())
    se = statistics.stdev(rows) / math.sqrt(len(rows)) if len(rows) > 1 else float("nan")
    return {"greedy": agree / total, "sampled": {t: m / total for t, m in mass.items()}, "positions": total,
            "greedy_rows": rows, "greedy_se": se}


# ------------------------------------------------------------------------------------------------ chapter 05

def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def verify(p: torch.Tensor, q: torch.Tensor | None, drafted: Sequence[int], *, temperature: float,
           generator: torch.Generator | None = None, residual: bool = True, ratio: bool = True
           ) -> tuple[int, int]:
    """Check drafted tokens against the target (chapter 05): returns (how many are accepted, the next token).

    p: the target's probabilities [k+1, V] at the k drafted positions and one past them; q: the draft's [k, V], or
    None for a draft that proposes deterministically (prompt lookup: q is one at the drafted token). Greedy
    (temperature 0): accept while the target's most likely token is the drafted one; the next token is the target's
    choice where they differ, or a bonus from p[k] when all are accepted. Sampled: accept token x with probability
    min(1, p(x)/q(x)); on the first rejection draw the next token from the residual max(0, p - q), renormalised, so
    that every token comes out with exactly the target's probability (Leviathan et al. 2023; Chen et al. 2023).
    `residual=False` (draw from p instead) and `ratio=False` (accept exactly when q(x) <= p(x)) are the two broken
    variants chapter 05 shows its exactness test catching.
    """
    k = len(drafted)
    if p.shape[0] != k + 1 or (q is not None and q.shape[0] != k):
        raise ValueError(f"need p for {k + 1} positions and q for {k}, got {tuple(p.shape)} and "
                         f"{None if q is None else tuple(q.shape)}")
    if temperature <= 0:
        best = p[:k + 1].argmax(-1).tolist()
        n = 0
        while n < k and best[n] == drafted[n]:
            n += 1
        return n, best[n]
    dev = p.device
    for i, x in enumerate(drafted):
        px = float(p[i, x])
        qx = 1.0 if q is None else float(q[i, x])
        if ratio:          # one uniform number per checked token, drawn in order
            ok = float(torch.rand((), generator=generator, device=dev)) < min(1.0, px / qx) if qx > 0 else True
        else:
            ok = px >= qx
        if not ok:
            if residual:
                r = p[i].clone()
                if q is None:
                    r[x] = 0.0
                else:
                    r = (r - q[i]).clamp_min(0.0)
                total = float(r.sum())
                r = p[i] if total <= 0 else r / total
            else:
                r = p[i]
            return i, int(torch.multinomial(r, 1, generator=generator)[0])
    return k, int(torch.multinomial(p[k], 1, generator=generator)[0])


class ModelDraft:
    """A small language model as the draft (chapter 05): the book's decoder with its own KV cache, kept in step with
    the accepted text (rejected drafts are rewound, O(1))."""

    name = "draft model"

    def __init__(self, model, name: str | None = None):
        self.model = model
        self.name = name or getattr(model.arch, "name", "draft model")
        self.calls = 0

    def start(self, tokens: Sequence[int], room: int) -> None:
        """A new sequence: the prompt (and any tokens already generated) and the positions it may grow to."""
        _ensure_cache(self.model, room)
        self.cached = 0                     # tokens of the context in the draft's cache
        self.context = list(tokens)

    def propose(self, k: int, temperature: float, generator: torch.Generator | None
                ) -> tuple[list[int], torch.Tensor | None]:
        """k drafted tokens and the draft's probabilities [k, V] they were drawn from (greedy: None)."""
        m = self.model
        pending = torch.tensor(self.context[self.cached:], device=m.device)
        logits = m.extend(pending[None])[0, -1]
        self.calls += 1
        out, qs = [], []
        for i in range(k):
            if temperature <= 0:
                x = int(logits.argmax())
            else:
                q = _probs(logits, temperature)
                x = int(torch.multinomial(q, 1, generator=generator)[0])
                qs.append(q)
            out.append(x)
            if i + 1 < k:
                logits = m.decode_step(torch.tensor([x], device=m.device))[0]
                self.calls += 1
        self.cached = len(self.context) + k - 1      # the last drafted token is never fed
        return out, (torch.stack(qs) if qs else None)

    def accept(self, tokens: Sequence[int]) -> None:
        """The target's verdict: `tokens` (accepted drafts plus its own next token) join the context."""
        keep = min(self.cached, len(self.context) + max(0, len(tokens) - 1))
        self.cached = keep
        self.model.rewind(keep)
        self.context.extend(tokens)


def lookup(tokens: Sequence[int], k: int, ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Prompt lookup's guess (chapter 05): up to k tokens that followed the most recent earlier occurrence of the
    text's final n tokens, trying n = ngram down to min_ngram; [] when the tail never occurred before."""
    t = tokens
    for n in range(min(ngram, len(t) - 1), min_ngram - 1, -1):
        tail = list(t[-n:])
        for start in range(len(t) - n - 1, -1, -1):           # the most recent earlier match
            if list(t[start:start + n]) == tail:
                return list(t[start + n:start + n + k])
    return []


class PromptLookup:
    """Prompt lookup (chapter 05): propose what followed the last earlier occurrence of the text's final n tokens,
    in the prompt or the text generated so far; no model, no cost, and deterministic (q is one at each guess)."""

    def __init__(self, ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= ngram:
            raise ValueError(f"need 1 <= min_ngram <= ngram, got {min_ngram} and {ngram}")
        self.ngram, self.min_ngram = ngram, min_ngram
        self.name = f"prompt lookup ({ngram}-gram)"
        self.calls = 0

    def start(self, tokens: Sequence[int], room: int) -> None:
        self.context = list(tokens)

    def propose(self, k: int, temperature: float, generator: torch.Generator | None
                ) -> tuple[list[int], None]:
        return lookup(self.context, k, self.ngram, self.min_ngram), None

    def accept(self, tokens: Sequence[int]) -> None:
        self.context.extend(tokens)


@dataclass
class Round:
    """One draft-and-verify round (chapter 05): times in seconds since the run started, what was proposed, how many
    the target kept, and the token it added."""
    draft_start: float
    draft_end: float
    verify_end: float
    proposed: list[int]
    accepted: int
    next_token: int


@dataclass
class Run:
    """A speculative generation: its tokens, every round, and the counts the speedup formula needs (chapter 05)."""
    tokens: list[int]
    rounds: list[Round] = field(default_factory=list)
    gamma: int = 0
    draft_calls: int = 0
    target_calls: int = 0
    seconds: float = 0.0

    @property
    def proposed(self) -> int:
        return sum(len(r.proposed) for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def acceptance(self) -> float:
        """Drafted tokens kept over drafted tokens proposed (chapter 05)."""
        return self.accepted / self.proposed if self.proposed else math.nan

    @property
    def tokens_per_call(self) -> float:
        """Tokens generated per target pass: 1 for plain decoding, up to gamma + 1 here (chapter 05)."""
        return len(self.tokens) / self.target_calls if self.target_calls else math.nan

    @property
    def rejections(self) -> int:
        """Rounds that ended on a rejected draft token (chapter 05)."""
        return sum(r.accepted < len(r.proposed) for r in self.rounds)

    @property
    def alpha(self) -> float:
        """The acceptance rate this run shows: drafted tokens kept over drafted tokens the target checked (those after
        a rejection are never checked), the estimate that matches the formula's independent-tokens model
        (chapter 05)."""
        checked = self.accepted + self.rejections
        return self.accepted / checked if checked else math.nan


def _ensure_cache(model, room: int) -> None:
    """A batch-1 cache of at least `room` positions, reused from the last generation when it is big enough."""
    c = model.cache
    if c is None or c.max_len < room or c.k.dtype != model.dtype or c.k.device != model.device:
        model.setup_cache(1, room)
    model.cache.reset(1)


@torch.no_grad()
def generate(target, draft, prompt: Sequence[int] | torch.Tensor, max_new_tokens: int, *, gamma: int = 4,
             temperature: float = 0.0, generator: torch.Generator | None = None,
             eos_token_id: int | None = None) -> Run:
    """Speculative decoding of one prompt with the book's decoder as target (chapter 05).

    The target prefills the prompt and picks the first token as usual; then each round the draft (a `ModelDraft`
    or `PromptLookup`) proposes up to `gamma` tokens, the target scores all of them in one `extend` pass, `verify`
    keeps a prefix and adds one token of the target's own, and both caches are rewound past what was rejected.
    Greedy output equals the target's own greedy output; sampled output has exactly the target's distribution.
    """
    prompt = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
    if not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (tokens drafted per round) must be an integer >= 1, got {gamma!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token")
    limit = target.arch.max_context
    if len(prompt) + max_new_tokens > limit:
        raise ValueError(f"a prompt of {len(prompt)} tokens plus {max_new_tokens} new ones needs "
                         f"{len(prompt) + max_new_tokens} positions; {target.arch.name} allows {limit}")
    if isinstance(draft, ModelDraft):
        dv, tv = draft.model.arch.vocab, target.arch.vocab
        if dv != tv:
            raise ValueError(f"the draft's vocabulary ({dv} tokens) differs from the target's ({tv}): "
                             f"their token ids do not mean the same thing")
        if len(prompt) + max_new_tokens > draft.model.arch.max_context:
            raise ValueError(f"the draft {draft.name} allows {draft.model.arch.max_context} positions, fewer "
                             f"than the {len(prompt) + max_new_tokens} this generation needs")
    dev = target.device
    room = len(prompt) + max_new_tokens + gamma
    _ensure_cache(target, min(room, limit))
    draft.start(prompt, min(room, limit))
    calls0 = draft.calls
    run = Run([], gamma=gamma)
    t0 = time.perf_counter()
    logits = target.prefill(torch.tensor([prompt], device=dev))[0]
    first = int(logits.argmax()) if temperature <= 0 else int(
        torch.multinomial(_probs(logits, temperature), 1, generator=generator)[0])
    run.target_calls = 1
    run.tokens.append(first)
    draft.accept([first])
    while len(run.tokens) < max_new_tokens and run.tokens[-1] != eos_token_id:
        k = min(gamma, max_new_tokens - len(run.tokens) - 1)
        synchronize(dev)
        t_a = time.perf_counter() - t0
        proposed, q = draft.propose(k, temperature, generator) if k > 0 else ([], None)
        proposed = proposed[:k]
        q = None if q is None else q[:len(proposed)]
        synchronize(dev)
        t_b = time.perf_counter() - t0
        base = len(prompt) + len(run.tokens) - 1           # cached in the target; the last token is pending
        x = torch.tensor([[run.tokens[-1], *proposed]], device=dev)
        logits = target.extend(x)[0]
        run.target_calls += 1
        scores = logits if temperature <= 0 else _probs(logits, temperature)
        n, nxt = verify(scores, q, proposed, temperature=temperature, generator=generator)
        if hasattr(draft, "observe"):          # a draft that learns from the target's pass (chapter 06's Jacobi)
            draft.observe(logits, n)
        target.rewind(base + 1 + n)
        new = proposed[:n] + [nxt]
        if eos_token_id is not None and eos_token_id in new:
            new = new[:new.index(eos_token_id) + 1]
        new = new[:max_new_tokens - len(run.tokens)]
        run.tokens.extend(new)
        draft.accept(new)
        synchronize(dev)
        run.rounds.append(Round(t_a, t_b, time.perf_counter() - t0, proposed, n, nxt))
    run.seconds = time.perf_counter() - t0
    run.draft_calls = draft.calls - calls0
    return run


def timeline(axes, run: Run, *, rounds: int = 12, title: str = "") -> None:
    """Draw the first `rounds` rounds of a run on two axes (chapter 05): a clock with the draft's and the target's
    busy time, and per round the drafted tokens the target kept, the one it rejected, and the token it added."""
    top, bottom = axes
    rs = run.rounds[:rounds]
    if not rs:
        raise ValueError("the run has no draft-and-verify rounds to draw")
    t0 = rs[0].draft_start
    for i, r in enumerate(rs):
        d0, d1, v1 = ((x - t0) * 1e3 for x in (r.draft_start, r.draft_end, r.verify_end))
        top.broken_barh([(d0, d1 - d0)], (1.1, 0.8), color="tab:gray")
        top.broken_barh([(d1, v1 - d1)], (0.1, 0.8), color="tab:blue")
        top.text((d1 + v1) / 2, 0.5, f"{r.accepted}/{len(r.proposed)}", ha="center", va="center", fontsize=9,
                 color="white")
    top.set(yticks=[0.5, 1.5], yticklabels=["target\n(verify)", "draft"], xlabel="milliseconds",
            ylim=(0, 2))
    top.set_title(title or "each round: the draft proposes, the target checks all in one pass (kept/proposed)")
    x = range(len(rs))
    kept = [r.accepted for r in rs]
    lost = [len(r.proposed) - r.accepted for r in rs]
    bottom.bar(x, kept, color="tab:green", label="drafted, kept")
    bottom.bar(x, [1] * len(rs), bottom=kept, color="tab:blue", label="the target's own token")
    bottom.bar(x, lost, bottom=[k + 1 for k in kept], color="tab:red", alpha=0.5, label="drafted, discarded")
    top_row = max(len(r.proposed) for r in rs) + 1
    bottom.set(xlabel="round", ylabel="tokens", xticks=list(x), ylim=(0, top_row * 1.4))   # room for the legend
    bottom.legend(fontsize=8, ncols=3, loc="upper left")


# ----------------------------------------------------------------------------------------- measured costs

@dataclass
class Costs:
    """Seconds per call at one context length (chapter 05): the target's decode step, the draft's decode step, and
    the target's `extend` over k tokens (verifying k - 1 drafts plus the pending token) for each k timed."""
    target_step: float
    draft_step: float
    verify: dict[int, float]
    context: int

    @property
    def c(self) -> float:
        """The draft's step over the target's: the cost ratio c of the speedup formula (chapter 05)."""
        return self.draft_step / self.target_step

    def v(self, k: int) -> float:
        """The target's pass over k tokens, in target decode steps (1 while a step is memory-bound) (chapter 05)."""
        if k not in self.verify:
            raise KeyError(f"no verification of {k} tokens was timed; timed: {sorted(self.verify)}")
        return self.verify[k] / self.target_step


@torch.no_grad()
def step_costs(target, draft_model, prompt: Sequence[int], ks: Sequence[int] = (1, 2, 3, 4, 5, 7, 9), *,
               repeats: int = 15) -> Costs:
    """Time the target's decode step, the draft's and the target's k-token pass at the prompt's length, each call
    rewound so the context stays put, all of them in turn for `repeats` rounds (`book.timing.time_in_turn`: a
    machine whose speed drifts slows each alike, so their ratios c and v hold) (chapter 05)."""
    from .timing import time_in_turn
    prompt = list(prompt)
    n = len(prompt)
    fns: dict = {}
    for name, m in (("target", target), ("draft", draft_model)):
        if m is None:
            continue
        _ensure_cache(m, n + max(ks) + 1)
        m.prefill(torch.tensor([prompt], device=m.device))
        x = torch.tensor([prompt[-1]], device=m.device)

        def step(m=m, x=x) -> None:
            m.decode_step(x)
            m.rewind(n)
        fns[name] = step
    for k in ks:
        x = torch.tensor([prompt[-k:] if k <= n else (prompt * k)[:k]], device=target.device)

        def ext(x=x) -> None:
            target.extend(x)
            target.rewind(n)
        fns[k] = ext
    ts = time_in_turn(fns, device=target.device, warmup=3, rounds=repeats)
    return Costs(ts["target"].median, ts["draft"].median if "draft" in ts else math.nan,
                 {k: ts[k].median for k in ks}, n)


@dataclass
class GammaPoint:
    """One draft length in a comparison (chapter 05): wall seconds over all prompts, tokens, calls, the runs'
    alpha, how many prompts gave exactly the plain output (greedy), and the runs themselves."""
    gamma: int
    seconds: float
    tokens: int
    target_calls: int
    draft_calls: int
    alpha: float
    identical: int
    runs: list

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / self.target_calls

    @property
    def rounds(self) -> list[Round]:
        return [r for run in self.runs for r in run.rounds]

    @property
    def tokens_per_round(self) -> float:
        """Tokens a full round yields, the drafts kept plus the target's own: the measured side of
        `expected_tokens` (the prefill's token and the short last rounds at the token limit left out) (chapter 05)."""
        full = [r.accepted + 1 for r in self.rounds if len(r.proposed) == self.gamma]
        return sum(full) / len(full) if full else math.nan

    @property
    def draft_call_s(self) -> float:
        """Seconds per draft call inside the runs (drafting time over draft calls); nan for a draft with no calls
        (chapter 05)."""
        return sum(r.draft_end - r.draft_start for r in self.rounds) / self.draft_calls if self.draft_calls \
            else math.nan

    @property
    def verify_s(self) -> float:
        """Seconds per verification pass of a full round (gamma drafts plus the pending token) inside the runs
        (chapter 05)."""
        full = [r.verify_end - r.draft_end for r in self.rounds if len(r.proposed) == self.gamma]
        return sum(full) / len(full) if full else math.nan


@dataclass
class Comparison:
    """Plain decoding and speculative decoding with each draft at several gammas on the same prompts, timed prompt
    by prompt (chapter 05): plain outputs, plain seconds, and per draft name one `GammaPoint` per gamma."""
    reference: list[list[int]]
    plain_seconds: float
    points: dict[str, list[GammaPoint]]

    @property
    def step_s(self) -> float:
        """Plain decoding's seconds per token: the unit the speedup formula counts costs in (chapter 05)."""
        return self.plain_seconds / sum(len(r) for r in self.reference)

    def point(self, draft: str, gamma: int) -> GammaPoint:
        if draft not in self.points:
            raise KeyError(f"no draft {draft!r}; drafts: {list(self.points)}")
        for p in self.points[draft]:
            if p.gamma == gamma:
                return p
        raise KeyError(f"gamma {gamma} was not run; run: {[p.gamma for p in self.points[draft]]}")

    def speedup(self, draft: str, gamma: int) -> float:
        """Plain seconds over speculative seconds on the same prompts (chapter 05)."""
        return self.plain_seconds / self.point(draft, gamma).seconds


def compare(target, drafts: dict, prompts: Sequence[Sequence[int]], max_new_tokens: int, gammas: Sequence[int], *,
            temperature: float = 0.0, seed: int = 0) -> Comparison:
    """Decode each prompt plainly (the book's `generate`) and then speculatively with every draft (name -> draft)
    at every gamma, prompt by prompt, so that a machine whose speed drifts over seconds (a shared cloud VM) affects
    both sides alike; times are summed over prompts (chapter 05)."""
    gammas = list(gammas)
    if not gammas or not drafts:
        raise ValueError("give at least one draft and one gamma")
    dev = target.device
    reference, plain_s = [], 0.0
    secs = {(d, g): 0.0 for d in drafts for g in gammas}
    runs: dict[tuple, list[Run]] = {k: [] for k in secs}
    for i, p in enumerate(prompts):
        synchronize(dev)
        t0 = time.perf_counter()
        gen = torch.Generator(device=dev).manual_seed(seed + i)
        ref = target.generate([list(p)], max_new_tokens, temperature=temperature, generator=gen)[0].tolist()
        synchronize(dev)
        plain_s += time.perf_counter() - t0
        reference.append(ref)
        for (name, g) in secs:
            gen = torch.Generator(device=dev).manual_seed(seed + i)
            synchronize(dev)
            t0 = time.perf_counter()
            runs[name, g].append(generate(target, drafts[name], p, max_new_tokens, gamma=g,
                                          temperature=temperature, generator=gen))
            synchronize(dev)
            secs[name, g] += time.perf_counter() - t0
    points: dict[str, list[GammaPoint]] = {d: [] for d in drafts}
    for (name, g), rs in runs.items():
        acc = sum(r.accepted for r in rs)
        checked = acc + sum(r.rejections for r in rs)
        points[name].append(GammaPoint(g, secs[name, g], sum(len(r.tokens) for r in rs),
                                       sum(r.target_calls for r in rs), sum(r.draft_calls for r in rs),
                                       acc / checked if checked else math.nan,
                                       sum(r.tokens == ref for r, ref in zip(rs, reference)), rs))
    return Comparison(reference, plain_s, points)


# ------------------------------------------------------------------------------------ the speedup formula

def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens a round yields on average when each drafted token survives with probability alpha, independently:
    (1 - alpha^(gamma+1)) / (1 - alpha) (chapter 05)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha is a probability, got {alpha}")
    if not isinstance(gamma, int) or gamma < 0:
        raise ValueError(f"gamma must be an integer >= 0, got {gamma!r}")
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """Speculative over plain decoding, tokens per second: expected tokens per round over the round's cost in
    target steps, gamma drafts of c each plus one verification pass of `verify_cost` (1 while memory-bound)
    (chapter 05; Leviathan et al. 2023)."""
    if not c >= 0 or not verify_cost > 0:
        raise ValueError(f"need a draft cost c >= 0 and a verification cost > 0, got {c} and {verify_cost}")
    return expected_tokens(alpha, gamma) / (gamma * c + verify_cost)


def best_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """The draft length with the highest predicted speedup, 1..max_gamma (chapter 05). The default searches far
    enough for every alpha <= 0.95 at c >= 0.01 (the best gamma there is 40)."""
    return max(range(1, max_gamma + 1), key=lambda g: predicted_speedup(alpha, g, c))


# --------------------------------------------------------------------------------------- exactness test

def output_distribution(p: torch.Tensor, q: torch.Tensor, *, residual: bool = True, ratio: bool = True
                        ) -> torch.Tensor:
    """The exact distribution of the token one drafted position yields, drafting from q and verifying against p with
    `verify`'s rule (p itself) or one of its broken variants (chapter 05)."""
    accepted = torch.minimum(p, q) if ratio else torch.where(q <= p, q, torch.zeros_like(q))
    r = (p - q).clamp_min(0) if residual else p
    total = r.sum()
    return accepted + (1 - accepted.sum()) * (r / total if total > 0 else p)


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> float:
    """Total-variation distance between two distributions over the same outcomes: half the L1 gap (chapter 05)."""
    return 0.5 * float((p.double() - q.double()).abs().sum())


def tv_samples_needed(categories: int, eps: float, delta: float = 1e-3) -> int:
    """Samples for a TV test that detects any distribution at TV >= eps from the target's with probability
    >= 1 - delta, and raises a false alarm with probability <= delta: the empirical distribution of n samples is
    within eps/2 of the truth except with probability 2^k exp(-n eps^2 / 2) (Bretagnolle-Huber-Carol) (chapter 05)."""
    if categories < 1 or not 0 < eps <= 1 or not 0 < delta < 1:
        raise ValueError(f"need categories >= 1, 0 < eps <= 1, 0 < delta < 1; got {categories}, {eps}, {delta}")
    return math.ceil(2 * (categories * math.log(2) + math.log(1 / delta)) / eps ** 2)


def pooled_tv(a: torch.Tensor, p: torch.Tensor, min_mass: float) -> float:
    """TV distance between distributions `a` and `p` over the outcomes `tv_test` tells apart: those with p at least
    `min_mass`, the rest pooled into one 'other' category (at most the full TV distance) (chapter 05)."""
    a, p = a.double().flatten().cpu(), p.double().flatten().cpu()
    keep = p >= min_mass
    pe = torch.cat([p[keep], (1 - p[keep].sum()).clamp_min(0)[None]])
    ae = torch.cat([a[keep], (1 - a[keep].sum()).clamp_min(0)[None]])
    return tv_distance(ae, pe)


def tv_test(samples: Sequence[int] | torch.Tensor, p: torch.Tensor, *, eps: float, delta: float = 1e-3,
            min_mass: float | None = None) -> dict:
    """Do `samples` (token ids) come from p? Outcomes rarer than `min_mass` (default eps / 64) are pooled
    into one 'other' category; passes when the empirical TV distance is below eps/2. Returns the distance, the
    sample size the guarantee needs, and whether it passed (chapter 05)."""
    s = torch.as_tensor(samples, dtype=torch.long).flatten().cpu()
    p = p.double().flatten().cpu()
    if s.numel() == 0:
        raise ValueError("no samples")
    mass = min_mass if min_mass is not None else eps / 64
    k = int((p >= mass).sum()) + 1
    emp = torch.bincount(s, minlength=p.numel()).double() / s.numel()
    d = pooled_tv(emp, p, mass)
    need = tv_samples_needed(k, eps, delta)
    return {"tv": d, "threshold": eps / 2, "categories": k, "samples": s.numel(), "needed": need,
            "passed": d < eps / 2, "powered": s.numel() >= need}
