"""Real architectures with exact shapes, random-init models of those shapes, and loading real weights (chapter 00)."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .device import as_device

__all__ = ["Architecture", "ARCHITECTURES", "architecture", "architecture_names", "dtype_bytes", "hf_config",
           "build_random", "fill_random_", "RANDOM_BLOCK", "load", "load_tokenizer", "OfflineError", "SHIPPED",
           "shipped_path"]

_DTYPE_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_bytes(dtype: str | torch.dtype) -> float:
    """Bytes per element of a precision name ('bf16', 'int4', ...) or a torch dtype (chapter 00)."""
    if isinstance(dtype, torch.dtype):
        return float(torch.empty((), dtype=dtype).element_size())
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"unknown precision {dtype!r}; use one of {', '.join(_DTYPE_BYTES)} or a torch.dtype")
    return _DTYPE_BYTES[dtype]


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _TORCH_DTYPES:
        raise ValueError(f"cannot build weights in {dtype!r}; use one of {', '.join(_TORCH_DTYPES)} or a torch.dtype")
    return _TORCH_DTYPES[dtype]


@dataclass(frozen=True)
class Architecture:
    """The exact shape of a real model, from its published config.json (chapter 00)."""

    name: str
    hub_id: str
    family: str  # "llama" (Llama and Mistral: RMSNorm, RoPE, SwiGLU) or "gpt2"
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_context: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied_embeddings: bool = False
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "intermediate", "vocab", "max_context"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{self.name}: {f} must be positive, got {getattr(self, f)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: {self.n_heads} query heads do not split into {self.n_kv_heads} KV groups")
        if self.family not in ("llama", "gpt2"):
            raise ValueError(f"{self.name}: unknown family {self.family!r} (llama or gpt2)")

    @property
    def attention(self) -> str:
        """'MHA' (one KV head per query head), 'GQA' (groups) or 'MQA' (one KV head) (chapter 03)."""
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    def params_per_layer(self) -> int:
        """Parameters in one transformer block (chapter 00)."""
        h, q, kv = self.hidden, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        if self.family == "gpt2":  # fused qkv with biases, output proj, 2-matrix MLP with biases, two LayerNorms
            return (h * 3 * q + 3 * q) + (q * h + h) + (h * self.intermediate + self.intermediate) \
                + (self.intermediate * h + h) + 4 * h
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate + 2 * h

    def n_params(self) -> int:
        """Exact parameter count from the shapes (tied embeddings counted once) (chapter 00)."""
        emb = self.vocab * self.hidden
        total = emb + self.n_layers * self.params_per_layer()
        if self.family == "gpt2":
            total += self.max_context * self.hidden + 2 * self.hidden  # learned positions, final LayerNorm
        else:
            total += self.hidden  # final RMSNorm
        return total + (0 if self.tied_embeddings else emb)

    def weight_bytes(self, dtype: str | torch.dtype = "bf16") -> float:
        """Bytes of all weights at a precision (chapter 00)."""
        return self.n_params() * dtype_bytes(dtype)

    def kv_bytes_per_token(self, dtype: str | torch.dtype = "bf16") -> float:
        """KV-cache bytes one token adds: 2 (K and V) x layers x KV heads x head dim x bytes (chapter 01)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype_bytes(dtype)

    def with_layers(self, n_layers: int) -> "Architecture":
        """The same shapes with fewer (or more) layers, for quick experiments (chapter 00)."""
        if n_layers <= 0:
            raise ValueError(f"number of layers must be positive, got {n_layers}")
        return replace(self, name=f"{self.name} ({n_layers} layers)", n_layers=n_layers)


ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in [
    Architecture("Llama-2-7B", "meta-llama/Llama-2-7b-hf", "llama", 32, 4096, 32, 32, 128, 11008, 32000, 4096),
    Architecture("Llama-2-13B", "meta-llama/Llama-2-13b-hf", "llama", 40, 5120, 40, 40, 128, 13824, 32000, 4096),
    Architecture("Llama-2-70B", "meta-llama/Llama-2-70b-hf", "llama", 80, 8192, 64, 8, 128, 28672, 32000, 4096),
    Architecture("Llama-3-8B", "meta-llama/Meta-Llama-3-8B", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 8192,
                 rope_theta=500000.0),
    Architecture("Llama-3-70B", "meta-llama/Meta-Llama-3-70B", "llama", 80, 8192, 64, 8, 128, 28672, 128256, 8192,
                 rope_theta=500000.0),
    Architecture("Mistral-7B", "mistralai/Mistral-7B-v0.1", "llama", 32, 4096, 32, 8, 128, 14336, 32000, 32768,
                 sliding_window=4096),
    Architecture("GPT-2", "openai-community/gpt2", "gpt2", 12, 768, 12, 12, 64, 3072, 50257, 1024,
                 tied_embeddings=True),
]}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(" ", "-").replace("meta-", "")


def architecture_names() -> list[str]:
    """The architectures in the catalog (chapter 00)."""
    return list(ARCHITECTURES)


def architecture(name: str | Architecture) -> Architecture:
    """A catalog architecture by name or hub id, case-insensitive; an unknown name lists the known ones (chapter 00)."""
    if isinstance(name, Architecture):
        return name
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a model name must be a non-empty string, got {name!r}; known: {', '.join(ARCHITECTURES)}")
    wanted = _norm(name)
    for arch in ARCHITECTURES.values():
        if wanted in (_norm(arch.name), _norm(arch.hub_id), _norm(arch.hub_id.split("/")[-1])):
            return arch
    if wanted == "gpt2":
        return ARCHITECTURES["GPT-2"]
    raise KeyError(f"unknown model {name!r}; known models: {', '.join(ARCHITECTURES)}")


def hf_config(arch: str | Architecture):
    """A transformers config with the architecture's exact shapes (chapter 00)."""
    a = architecture(arch)
    if a.family == "gpt2":
        from transformers import GPT2Config
        return GPT2Config(vocab_size=a.vocab, n_positions=a.max_context, n_embd=a.hidden, n_layer=a.n_layers,
                          n_head=a.n_heads, n_inner=a.intermediate, layer_norm_epsilon=a.norm_eps,
                          tie_word_embeddings=a.tied_embeddings)
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                       num_hidden_layers=a.n_layers, num_attention_heads=a.n_heads, num_key_value_heads=a.n_kv_heads,
                       head_dim=a.head_dim, max_position_embeddings=a.max_context, rms_norm_eps=a.norm_eps,
                       rope_theta=a.rope_theta, tie_word_embeddings=a.tied_embeddings, attention_bias=False,
                       mlp_bias=False, bos_token_id=1, eos_token_id=2, pad_token_id=None)


#: The length of the block of random values `fill_random_` tiles through a tensor: a prime, so the rows of any
#: matrix narrower than it start at different places in the block, and no two rows are equal.
RANDOM_BLOCK = 4_194_301


def fill_random_(tensors, *, seed: int = 0, scale: float = 0.02) -> None:
    """Write small pseudo-random values into every tensor, at copy speed (chapter 00). One block of RANDOM_BLOCK
    values, uniform in [-scale, scale], is drawn once and tiled through each tensor from a different starting point:
    drawing every value anew runs well under 1 GB/s on a CPU, whose random generator is serial. Timings do not depend
    on the values, and every byte is written (no zero or untouched pages). 1-D tensors (norm weights) are set to 1,
    as in a freshly initialised model."""
    g = torch.Generator().manual_seed(seed)
    block = torch.empty(RANDOM_BLOCK).uniform_(-scale, scale, generator=g)
    block = torch.cat([block, block])                    # any start below RANDOM_BLOCK has a whole block after it
    sources: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
    with torch.no_grad():
        for i, t in enumerate(tensors):
            if t.dim() <= 1:
                t.fill_(1.0)
                continue
            src = sources.setdefault((t.device, t.dtype), block.to(t.device, t.dtype))
            flat, start = t.view(-1), (i * 7919) % RANDOM_BLOCK
            for pos in range(0, flat.numel(), RANDOM_BLOCK):
                k = min(RANDOM_BLOCK, flat.numel() - pos)
                flat[pos:pos + k].copy_(src[start:start + k])


def build_random(arch: str | Architecture, *, n_layers: int | None = None, dtype: str | torch.dtype = "fp32",
                 device: torch.device | str | None = None, seed: int = 0):
    """A transformers model with random weights and the architecture's exact shapes (chapter 00).

    Timing does not depend on weight values, so random weights give honest timings; text does not. The model is
    built without memory (on PyTorch's meta device), then given memory and filled by `fill_random_`, which is many
    times quicker than transformers' own random initialisation on a CPU.
    """
    a = architecture(arch)
    if n_layers is not None:
        a = a.with_layers(n_layers)
    from transformers import AutoModelForCausalLM
    dev, tdtype = as_device(device), _torch_dtype(dtype)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(a), dtype=tdtype)
    if dev.type != "meta":
        model.to_empty(device=dev)
        model.tie_weights()                              # to_empty gives tied weights separate memory
        fill_random_(list(model.parameters()), seed=seed)
        for module in model.modules():                   # buffers (the rotary frequencies) are computed, not random
            if module._buffers:
                with torch.device(dev):
                    fresh = type(module)(config=model.config)
                for b, value in fresh._buffers.items():
                    module._buffers[b] = value
    return model.eval()


class OfflineError(RuntimeError):
    """Raised when weights would have to be downloaded but the book is offline (chapter 00)."""


# The book's own code models, trained by `python -m book.train` and shipped inside the package (appendix A).
SHIPPED = ("coder", "coder-draft", "coder-draft-distilled")
WEIGHTS = Path(__file__).resolve().parent / "weights"


def shipped_path(name: str) -> Path:
    """The folder of one of the book's own models (`SHIPPED`), which works offline (appendix A)."""
    if name not in SHIPPED:
        raise KeyError(f"{name!r} is not one of the book's own models; they are {', '.join(SHIPPED)}")
    path = WEIGHTS / name
    if not (path / "model.safetensors").exists():
        raise FileNotFoundError(f"{path} holds no model.safetensors: the book's models were not shipped with this "
                                f"install; retrain them with `python -m book.train all`")
    return path


def _resolve(name_or_path: str | os.PathLike) -> tuple[str, bool]:
    """(where to load from, whether it is a local folder)."""
    if str(name_or_path) in SHIPPED:
        return str(shipped_path(str(name_or_path))), True
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path} is a folder but holds no config.json: not a saved transformers model")
        return str(path), True
    name = str(name_or_path)
    try:
        return architecture(name).hub_id, False
    except KeyError as err:
        if "/" in name and not path.exists() and not name.startswith((".", "/", "~")):
            return name, False  # any hub id, e.g. "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
        raise KeyError(f"{err.args[0]}; the book's own models: {', '.join(SHIPPED)}") from None


def _offline() -> bool:
    try:
        import huggingface_hub.constants as c
        return bool(c.HF_HUB_OFFLINE)
    except ImportError:
        return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def _load(loader, name_or_path: str | os.PathLike, **kwargs):
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()   # its widget would pull scripts from a CDN into the static book
    source, local = _resolve(name_or_path)
    try:
        return loader(source, **kwargs)
    except OSError as err:
        if not local and _offline():
            raise OfflineError(
                f"{source!r} is not in the local Hugging Face cache and the book is offline (HF_HUB_OFFLINE=1).\n"
                f"Either pass a folder that holds the weights (saved with save_pretrained or downloaded), or go "
                f"online: book.setup(online=True) (or set BOOK_ONLINE=1 before starting), log in with "
                f"`huggingface-cli login` if the model is gated, and call load() again.") from err
        raise


def load(name_or_path: str | os.PathLike, *, dtype: str | torch.dtype | None = None,
         device: torch.device | str | None = None):
    """Load real weights: the book's own "coder"/"coder-draft", a local folder, or a catalog name / hub id online."""
    from transformers import AutoModelForCausalLM
    kwargs = {} if dtype is None else {"dtype": _torch_dtype(dtype)}
    model = _load(AutoModelForCausalLM.from_pretrained, name_or_path, **kwargs)
    return model.to(as_device(device)).eval()


def load_tokenizer(name_or_path: str | os.PathLike):
    """The tokenizer saved beside a model, from a local folder, or by catalog name / hub id when online (chapter 00)."""
    from transformers import AutoTokenizer
    return _load(AutoTokenizer.from_pretrained, name_or_path)
