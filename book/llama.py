"""The book's own Llama decoder: plain PyTorch, a preallocated KV cache, Hugging Face's logits (chapters 01-02).

A decode step reads every weight once plus the filled part of the KV cache, and does little else; that is why it is
as fast as the memory lets it be. Shapes used in comments: B batch, T new tokens, S attended positions, H query heads,
KV key/value heads, G = H / KV query heads per KV head, hd head dim, h hidden size, I MLP width, V vocabulary.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .kvcache import KVCache, Packed
from .device import as_device
from .models import Architecture, _torch_dtype, dtype_bytes

__all__ = ["Llama", "KVCache", "architecture_from_hf", "pad_prompts"]


def _weight(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


def _matrix(n: int, k: int, *, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    """A weight [n, k], or, where rows of k elements stream faster as blocks of their columns on this device
    (`kernels.row_blocks`), the same weight as blocks [k/c, n, c] (chapter 02)."""
    c = kernels.row_blocks(device, dtype, k)
    return _weight(*((k // c, n, c) if c else (n, k)), dtype=dtype, device=device)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 like Hugging Face's LlamaRMSNorm (chapter 01)."""

    def __init__(self, dim: int, eps: float, *, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.eps, self.weight = eps, _weight(dim, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension (chapter 01). In fp32 PyTorch's fused kernel computes the same numbers in one
        call; in bf16 and fp16 the steps below round where Hugging Face's do."""
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T. A single row (a batch-1 decode step) is a matrix-vector product and goes through the path measured
    quickest for this device, dtype and weight size (`book.kernels`: F.linear, torch.mv or a compiled multiply-and-sum,
    whose fixed cost a call pays off only on large weights); a few rows (a batched step, a verification pass) through
    the faster of F.linear and the product with the weight on the left; the fastest differs from machine to machine,
    so it is measured, never assumed; a weight stored as blocks of its columns goes through
    `kernels.blocked_linear` (chapter 02)."""
    if w.dim() == 3:
        return kernels.blocked_linear(x, w)
    rows = x.numel() // x.shape[-1]
    if rows == 1:
        path = kernels.matvec_path(x.device, w.dtype, w.numel() * w.element_size())
        if path != "linear":
            return kernels.matvec(w, x.reshape(-1), path).view(*x.shape[:-1], w.shape[0])
    elif 2 <= rows <= kernels.FEW_ROWS:     # a batched decode step or a short verification pass: measured too
        path = kernels.rows_path(x.device, w.dtype)
        if path != "linear":
            return kernels.few_rows(w, x.reshape(rows, x.shape[-1]), path).view(*x.shape[:-1], w.shape[0])
    return F.linear(x, w)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, 'rotate half' convention of Hugging Face Llama; x [B,T,heads,hd] (chapter 01)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(nn.Module):
    """One transformer block: RMSNorm, attention with a fused q/k/v weight, RMSNorm, SwiGLU MLP with a fused gate/up
    weight (chapter 01)."""

    def __init__(self, a: Architecture, *, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = a.n_heads, a.n_kv_heads, a.head_dim
        q, kv, f = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim, dict(dtype=dtype, device=device)
        self.attn_norm = RMSNorm(a.hidden, a.norm_eps, **f)
        self.wqkv = _matrix(q + 2 * kv, a.hidden, **f)       # rows: q heads, then k heads, then v heads
        self.wo = _matrix(a.hidden, q, **f)
        self.mlp_norm = RMSNorm(a.hidden, a.norm_eps, **f)
        self.w_gate_up = _matrix(2 * a.intermediate, a.hidden, **f)  # rows: gate, then up
        self.w_down = _matrix(a.hidden, a.intermediate, **f)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B,T,h] -> q [B,T,H,hd], k and v [B,T,KV,hd], RoPE applied to q and k (chapter 01)."""
        B, T, _ = x.shape
        H, KV, hd = self.n_heads, self.n_kv, self.hd
        qk, v = linear(self.attn_norm(x), self.wqkv).split([(H + KV) * hd, KV * hd], dim=-1)
        qk = rope(qk.view(B, T, H + KV, hd), cos, sin)            # q and k heads rotated together
        return qk[:, :, :H], qk[:, :, H:], v.view(B, T, KV, hd)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [B,T,H,hd] against keys and values [B,KV,S,hd] under `mask` -> [B,T,H*hd] (chapter 01)."""
        B, T, H, hd = q.shape
        KV = self.n_kv
        # Grouped-query attention without copying K/V: the G query heads that share one KV head become G*T queries.
        G = H // KV
        q = q.view(B, T, KV, G, hd).permute(0, 2, 3, 1, 4).reshape(B, KV, G * T, hd)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)   # [B,KV,G*T,hd]
        return o.view(B, KV, G, T, hd).permute(0, 3, 1, 2, 4).reshape(B, T, H * hd)

    def finish(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The residual after attention, then the SwiGLU MLP and its residual: [B,T,h] (chapter 01)."""
        x = x + linear(o, self.wo)
        gate, up = linear(self.mlp_norm(x), self.w_gate_up).chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, self.w_down)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                positions: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor] | None, kv_len: int) -> torch.Tensor:
        """x [B,T,h] -> [B,T,h]; writes this layer's new keys/values into `kv` at `positions` (chapter 01)."""
        q, k, v = self.project(x, cos, sin)
        if kv is None:                                          # no cache: attend to the new tokens only
            k, v = k.transpose(1, 2), v.transpose(1, 2)         # [B,KV,T,hd]
        else:                                                   # write at each sequence's own positions ...
            k_cache, v_cache = kv                               # [B,KV,max_len,hd]
            rows = torch.arange(x.shape[0], device=x.device)[:, None]
            k_cache[rows, :, positions] = k
            v_cache[rows, :, positions] = v
            k, v = k_cache[:, :, :kv_len], v_cache[:, :, :kv_len]  # ... and read back only the filled prefix
        return self.finish(x, self.attend(q, k, v, mask))


def attention_mask(q_pos: torch.Tensor, key_pos: torch.Tensor, group: int, dtype: torch.dtype | None = None
                   ) -> torch.Tensor:
    """Causal mask for queries at positions q_pos [B,T] over keys at key_pos [B,S], shaped for `Block.attend`'s
    G*T query rows: [B,1,1,S] for one query, [B,1,G*T,S] for more (chapter 01). Boolean (True: attend), or with a
    `dtype` additive (0 or the dtype's lowest value, as Hugging Face builds it), made once per step instead of being
    converted again in every layer."""
    B, T = q_pos.shape
    mask = key_pos[:, None, :] <= q_pos[:, :, None]                  # [B,T,S]: causal, per sequence
    mask = mask[:, None] if T == 1 else mask[:, None, None].expand(B, 1, group, T, -1).reshape(B, 1, group * T, -1)
    if dtype is None:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def _check_tokens(tokens: torch.Tensor, device: torch.device, what: str = "tokens") -> None:
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{what} must be a torch tensor of token ids, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"{what} must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.device != device:
        raise ValueError(f"{what} are on {tokens.device} but the model is on {device}; "
                         f"move them with .to({str(device)!r})")


def pad_prompts(prompts: Sequence[Sequence[int]] | torch.Tensor, pad_id: int = 0,
                device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad prompts of different lengths into [B, T] token ids plus their lengths [B] (chapter 02)."""
    if isinstance(prompts, torch.Tensor):
        tokens = prompts[None] if prompts.dim() == 1 else prompts
        return tokens, torch.full((tokens.shape[0],), tokens.shape[1], dtype=torch.long)
    if len(prompts) == 0 or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    T = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens[i, :len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    return tokens.to(as_device(device)), torch.tensor([len(p) for p in prompts], dtype=torch.long)


def architecture_from_hf(config) -> Architecture:
    """The Architecture of a transformers Llama config; unsupported variants get a clear error (chapter 01)."""
    kind = getattr(config, "model_type", None)
    if kind not in ("llama", "mistral"):
        raise ValueError(f"the book's decoder implements the Llama family, not model_type={kind!r}")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise ValueError("attention or MLP biases are not implemented (Llama has none)")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"only the SiLU (SwiGLU) MLP is implemented, got hidden_act={config.hidden_act!r}")
    if getattr(config, "sliding_window", None):
        raise ValueError(f"sliding-window attention (sliding_window={config.sliding_window}) is not implemented")
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    name = getattr(config, "_name_or_path", "") or "transformers Llama"
    return Architecture(name=name, hub_id=name, family="llama", n_layers=config.num_hidden_layers,
                        hidden=config.hidden_size, n_heads=config.num_attention_heads,
                        n_kv_heads=config.num_key_value_heads or config.num_attention_heads, head_dim=head_dim,
                        intermediate=config.intermediate_size, vocab=config.vocab_size,
                        max_context=config.max_position_embeddings, rope_theta=float(theta),
                        norm_eps=config.rms_norm_eps, tied_embeddings=bool(config.tie_word_embeddings))


class Llama(nn.Module):
    """A Llama-family decoder (RMSNorm, RoPE, MHA/GQA/MQA, SwiGLU) with a static KV cache (chapters 01-02)."""

    def __init__(self, arch: Architecture, *, dtype: str | torch.dtype = torch.float32,
                 device: torch.device | str | None = None, inv_freq: torch.Tensor | None = None,
                 rope_scale: float = 1.0):
        super().__init__()
        if arch.family != "llama":
            raise ValueError(f"{arch.name} is a {arch.family} model; the book's decoder implements the Llama family")
        a, dt, dev = arch, _torch_dtype(dtype), as_device(device)
        self.arch, f = a, dict(dtype=dt, device=dev)
        self.embed = _weight(a.vocab, a.hidden, **f)
        self.blocks = nn.ModuleList(Block(a, **f) for _ in range(a.n_layers))
        self.norm = RMSNorm(a.hidden, a.norm_eps, **f)
        self.lm_head = self.embed if a.tied_embeddings else _matrix(a.vocab, a.hidden, **f)
        if inv_freq is None:
            inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, a.head_dim, 2, dtype=torch.float) / a.head_dim))
        self.register_buffer("inv_freq", inv_freq.float().to(dev), persistent=False)
        self.rope_scale = float(rope_scale)
        self.cache: KVCache | None = None
        self._compiled = None  # the compiled decode step, when compile_decode() was called

    # ------------------------------------------------------------------------------------------------- loading

    @classmethod
    def from_hf(cls, model_or_path, *, dtype: str | torch.dtype | None = None,
                device: torch.device | str | None = None) -> "Llama":
        """Copy a transformers Llama (in memory, or a folder saved with save_pretrained) into the book's decoder;
        q/k/v and gate/up weights are fused into one matrix each (chapter 01)."""
        if isinstance(model_or_path, (str, os.PathLike)):
            from .models import load
            model_or_path = load(model_or_path, dtype=dtype, device="cpu" if device is None else device)
        hf = model_or_path
        if not hasattr(hf, "config") or not hasattr(hf, "model"):
            raise TypeError(f"expected a transformers LlamaForCausalLM or a folder, got {type(hf).__name__}")
        arch = architecture_from_hf(hf.config)
        rot = hf.model.rotary_emb
        if getattr(rot, "rope_type", "default") in ("dynamic", "longrope"):
            raise ValueError(f"rope_type={rot.rope_type!r} changes with the sequence length; not implemented")
        src = hf.model
        dt = _torch_dtype(dtype) if dtype is not None else src.embed_tokens.weight.dtype
        dev = as_device(device) if device is not None else src.embed_tokens.weight.device
        model = cls(arch, dtype=dt, device=dev, inv_freq=rot.inv_freq, rope_scale=float(rot.attention_scaling))

        def put(dst: torch.Tensor, *parts: torch.Tensor) -> None:   # several parts: stacked row-wise (fused)
            if dst.dim() == 3:                                       # a weight stored as blocks of columns
                with torch.no_grad():
                    dst.copy_(kernels.to_blocks(torch.cat(parts).to(dst.dtype), dst.shape[2]))
                return
            row = 0
            with torch.no_grad():
                for p in parts:
                    dst[row:row + p.shape[0]].copy_(p)
                    row += p.shape[0]
            assert row == dst.shape[0], f"shape mismatch loading {tuple(dst.shape)}"

        put(model.embed, src.embed_tokens.weight)
        for blk, layer in zip(model.blocks, src.layers):
            at, mlp = layer.self_attn, layer.mlp
            put(blk.attn_norm.weight, layer.input_layernorm.weight)
            put(blk.wqkv, at.q_proj.weight, at.k_proj.weight, at.v_proj.weight)
            put(blk.wo, at.o_proj.weight)
            put(blk.mlp_norm.weight, layer.post_attention_layernorm.weight)
            put(blk.w_gate_up, mlp.gate_proj.weight, mlp.up_proj.weight)
            put(blk.w_down, mlp.down_proj.weight)
        put(model.norm.weight, src.norm.weight)
        if not arch.tied_embeddings:
            put(model.lm_head, hf.lm_head.weight)
        return model.eval()

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype (chapter 01)."""
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        """Where the weights live (chapter 01)."""
        return self.embed.device

    # ----------------------------------------------------------------------------------------------- bytes

    def weight_bytes_per_step(self, batch: int = 1) -> int:
        """Weight bytes one decode step reads: every block, the final norm, the LM head, and B embedding rows
        (not the whole embedding table) (chapter 02)."""
        a, e = self.arch, self.embed.element_size()
        blocks = sum(p.numel() for p in self.blocks.parameters()) + self.norm.weight.numel()
        rows = 0 if a.tied_embeddings else batch * a.hidden   # tied: the rows are part of the LM head already read
        return int((blocks + self.lm_head.numel() + rows) * e)

    def kv_bytes_per_step(self, batch: int, kv_len: int) -> int:
        """KV-cache bytes one decode step reads: K and V of every layer over `kv_len` positions (chapter 02)."""
        a = self.arch
        return int(2 * a.n_layers * batch * a.n_kv_heads * kv_len * a.head_dim * self.embed.element_size())

    # ----------------------------------------------------------------------------------------------- cache

    def setup_cache(self, batch: int, max_len: int) -> KVCache:
        """Allocate the KV cache once: [layers, batch, KV heads, max_len, head dim] (chapter 02)."""
        a = self.arch
        self.cache = KVCache(a.n_layers, batch, a.n_kv_heads, max_len, a.head_dim, dtype=self.dtype,
                             device=self.device)
        if self._compiled is not None:
            torch._dynamo.mark_static_address(self.cache.k)
            torch._dynamo.mark_static_address(self.cache.v)
        return self.cache

    def _cache(self) -> KVCache:
        c = self.cache
        if c is None:
            raise RuntimeError("no KV cache yet: call model.setup_cache(batch, max_len) first")
        if c.k.dtype != self.dtype:
            raise TypeError(f"the KV cache holds {c.k.dtype} but the model's weights are {self.dtype}; "
                            f"call setup_cache again after changing the model's dtype")
        if c.k.device != self.device:
            raise ValueError(f"the KV cache is on {c.k.device} but the model is on {self.device}; "
                             f"call setup_cache again after moving the model")
        return c

    def rewind(self, lengths: int | Sequence[int] | torch.Tensor) -> None:
        """Forget cached positions after `lengths` (e.g. rejected draft tokens); O(1) (chapter 02)."""
        self._cache().rewind(lengths)

    # ----------------------------------------------------------------------------------------------- forward

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq          # [B,T,hd/2], fp32 like Hugging Face
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
        return cos.to(self.dtype)[:, :, None], sin.to(self.dtype)[:, :, None]   # [B,T,1,hd]

    def _hidden(self, tokens: torch.Tensor, positions: torch.Tensor, k: torch.Tensor | None,
                v: torch.Tensor | None, kv_len: int) -> torch.Tensor:
        """Hidden states [B,T,h] before the final norm; with a cache (k, v [L,B,KV,max_len,hd]) it is written to."""
        B = tokens.shape[0]
        x = F.embedding(tokens, self.embed)
        cos, sin = self._rope(positions)
        key_pos = positions if k is None else torch.arange(kv_len, device=tokens.device)[None].expand(B, -1)
        mask = attention_mask(positions, key_pos, self.arch.n_heads // self.arch.n_kv_heads, self.dtype)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, mask, positions, None if k is None else (k[i, :B], v[i, :B]), kv_len)
        return x

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return linear(self.norm(x), self.lm_head)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B,T,V] for every position in one parallel, teacher-forced pass; no cache used (chapter 01)."""
        tokens = tokens[None] if tokens.dim() == 1 else tokens
        _check_tokens(tokens, self.device)
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=self.device)[None].expand(tokens.shape[0], -1)
        return self._logits(self._hidden(tokens, positions, None, None, tokens.shape[1]))

    def _append(self, tokens: torch.Tensor, lengths: torch.Tensor | None, all_logits: bool) -> torch.Tensor:
        c = self._cache()
        B, T = tokens.shape
        if B != c.lengths.numel():
            raise ValueError(f"batch of {B} sequences, but {c.lengths.numel()} are active in the cache "
                             f"(allocated for {c.batch}); prefill starts a new batch")
        n_new = torch.full((B,), T, dtype=torch.long) if lengths is None else torch.as_tensor(lengths).long().cpu()
        if n_new.shape != (B,) or (n_new < 1).any() or (n_new > T).any():
            raise ValueError(f"lengths must give 1..{T} real tokens for each of the {B} sequences, "
                             f"got {n_new.tolist()}")
        start = c.lengths
        if int(start.max()) + T > c.max_len:
            raise ValueError(f"{T} new tokens after {int(start.max())} cached ones need {int(start.max()) + T} "
                             f"positions, but the KV cache holds {c.max_len}; call setup_cache with a larger max_len")
        positions = (start[:, None] + torch.arange(T)).to(self.device)
        kv_len = int((start + T).max())
        x = self._hidden(tokens, positions, c.k, c.v, kv_len)
        c.lengths = start + n_new
        if all_logits:
            return self._logits(x)
        return self._logits(x[torch.arange(B, device=self.device), (n_new - 1).to(self.device)])

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor | Sequence[Sequence[int]],
                lengths: torch.Tensor | Sequence[int] | None = None) -> torch.Tensor:
        """Start a batch: run right-padded prompts [B,T] (real lengths `lengths`) through the model, fill the cache,
        and return each sequence's last-token logits [B,V] (chapter 02)."""
        if not isinstance(tokens, torch.Tensor):
            tokens, lengths = pad_prompts(tokens, device=self.device)
        tokens = tokens[None] if tokens.dim() == 1 else tokens
        _check_tokens(tokens, self.device)
        c = self._cache()
        B, T = tokens.shape
        if T > c.max_len:
            raise ValueError(f"a prompt of {T} tokens does not fit the KV cache of {c.max_len} positions; "
                             f"call setup_cache(batch, max_len>={T}) (plus room for the tokens to generate)")
        c.reset(B)
        return self._append(tokens, lengths, all_logits=False)

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor, lengths: torch.Tensor | Sequence[int] | None = None) -> torch.Tensor:
        """Append T tokens per sequence to the cache and return all their logits [B,T,V], e.g. to verify draft tokens
        in speculative decoding (chapter 02)."""
        tokens = tokens[None] if tokens.dim() == 1 else tokens
        _check_tokens(tokens, self.device)
        return self._append(tokens, lengths, all_logits=True)

    @torch.no_grad()
    def forward_packed(self, p: Packed, cache) -> torch.Tensor:
        """One step of a serving engine: the tokens of many sequences, each at its own positions, packed into one row
        so every weight is read once for all of them; keys and values go to and come from `cache` (a slot or paged
        cache of `book.kvcache`) and attention runs group by group. Returns the logits [n,V] of the tokens at
        `p.sample_at` (chapter 04)."""
        H, hd, dev = self.arch.n_heads, self.arch.head_dim, self.device
        G = H // self.arch.n_kv_heads
        x = F.embedding(p.tokens[None], self.embed)                        # [1,N,h]
        cos, sin = self._rope(p.positions[None])
        masks = [attention_mask(g.q_pos, torch.arange(g.kv_len, device=dev)[None].expand(g.batch, -1), G, self.dtype)
                 for g in p.groups]
        for i, blk in enumerate(self.blocks):
            q, k, v = blk.project(x, cos, sin)                             # [1,N,heads,hd]
            cache.write(i, p.write, k[0], v[0])
            o = [blk.attend(q[0, g.lo:g.hi].view(g.batch, g.T, H, hd), *cache.read(i, g.read), m).view(1, -1, H * hd)
                 for g, m in zip(p.groups, masks)]
            x = blk.finish(x, o[0] if len(o) == 1 else torch.cat(o, 1))
        return self._logits(x[0, p.sample_at])

    def _decode(self, tokens: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_len: int) -> torch.Tensor:
        return self._logits(self._hidden(tokens, positions, k, v, kv_len))[:, 0]

    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor | Sequence[int] | None = None
                    ) -> torch.Tensor:
        """One new token per sequence ([B] or [B,1]) at `positions` (default: each sequence's length); returns logits
        [B,V]. It reads every weight once plus the filled part of the cache (chapter 02)."""
        _check_tokens(tokens, self.device)
        tokens = tokens.reshape(-1, 1)
        c = self._cache()
        B = tokens.shape[0]
        if B > c.batch:
            raise ValueError(f"batch of {B} sequences, but the KV cache was allocated for {c.batch}; "
                             f"call setup_cache(batch={B}, ...)")
        if B != c.lengths.numel():
            raise ValueError(f"{B} tokens for {c.lengths.numel()} active sequences; call prefill to start a batch")
        pos = c.lengths.clone() if positions is None else torch.as_tensor(positions, dtype=torch.long).cpu().flatten()
        if pos.shape != (B,) or (pos < 0).any() or (pos > c.lengths).any():
            raise ValueError(f"positions must be one per sequence and at most the current lengths "
                             f"{c.lengths.tolist()}, got {pos.tolist()}")
        if int(pos.max()) >= c.max_len:
            raise ValueError(f"sequence {int(pos.argmax())} is at position {int(pos.max())}, but the KV cache holds "
                             f"{c.max_len} positions; call setup_cache with a larger max_len")
        kv_len = int(pos.max()) + 1
        pos_dev = pos[:, None].to(self.device, non_blocking=True)
        logits = None
        if self._compiled is not None:
            padded = min(c.max_len, -(-kv_len // self._bucket) * self._bucket)   # few shapes -> few graphs
            try:
                logits = self._compiled(tokens, pos_dev, c.k, c.v, padded).clone()   # graph outputs are reused
            except Exception as e:   # noqa: BLE001 - a fast path that fails on this device falls back, with a line
                if os.environ.get("BOOK_STRICT_COMPILE"):
                    raise
                self._compiled = None
                msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
                print(f"note: the compiled decode step failed on this device ({type(e).__name__}: {msg}); "
                      f"using the plain PyTorch step", file=sys.stderr)
        if logits is None:
            logits = self._decode(tokens, pos_dev, c.k, c.v, kv_len)
        c.lengths = pos + 1
        return logits

    def decode_kv_len(self) -> int:
        """Cache positions the next decode step attends to (rounded up to a bucket when compiled) (chapter 02)."""
        c = self._cache()
        n = int(c.lengths.max()) + 1
        return min(c.max_len, -(-n // self._bucket) * self._bucket) if self._compiled is not None else n

    def compile_decode(self, mode: str | None = None, bucket: int | None = None) -> "Llama":
        """Opt in to the fast decode step: torch.compile, with CUDA graphs ('reduce-overhead') on CUDA; the attended
        cache length is rounded up to a multiple of `bucket`, so only a few graphs are built (chapter 02)."""
        if mode is None:
            mode = "reduce-overhead" if self.device.type == "cuda" else "default"
        c = self.cache
        self._bucket = bucket or max(128, (c.max_len // 8) if c else 256)
        try:
            self._compiled = torch.compile(self._decode, mode=mode, fullgraph=True, dynamic=False)
        except Exception as e:   # noqa: BLE001 - e.g. a Python or platform torch.compile does not support
            print(f"note: torch.compile is not available here ({type(e).__name__}: {e}); using the plain PyTorch "
                  f"step", file=sys.stderr)
            self._compiled = None
            return self
        if c is not None:
            torch._dynamo.mark_static_address(c.k)
            torch._dynamo.mark_static_address(c.v)
        return self

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor | Sequence[Sequence[int]], max_new_tokens: int, *,
                 temperature: float = 0.0, lengths: torch.Tensor | Sequence[int] | None = None,
                 eos_token_id: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Generate `max_new_tokens` per prompt, greedy (temperature 0) or sampled; returns [B, max_new_tokens] new
        tokens (after an end-of-sequence token, more of it) (chapter 02)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not isinstance(prompts, torch.Tensor):
            prompts, lengths = pad_prompts(prompts, device=self.device)
        prompts = prompts[None] if prompts.dim() == 1 else prompts
        B, T = prompts.shape
        room = T if lengths is None else int(torch.as_tensor(lengths).max())
        if self.cache is None or self.cache.batch < B or self.cache.max_len < room + max_new_tokens - 1:
            self.setup_cache(max(B, self.cache.batch if self.cache else 0), max(T, room + max_new_tokens - 1))

        def pick(logits: torch.Tensor) -> torch.Tensor:
            if temperature <= 0:
                return logits.argmax(-1)
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            return torch.multinomial(probs, 1, generator=generator)[:, 0]

        out = torch.empty(B, max_new_tokens, dtype=torch.long, device=self.device)
        out[:, 0] = tok = pick(self.prefill(prompts, lengths))
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        for i in range(1, max_new_tokens):
            if eos_token_id is not None:
                done |= tok == eos_token_id
                if bool(done.all()):
                    out[:, i:] = eos_token_id
                    break
            tok = pick(self.decode_step(tok))
            if eos_token_id is not None:
                tok = torch.where(done, torch.full_like(tok, eos_token_id), tok)
            out[:, i] = tok
        return out
