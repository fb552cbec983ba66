"""More than one token per pass from a model trained left to right: Jacobi and lookahead decoding (chapter 06).

Greedy decoding is a fixed-point problem: the n tokens after a prompt are the vector y with y_i = argmax p(. | prompt,
y_<i) for every i at once. Jacobi iteration guesses all n, then recomputes every y_i from the previous guesses in one
parallel pass, until nothing changes. Each pass fixes at least the first wrong position, so a block of n converges in
at most n passes, to exactly the greedy output; it gains only when a pass gets several positions right at once.

- `jacobi_block`: one block of n tokens iterated to its fixed point, with the guesses after every pass.
- `JacobiDraft`: the same iteration sliding along the text, as a draft for `book.speculative.generate`: each round
  proposes the target's own predictions from its previous pass, and the pass that verifies them computes the next.
- `LookaheadDraft`: Jacobi guesses plus a pool of n-grams collected from the passes' predictions, proposed when the
  text reaches a token that began one: a sequential simplification of lookahead decoding (Fu et al., 2024), which
  runs its lookahead branch and its n-gram verification side by side in one pass with a special attention mask.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .speculative import _ensure_cache

__all__ = ["JacobiBlock", "jacobi_block", "JacobiDraft", "LookaheadDraft"]


@dataclass
class JacobiBlock:
    """A block of tokens iterated to its fixed point (chapter 06)."""
    first: int                          # the token the prompt's own pass gives (known before any iteration)
    tokens: list[int]                   # the n tokens after it, at the fixed point
    trajectory: list[list[int]] = field(default_factory=list)   # the guesses after each pass, last = fixed point

    @property
    def passes(self) -> int:
        """Parallel passes run, the last one confirming that nothing changed."""
        return len(self.trajectory)

    @property
    def converged_after(self) -> int:
        """The first pass after which the guesses equal the fixed point (<= n): the passes a block really needs."""
        return next(i + 1 for i, g in enumerate(self.trajectory) if g == self.tokens)

    @property
    def tokens_per_pass(self) -> float:
        """Tokens of the block over the passes it needed: 1 when each pass fixes one token, n at best."""
        return len(self.tokens) / self.converged_after


def _check(model, prompt: Sequence[int], n: int) -> list[int]:
    prompt = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n (tokens in the block) must be an integer >= 1, got {n!r}")
    limit = model.arch.max_context
    if len(prompt) + n + 1 > limit:
        raise ValueError(f"a prompt of {len(prompt)} tokens and a block of {n} after its first token need "
                         f"{len(prompt) + n + 1} positions; {model.arch.name} allows {limit}")
    return prompt


@torch.no_grad()
def jacobi_block(model, prompt: Sequence[int] | torch.Tensor, n: int, *, init: Sequence[int] | None = None,
                 max_passes: int | None = None) -> JacobiBlock:
    """Greedy decoding of the n tokens after the prompt's first one by Jacobi iteration with the book's decoder
    (chapter 06): the prompt is cached once; each pass feeds the first token and the n - 1 first guesses, takes
    every position's argmax as the new guesses and rewinds the cache. Stops when a pass changes nothing (at most
    n + 1 passes; `max_passes` caps it). `init` is the starting guess (default: the first token, n times)."""
    prompt = _check(model, prompt, n)
    if init is not None and len(init) != n:
        raise ValueError(f"init must give n = {n} guesses, got {len(init)}")
    cap = n + 1 if max_passes is None else max_passes
    if not isinstance(cap, int) or cap < 1:
        raise ValueError(f"max_passes must be an integer >= 1, got {max_passes!r}")
    dev = model.device
    _ensure_cache(model, len(prompt) + n + 1)
    first = int(model.prefill(torch.tensor([prompt], device=dev))[0].argmax())
    guess = list(init) if init is not None else [first] * n
    block = JacobiBlock(first, guess)
    for _ in range(cap):
        logits = model.extend(torch.tensor([[first, *guess[:-1]]], device=dev))[0]
        model.rewind(len(prompt))
        new = logits.argmax(-1).tolist()
        block.trajectory.append(new)
        if new == guess:
            break
        guess = new
    block.tokens = block.trajectory[-1]       # the fixed point, or the last guesses if max_passes stopped it first
    return block


class JacobiDraft:
    """Jacobi decoding as a draft (chapter 06): propose the target's own predictions from the pass that verified the
    last round (the first round: the last token repeated). `book.speculative.generate` calls `observe` with that
    pass's logits; greedy only, so the output is the target's greedy output."""

    name = "Jacobi"

    def __init__(self):
        self.calls = 0                   # no model of its own: every pass is the target's
        self.guess: list[int] = []

    def start(self, tokens: Sequence[int], room: int) -> None:
        self.context = list(tokens)
        self.guess = []

    def _jacobi(self, k: int) -> list[int]:
        g = self.guess[:k]
        return g + [g[-1] if g else self.context[-1]] * (k - len(g))

    def propose(self, k: int, temperature: float, generator: torch.Generator | None) -> tuple[list[int], None]:
        if temperature > 0:
            raise NotImplementedError("Jacobi and lookahead decoding here are greedy (temperature 0)")
        return self._jacobi(k), None

    def observe(self, logits: torch.Tensor, accepted: int) -> None:
        """The verifying pass's logits [k + 1, V] and how many proposals it kept: its predictions after the token it
        added are the next guesses."""
        self.guess = logits.argmax(-1).tolist()[accepted + 1:]

    def accept(self, tokens: Sequence[int]) -> None:
        self.context.extend(tokens)


class LookaheadDraft(JacobiDraft):
    """Jacobi guesses plus an n-gram pool gathered from the Jacobi trajectory (chapter 06).

    A pass predicts each position from the previous pass's guess at the position before it, so reading the last
    `ngram` passes along a diagonal (position j from the oldest, j + 1 from the next, ...) gives n-grams whose every
    token was predicted from the one before it. They are pooled by first token; when the text's last token starts a
    pooled n-gram, its continuation is proposed (chained through the pool, then topped up with Jacobi guesses),
    otherwise the Jacobi guesses alone."""

    def __init__(self, ngram: int = 3, pool: int = 4096):
        super().__init__()
        if not isinstance(ngram, int) or ngram < 2:
            raise ValueError(f"ngram must be an integer >= 2, got {ngram!r}")
        if not isinstance(pool, int) or pool < 1:
            raise ValueError(f"pool must be an integer >= 1, got {pool!r}")
        self.ngram, self.size = ngram, pool
        self.name = f"lookahead ({ngram}-grams)"
        self.pool: OrderedDict[int, list[int]] = OrderedDict()
        self.passes: list[tuple[int, list[int]]] = []     # (position of the first prediction, predictions)
        self.from_pool = 0               # rounds whose proposal came (at least in part) from the pool

    def start(self, tokens: Sequence[int], room: int) -> None:
        super().start(tokens, room)
        self.pool.clear()
        self.passes = []
        self.from_pool = 0

    def propose(self, k: int, temperature: float, generator: torch.Generator | None) -> tuple[list[int], None]:
        jacobi, _ = super().propose(k, temperature, generator)
        out, last = [], self.context[-1]
        while len(out) < k and last in self.pool:
            out += self.pool[last]
            last = out[-1]
        out = out[:k]
        if not out or out == jacobi[:len(out)]:
            return jacobi, None
        self.from_pool += 1
        return out + jacobi[len(out):], None

    def observe(self, logits: torch.Tensor, accepted: int) -> None:
        super().observe(logits, accepted)
        self.passes = (self.passes + [(len(self.context), logits.argmax(-1).tolist())])[-self.ngram:]
        if len(self.passes) < self.ngram:
            return
        lo = max(s - r for r, (s, _) in enumerate(self.passes))
        hi = min(s + len(p) - r for r, (s, p) in enumerate(self.passes))
        for j in range(lo, hi):
            gram = [p[j + r - s] for r, (s, p) in enumerate(self.passes)]
            self.pool.pop(gram[0], None)
            self.pool[gram[0]] = gram[1:]                  # the most recent n-gram for each first token
            while len(self.pool) > self.size:
                self.pool.popitem(last=False)
