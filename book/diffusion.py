"""A small masked-diffusion language model: every position at once, refined in S steps (chapter 06).

An autoregressive model writes token t from tokens < t, so n tokens take n serial forward passes. A masked-diffusion
model is a bidirectional transformer (no causal mask) trained to fill in masked tokens: corrupt a text by masking
each token with probability t (t drawn uniformly), predict the masked ones, weight the loss by 1/t. To generate, start
from n masks after the prompt and run S passes; each pass predicts every masked position and keeps the most
confident predictions, so that after S passes none is left. S sets the trade the chapter measures: S = n passes
unmask one token each (as many passes as the autoregressive model, any order); S = 1 guesses all n at once.

The blocks have the shapes of the book's Llama (RMSNorm, RoPE, SwiGLU, tied embeddings) without the causal mask,
and one extra input token, [MASK]; the model is trained by `python -m book.train coder-diffusion` on `coder`'s corpus
and tokenizer and shipped in `book/weights/coder-diffusion` (safetensors and a config).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DiffusionConfig", "MaskedDiffusionLM", "mask_tokens", "diffusion_loss", "unmask_schedule", "sample",
           "negative_elbo", "pass_work", "save", "load", "WEIGHTS"]

WEIGHTS = Path(__file__).resolve().parent / "weights" / "coder-diffusion"


@dataclass(frozen=True)
class DiffusionConfig:
    """The shape of a masked-diffusion model; `mask_id` = vocab, the one token the text vocabulary lacks
    (chapter 06)."""
    vocab: int
    hidden: int
    layers: int
    heads: int
    ffn: int
    context: int = 512
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def mask_id(self) -> int:
        """The [MASK] token's id: one past the text vocabulary (chapter 06)."""
        return self.vocab

    def __post_init__(self):
        if min(self.vocab, self.hidden, self.layers, self.heads, self.ffn, self.context) < 1:
            raise ValueError(f"every size must be positive, got {self}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"hidden {self.hidden} must split into {self.heads} heads of an even size")


class _Block(nn.Module):
    def __init__(self, c: DiffusionConfig):
        super().__init__()
        self.heads, self.hd = c.heads, c.hidden // c.heads
        self.attn_norm = nn.RMSNorm(c.hidden, eps=c.norm_eps)
        self.wqkv = nn.Linear(c.hidden, 3 * c.hidden, bias=False)
        self.wo = nn.Linear(c.hidden, c.hidden, bias=False)
        self.mlp_norm = nn.RMSNorm(c.hidden, eps=c.norm_eps)
        self.w_gate_up = nn.Linear(c.hidden, 2 * c.ffn, bias=False)
        self.w_down = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, h = x.shape
        q, k, v = self.wqkv(self.attn_norm(x)).view(B, T, 3, self.heads, self.hd).unbind(2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # no mask
        x = x + self.wo(o.transpose(1, 2).reshape(B, T, h))
        gate, up = self.w_gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w_down(F.silu(gate) * up)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class MaskedDiffusionLM(nn.Module):
    """A bidirectional transformer that predicts the text token at every position, masked or not (chapter 06)."""

    def __init__(self, config: DiffusionConfig):
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab + 1, c.hidden)          # + [MASK]
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.layers))
        self.norm = nn.RMSNorm(c.hidden, eps=c.norm_eps)
        hd = c.hidden // c.heads
        inv = 1.0 / c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        self.register_buffer("inv_freq", inv, persistent=False)
        nn.init.normal_(self.embed.weight, std=0.02)
        for name, p in self.named_parameters():
            if p.dim() == 2 and name != "embed.weight":
                nn.init.normal_(p, std=0.02 / (math.sqrt(2 * c.layers) if name.endswith(("wo.weight", "w_down.weight"))
                                               else 1.0))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B,T] (text ids or mask_id) -> logits over the text vocabulary [B,T,vocab] (chapter 06)."""
        B, T = tokens.shape
        if T > self.config.context:
            raise ValueError(f"{T} tokens is longer than the model's context {self.config.context}")
        angles = torch.arange(T, device=tokens.device, dtype=torch.float32)[:, None] * self.inv_freq[None]
        angles = torch.cat((angles, angles), -1)[None, :, None]       # [1,T,1,hd]
        x = self.embed(tokens)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        return F.linear(self.norm(x), self.embed.weight[: self.config.vocab])   # tied: no [MASK] output

    def n_params(self) -> int:
        """Parameters, the embedding counted once (chapter 06)."""
        return sum(p.numel() for p in self.parameters())


def mask_tokens(x: torch.Tensor, t: torch.Tensor, mask_id: int, generator: torch.Generator | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward process: each token of row i is masked with probability t[i]; returns (noisy tokens, the mask)
    (chapter 06)."""
    if x.dim() != 2 or t.shape != (x.shape[0],):
        raise ValueError(f"expected tokens [B,T] and one t per row, got {tuple(x.shape)} and {tuple(t.shape)}")
    if not bool(((t >= 0) & (t <= 1)).all()):
        raise ValueError("masking probabilities must lie in [0, 1]")
    u = torch.rand(x.shape, generator=generator, device="cpu").to(x.device)
    masked = u < t[:, None]
    return torch.where(masked, torch.full_like(x, mask_id), x), masked


def diffusion_loss(model: MaskedDiffusionLM, x: torch.Tensor, generator: torch.Generator | None = None,
                   eps: float = 1e-3) -> torch.Tensor:
    """The standard masked-diffusion loss, an upper bound on the negative log-likelihood in nats per token: t per row
    spread evenly over (eps, 1] (stratified, lower variance), cross-entropy on the masked tokens weighted by 1/t,
    summed over positions and divided by the number of positions (chapter 06)."""
    B, T = x.shape
    offset = torch.rand((), generator=generator).item()
    t = eps + (1 - eps) * ((offset + torch.arange(B, dtype=torch.float32)) / B % 1.0)
    noisy, masked = mask_tokens(x, t.to(x.device), model.config.mask_id, generator)
    logits = model(noisy)
    ce = F.cross_entropy(logits.float().flatten(0, 1), x.flatten(), reduction="none").view(B, T)
    return ((ce * masked) / t.to(x.device)[:, None]).sum() / (B * T)


@torch.no_grad()
def negative_elbo(model: MaskedDiffusionLM, tokens: torch.Tensor, seq: int, *, windows: int = 16, samples: int = 4,
                  seed: int = 0) -> float:
    """Validation bound: the diffusion loss averaged over `windows` windows of `seq` tokens and `samples` draws of t
    each, in nats per token (an upper bound on what an autoregressive model's loss measures) (chapter 06)."""
    n = min(windows, (len(tokens) - 1) // seq)
    if n < 1:
        raise ValueError(f"need more than {seq} tokens, got {len(tokens)}")
    from .train import _autocast      # bf16 where it is fast here
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    x = torch.stack([tokens[i * seq:(i + 1) * seq] for i in range(n)]).to(device)
    was = model.training
    model.eval()
    total = 0.0
    for _ in range(samples):
        for i in range(0, n, 8):
            with _autocast(device):
                total += diffusion_loss(model, x[i:i + 8], g).item() * x[i:i + 8].shape[0]
    model.train(was)
    return total / (samples * n)


def pass_work(config: DiffusionConfig, tokens: int, batch: int = 1, dtype: str = "fp32"):
    """FLOPs and bytes of one sampling pass over `tokens` positions (prompt + block) for each of `batch` sequences,
    much as `book.roofline` counts a prefill, but with the LM head at every position, since every position's logits
    are sampled (chapter 06). FLOPs: 2 per matmul weight per position, plus attention over
    every (query, key) pair, both directions (4 x hidden per pair per layer). Bytes: the weights once (the tied
    embedding read as the LM head), plus each position's token in and its logits out."""
    from .models import dtype_bytes
    from .roofline import Work
    if tokens < 1 or batch < 1:
        raise ValueError(f"tokens and batch must be >= 1, got {tokens} and {batch}")
    if tokens > config.context:
        raise ValueError(f"{tokens} tokens is longer than the model's context {config.context}")
    h = config.hidden
    matmul = config.layers * (4 * h * h + 3 * h * config.ffn) + config.vocab * h
    flops = batch * (2 * matmul * tokens + 4 * config.layers * h * tokens * tokens)
    weights = matmul * dtype_bytes(dtype)
    acts = batch * tokens * (h + config.vocab) * dtype_bytes(dtype)
    return Work(flops, weights + acts, (("weights", weights), ("activations", acts)))


def unmask_schedule(n: int, steps: int) -> list[int]:
    """How many positions each of `steps` passes unmasks so that all `n` are unmasked after the last: the linear
    schedule, as even as integers allow (chapter 06)."""
    if n < 1 or steps < 1:
        raise ValueError(f"need n >= 1 tokens and steps >= 1, got n={n}, steps={steps}")
    if steps > n:
        raise ValueError(f"{steps} steps for {n} tokens: a step must unmask at least one (use steps <= {n})")
    return [(n * (i + 1)) // steps - (n * i) // steps for i in range(steps)]


@torch.no_grad()
def sample(model: MaskedDiffusionLM, prompt: torch.Tensor, n_new: int, steps: int, *, order: str = "confidence",
           temperature: float = 0.0, generator: torch.Generator | None = None,
           trace: list | None = None) -> torch.Tensor:
    """Generate `n_new` tokens after `prompt` [B,P] in `steps` passes (chapter 06). Each pass predicts every masked
    position (argmax, or sampled at `temperature`) and unmasks `unmask_schedule(n_new, steps)[i]` of them: the most
    confident (`order="confidence"`) or random ones (`"random"`); unmasked tokens stay. `trace`, when given,
    receives the tokens after each pass."""
    if order not in ("confidence", "random"):
        raise ValueError(f"unknown order {order!r}; use 'confidence' or 'random'")
    if prompt.dim() != 2 or prompt.shape[1] + n_new > model.config.context:
        raise ValueError(f"prompt [B,P] plus {n_new} new tokens must fit the context {model.config.context}, "
                         f"got {tuple(prompt.shape)}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    B, P = prompt.shape
    mask_id = model.config.mask_id
    x = torch.cat([prompt, torch.full((B, n_new), mask_id, dtype=prompt.dtype, device=prompt.device)], 1)
    for k in unmask_schedule(n_new, steps):
        logits = model(x)[:, P:].float()
        masked = x[:, P:] == mask_id
        if temperature > 0:
            probs = torch.softmax(logits / temperature, -1)
            pred = torch.multinomial(probs.flatten(0, 1).cpu(), 1, generator=generator).view(B, n_new).to(x.device)
            conf = probs.gather(-1, pred[..., None])[..., 0]
        else:
            conf, pred = torch.softmax(logits, -1).max(-1)
        if order == "random":
            conf = torch.rand(conf.shape, generator=generator).to(x.device)
        conf = conf.masked_fill(~masked, -1.0)                      # only masked positions compete
        pick = conf.topk(k, dim=-1).indices                          # [B,k]
        new = x[:, P:].clone()
        new.scatter_(1, pick, pred.gather(1, pick))
        x = torch.cat([x[:, :P], new], 1)
        if trace is not None:
            trace.append(x.clone())
    return x


def save(model: MaskedDiffusionLM, out: Path, dtype: torch.dtype = torch.bfloat16, extra: dict | None = None) -> Path:
    """Write model.safetensors (in `dtype`) and config.json to `out` (chapter 06)."""
    from safetensors.torch import save_file
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()},
              str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({"model_type": "book-masked-diffusion", **asdict(model.config),
                                                 **(extra or {})}, indent=1) + "\n")
    return out


def load(path: str | Path = WEIGHTS, *, dtype: torch.dtype = torch.float32,
         device: torch.device | str | None = None) -> MaskedDiffusionLM:
    """The shipped masked-diffusion model (or one saved with `save`), in eval mode (chapter 06)."""
    from safetensors.torch import load_file
    from .device import as_device
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no masked-diffusion model in {path}: train one with "
                                f"python -m book.train coder-diffusion")
    raw = json.loads((path / "config.json").read_text())
    fields = DiffusionConfig.__dataclass_fields__
    model = MaskedDiffusionLM(DiffusionConfig(**{k: v for k, v in raw.items() if k in fields}))
    model.load_state_dict({k: v.float() for k, v in load_file(str(path / "model.safetensors")).items()})
    return model.to(device=as_device(device), dtype=dtype).eval()
