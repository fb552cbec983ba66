"""Tensor parallelism by arithmetic: a decode step split over N GPUs, its bytes, its all-reduces, its time
(chapter 06).

Megatron-style tensor parallelism splits every layer's matrices over N GPUs: the attention's heads (each GPU holds
n_heads/N query heads and their key/value heads, so its slice of the KV cache too) and the MLP's intermediate
columns. Each GPU then reads 1/N of the layer weights per step, and the partial results are summed across GPUs twice
per layer, after the attention's output projection and after the MLP's down projection: two all-reduces of a
[batch, hidden] activation per layer. At batch 1 that message is a few kilobytes, so each all-reduce costs its fixed
latency rather than its bytes, and those latencies do not shrink as N grows: the reason a decode step does not get N
times faster. The embedding table and the LM head are either copied on every GPU (gpt-fast) or split by vocabulary
(vLLM, Megatron): `shard_vocab`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .hardware import GB, GPUS, GPUSpec
from .memory import GIB
from .models import Architecture, architecture, dtype_bytes

__all__ = ["Interconnect", "INTERCONNECTS", "TPStep", "tp_decode", "allreduce_seconds", "interconnect"]


@dataclass(frozen=True)
class Interconnect:
    """A GPU-to-GPU link: bandwidth per GPU per direction (datasheet) (chapter 06)."""
    name: str
    bw_gbs: float
    source: str


INTERCONNECTS: dict[str, Interconnect] = {i.name: i for i in [
    Interconnect("NVLink 3 (A100 SXM)", 300, "NVIDIA A100 datasheet: 600 GB/s NVLink per GPU, both directions"),
    Interconnect("NVLink 4 (H100 SXM)", 450, "NVIDIA H100 datasheet: 900 GB/s NVLink per GPU, both directions"),
    Interconnect("PCIe 4.0 x16", 32, "PCI-SIG: 16 GT/s x 16 lanes, 128b/130b coding: about 31.5 GB/s per direction"),
    Interconnect("PCIe 5.0 x16", 63, "PCI-SIG: 32 GT/s x 16 lanes, 128b/130b coding: about 63 GB/s per direction"),
]}


def interconnect(name: str | Interconnect) -> Interconnect:
    """An interconnect by name; an unknown one lists the known (chapter 06)."""
    if isinstance(name, Interconnect):
        return name
    if name not in INTERCONNECTS:
        raise KeyError(f"unknown interconnect {name!r}; known: {', '.join(INTERCONNECTS)}")
    return INTERCONNECTS[name]


def allreduce_seconds(nbytes: float, gpus: int, link: Interconnect, latency_s: float) -> float:
    """One ring all-reduce of `nbytes` over `gpus` GPUs: a fixed latency plus each GPU sending and receiving
    2 (N-1)/N of the message over its link (chapter 06). Zero on one GPU."""
    if gpus < 1 or nbytes < 0 or latency_s < 0:
        raise ValueError(f"need gpus >= 1, nbytes >= 0 and latency >= 0, got {gpus}, {nbytes}, {latency_s}")
    if gpus == 1:
        return 0.0
    return latency_s + 2 * (gpus - 1) / gpus * nbytes / (link.bw_gbs * GB)


@dataclass(frozen=True)
class TPStep:
    """One decode step of a model split over `gpus` GPUs: bytes and time per GPU (chapter 06)."""
    model: str
    gpus: int
    batch: int
    context: int
    weight_bytes_held: float          # per GPU: its share of the layers, plus the embedding and LM head it holds
    weight_bytes_read: float          # per GPU per step (the embedding table is not read, one row of it is)
    kv_bytes: float                   # per GPU, the whole batch at `context`
    allreduces: int                   # per step: two per layer
    allreduce_bytes: float            # one all-reduce's message: batch x hidden activations
    memory_s: float                   # (weights read + KV) / bandwidth
    comm_s: float                     # all-reduces, back to back with the memory time (no overlap at batch 1)
    fits: bool                        # weights + KV within the GPU's memory (its datasheet GB read as GiB)
    memory_gb: float                  # the GPU's memory, datasheet "GB" (GiB: chapter 03)

    @property
    def step_s(self) -> float:
        """The predicted step: memory time plus communication time (chapter 06)."""
        return self.memory_s + self.comm_s

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second per sequence (batch 1: per user) (chapter 06)."""
        return 1.0 / self.step_s

    @property
    def held_gb(self) -> float:
        """Weights and KV cache one GPU holds, GB (chapter 06)."""
        return (self.weight_bytes_held + self.kv_bytes) / GB


def tp_decode(model: str | Architecture, gpus: int, gpu: str | GPUSpec = "A100 80GB",
              link: str | Interconnect = "NVLink 3 (A100 SXM)", *, batch: int = 1, context: int = 512,
              dtype: str = "bf16", latency_us: float = 10.0, bandwidth_gbs: float | None = None,
              shard_vocab: bool = False) -> TPStep:
    """Predict one decode step of `model` tensor-parallel over `gpus` GPUs (chapter 06). `bandwidth_gbs` replaces the
    datasheet bandwidth (e.g. one measured by a benchmark); `latency_us` is each all-reduce's fixed cost, an input the
    chapter varies, not a datasheet number."""
    a = architecture(model)
    g = gpus
    spec = GPUS[gpu] if isinstance(gpu, str) and gpu in GPUS else gpu
    if not isinstance(spec, GPUSpec):
        raise KeyError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    link = interconnect(link)
    if not isinstance(g, int) or g < 1:
        raise ValueError(f"the number of GPUs must be a positive integer, got {gpus!r}")
    if batch < 1 or context < 1:
        raise ValueError(f"batch and context must be at least 1, got batch={batch}, context={context}")
    if context > a.max_context:
        raise ValueError(f"{a.name} holds at most {a.max_context} tokens of context, got {context}")
    if a.n_heads % g or a.intermediate % g:
        raise ValueError(f"{a.name}'s {a.n_heads} heads and {a.intermediate} MLP columns must split evenly over "
                         f"{g} GPUs")
    if a.n_kv_heads % g and g % a.n_kv_heads:
        raise ValueError(f"{a.name}'s {a.n_kv_heads} KV heads neither split over nor copy onto {g} GPUs")
    b = dtype_bytes(dtype)
    layers = a.n_layers * a.params_per_layer() * b
    emb = a.vocab * a.hidden * b
    head = 0 if a.tied_embeddings else emb            # a separate LM head; tied: the embedding is the head
    vocab_share = g if shard_vocab else 1
    held = layers / g + (emb + head) / vocab_share
    read = layers / g + emb / vocab_share             # the LM head (or the tied embedding as head) is read whole
    kv_heads_here = max(1, a.n_kv_heads // g)          # more GPUs than KV heads: each keeps a copy of one
    kv = 2 * a.n_layers * kv_heads_here * a.head_dim * b * context * batch
    bw = (bandwidth_gbs if bandwidth_gbs is not None else spec.bandwidth_gbs) * GB
    if bw <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth_gbs}")
    n_ar = 2 * a.n_layers if g > 1 else 0
    msg = batch * a.hidden * b
    comm = n_ar * allreduce_seconds(msg, g, link, latency_us * 1e-6)
    return TPStep(model=a.name, gpus=g, batch=batch, context=context, weight_bytes_held=held, weight_bytes_read=read,
                  kv_bytes=kv, allreduces=n_ar, allreduce_bytes=msg, memory_s=(read + kv) / bw, comm_s=comm,
                  fits=held + kv <= spec.memory_gb * GIB, memory_gb=spec.memory_gb)
