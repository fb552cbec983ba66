"""How often a draft model agrees with its target: the acceptance rate alpha of speculative decoding (appendix A)."""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["logits_of", "acceptance_rates", "windows"]


def logits_of(model, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [batch, seq, vocab] of a transformers causal LM or of the book's decoder, in fp32."""
    if hasattr(model, "config"):                      # transformers
        return model(input_ids=tokens).logits.float()
    return model(tokens).float()                      # book.llama.Llama


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
