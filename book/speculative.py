"""How often a draft model agrees with its target: the acceptance rate alpha of speculative decoding (appendix A)."""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["logits_of", "acceptance_rates", "windows", "tail_loop"]


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


def windows(tokens: torch.Tensor, length: int, max_windows: int | None = None) -> torch.Tensor:
    """Consecutive non-overlapping windows [n, length] cut from a 1-D token stream."""
    if tokens.dim() != 1:
        raise ValueError(f"expected a 1-D token stream, got shape {tuple(tokens.shape)}")
    if length < 2:
        raise ValueError(f"window length must be at least 2, got {length}")
    n = len(tokens) // length
    if n < 1:
        raise ValueError(f"a stream of {len(tokens)} tokens holds no window of {length}")
    if max_windows is not None:
        n = min(n, max_windows)
    return tokens[:n * length].view(n, length)


@torch.no_grad()
def acceptance_rates(target, draft, batches: torch.Tensor | Sequence[torch.Tensor], *, skip: int = 0,
                     temperatures: Sequence[float] = (1.0,), batch_size: int = 8) -> dict:
    """Alpha of `draft` against `target` at every position of `batches` [n, seq] (teacher-forced).

    greedy: the share of positions where both models' most likely next token is the same, which is the chance a
    drafted token survives greedy verification. At temperature T, sum_x min(p_T(x), q_T(x)), the chance that
    speculative sampling accepts a token drawn from the draft (Leviathan et al., 2023). `skip` ignores the first
    positions of each row (for example a prompt).
    """
    if isinstance(batches, torch.Tensor):
        batches = [batches[i:i + batch_size] for i in range(0, len(batches), batch_size)]
    if any(t <= 0 for t in temperatures):
        raise ValueError(f"temperatures must be positive, got {list(temperatures)}; greedy is reported anyway")
    device = next(target.parameters()).device
    agree, total = 0, 0
    mass = {float(t): 0.0 for t in temperatures}
    for x in batches:
        if x.dim() != 2 or x.shape[1] <= skip:
            raise ValueError(f"expected [batch, seq] with seq > skip={skip}, got {tuple(x.shape)}")
        x = x.to(device)
        p, q = logits_of(target, x)[:, skip:], logits_of(draft, x.to(next(draft.parameters()).device))[:, skip:]
        q = q.to(p.device)
        if p.shape != q.shape:
            raise ValueError(f"target and draft disagree on the vocabulary: {tuple(p.shape)} vs {tuple(q.shape)}")
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
        total += p.shape[0] * p.shape[1]
        for t in mass:
            mass[t] += float(torch.minimum(torch.softmax(p / t, -1), torch.softmax(q / t, -1)).sum())
    return {"greedy": agree / total, "sampled": {t: m / total for t, m in mass.items()}, "positions": total}
