"""GPU datasheets and the measured ceilings of the reader's own device: bandwidth and matmul rate (chapter 00)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from .device import as_device, device_name, last_level_cache_bytes, memory_bytes
from .timing import Timing, time_fn

__all__ = ["GPUSpec", "GPUS", "gpu", "gpu_names", "datasheet_for", "Ceilings", "measure_read_bandwidth",
           "measure_copy_bandwidth", "measure_matmul", "random_tensor", "supported_matmul_dtypes", "measured_ceilings",
           "bandwidth_test_bytes", "bandwidth_sweep", "sweep_sizes", "reference_suite", "DTYPES"]

GB = 1e9
TFLOP = 1e12

#: The names the book uses for matmul precisions. "tf32" is fp32 storage with TensorFloat-32 tensor-core math.
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                                  "fp16": torch.float16}


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet: memory, bandwidth and dense peak rates in TFLOP/s per precision (chapter 00)."""

    name: str
    memory_gb: float
    bandwidth_gbs: float
    tflops: dict[str, float]  # dense (no structured sparsity); a precision the GPU lacks is absent
    source: str
    notes: str = ""
    aliases: tuple[str, ...] = field(default=())

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense peak in FLOP/s for one precision; a clear error when the GPU lacks it (chapter 02)."""
        if dtype not in self.tflops:
            raise ValueError(f"{self.name} has no {dtype} rate on its datasheet; it has {sorted(self.tflops)}")
        return self.tflops[dtype] * TFLOP

    def ridge_point(self, dtype: str = "bf16") -> float:
        """FLOPs per byte where the roofline bends: peak rate / bandwidth (chapter 02)."""
        return self.peak_flops(dtype) / (self.bandwidth_gbs * GB)


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (r4) and NVIDIA A100 architecture whitepaper"
_HOPPER_NOTE = "Datasheet figures with sparsity are twice these dense ones."

GPUS: dict[str, GPUSpec] = {s.name: s for s in [
    GPUSpec("A100 40GB", 40, 1555, {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, _A100,
            "SXM; HBM2", aliases=("a100-sxm4-40gb", "a100-40gb", "a100 40gb", "a100-pcie-40gb")),
    GPUSpec("A100 80GB", 80, 2039, {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, _A100,
            "SXM; HBM2e (the PCIe card: 1935 GB/s)", aliases=("a100-sxm4-80gb", "a100-80gb", "a100 80gb",
                                                              "a100 80gb pcie", "a100")),
    GPUSpec("H100 SXM", 80, 3350, {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
            "NVIDIA H100 Tensor Core GPU datasheet; dense rates from the NVIDIA H100 architecture whitepaper",
            _HOPPER_NOTE + " HBM3.", aliases=("h100 80gb hbm3", "h100", "h100-sxm5-80gb")),
    GPUSpec("H200", 141, 4800, {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
            "NVIDIA H200 Tensor Core GPU datasheet (compute as H100 SXM)",
            _HOPPER_NOTE + " HBM3e; SXM.", aliases=("h200 sxm", "h200-sxm", "nvidia h200")),
    GPUSpec("L4", 24, 300, {"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121},
            "NVIDIA L4 Tensor Core GPU datasheet", "72 W card; the datasheet's tensor rates are with sparsity, "
            "halved here", aliases=("nvidia l4",)),
    GPUSpec("T4", 16, 320, {"fp32": 8.1, "fp16": 65},
            "NVIDIA T4 Tensor Core GPU datasheet and product page", "Turing: no bf16 or tf32 tensor cores; "
            "fp16 is mixed precision (fp32 accumulate); the datasheet table says 300 GB/s, the product page 320",
            aliases=("tesla t4", "nvidia t4")),
    GPUSpec("A10G", 24, 600, {"fp32": 35, "tf32": 35, "bf16": 70, "fp16": 70},
            "NVIDIA A10G datasheet published by AWS (EC2 G5)", "AWS variant of the A10 (A10: 31.2/62.5/125 "
            "TFLOP/s); rates are dense", aliases=("nvidia a10g",)),
    GPUSpec("RTX 4090", 24, 1008, {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
            "NVIDIA Ada GPU architecture whitepaper, appendix A", "GeForce: fp16/bf16 with fp32 accumulate "
            "(330.3 with fp16 accumulate)", aliases=("geforce rtx 4090", "nvidia geforce rtx 4090", "4090")),
]}


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]+", " ", name.lower().replace("nvidia", "").replace("tesla", "")).strip()


def gpu_names() -> list[str]:
    """The GPUs in the datasheet catalog (chapter 00)."""
    return list(GPUS)


def gpu(name: str) -> GPUSpec:
    """A catalog GPU by name or alias, case-insensitive; an unknown name lists the known ones (chapter 00)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a GPU name must be a non-empty string, got {name!r}; known GPUs: {', '.join(GPUS)}")
    wanted = _key(name)
    for spec in GPUS.values():
        if wanted == _key(spec.name) or wanted in {_key(a) for a in spec.aliases}:
            return spec
    raise KeyError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)}")


def datasheet_for(name: str) -> GPUSpec | None:
    """The catalog entry that matches a device name as torch reports it, e.g. 'NVIDIA H200' (chapter 00)."""
    key = _key(name)
    try:
        return gpu(name)
    except KeyError:
        pass
    # torch names look like "NVIDIA A100-SXM4-80GB" or "NVIDIA GeForce RTX 4090"; match longest alias inside.
    best: tuple[int, GPUSpec] | None = None
    for spec in GPUS.values():
        for alias in (spec.name, *spec.aliases):
            a = _key(alias)
            if a and a in key and (best is None or len(a) > best[0]):
                best = (len(a), spec)
    if best and best[1].name.startswith("A100") and "40" not in key and "80" not in key:
        return None  # an A100 of unknown memory size: do not guess
    return best[1] if best else None


# --------------------------------------------------------------------------------------------- measured ceilings

def bandwidth_test_bytes(device: torch.device | str | None = None) -> int:
    """A tensor size well beyond the last-level cache: 4 x LLC, at least 256 MiB, at most 1/8 of memory (chapter 00)."""
    dev = as_device(device)
    llc = last_level_cache_bytes(dev) or 64 * 2**20
    size = max(256 * 2**20, 4 * llc)
    if dev.type == "cuda":
        size = max(size, 2 * 2**30)
    mem = memory_bytes(dev)
    if mem:
        size = min(size, mem // 8)
    return int(size) // 4096 * 4096


def random_tensor(*shape: int, device: torch.device | str | None = None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random values to time on (never zeros); on the CPU a tiled random block: as random to DRAM, 5x faster (chapter 00)."""
    dev = as_device(device)
    numel = 1
    for s in shape:
        if s <= 0:
            raise ValueError(f"tensor sizes must be positive, got shape {shape}")
        numel *= s
    block = 1 << 20
    if dev.type != "cpu" or numel <= block:
        return torch.randn(*shape, device=dev).to(dtype)
    tile = torch.randn(block).to(dtype)
    flat = tile.repeat(-(-numel // block))[:numel]
    return flat.reshape(shape).clone() if numel % block else flat.reshape(shape)


def _random_tensor(nbytes: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return random_tensor(max(1, nbytes // torch.empty((), dtype=dtype).element_size()), device=device, dtype=dtype)


def measure_read_bandwidth(nbytes: int | None = None, device: torch.device | str | None = None, *,
                           repeats: int = 10, x: torch.Tensor | None = None) -> tuple[float, Timing]:
    """Read bandwidth in bytes/s: sum a float32 tensor of `nbytes` (read once, nothing written) (chapter 00)."""
    dev = as_device(device)
    if x is None:
        if nbytes is None:
            nbytes = bandwidth_test_bytes(dev)
        if nbytes <= 0:
            raise ValueError(f"tensor size must be positive, got {nbytes} bytes")
        x = _random_tensor(nbytes, dev)
    t = time_fn(lambda: x.sum(), device=dev, warmup=2, repeats=repeats, number=None)
    return x.numel() * x.element_size() / t.median, t


def measure_copy_bandwidth(nbytes: int | None = None, device: torch.device | str | None = None, *,
                           repeats: int = 10) -> tuple[float, Timing]:
    """Copy bandwidth in bytes/s: dst.copy_(src) counted as read + write, 2 x `nbytes` per copy (chapter 00)."""
    dev = as_device(device)
    if nbytes is None:
        nbytes = bandwidth_test_bytes(dev)
    if nbytes <= 0:
        raise ValueError(f"tensor size must be positive, got {nbytes} bytes")
    src = _random_tensor(nbytes, dev)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device=dev, warmup=2, repeats=repeats, number=None)
    return 2 * src.numel() * src.element_size() / t.median, t


def supported_matmul_dtypes(device: torch.device | str | None = None) -> list[str]:
    """The matmul precisions worth measuring on this device (chapter 00)."""
    dev = as_device(device)
    if dev.type == "cuda":
        major, _ = torch.cuda.get_device_capability(dev)
        return ["fp32", "tf32", "bf16", "fp16"] if major >= 8 else ["fp32", "fp16"]
    if dev.type == "mps":
        return ["fp32", "fp16"]
    return ["fp32", "bf16", "fp16"]


def measure_matmul(dtype: str = "fp32", device: torch.device | str | None = None, *, n: int | None = None,
                   repeats: int = 5, target_s: float | None = None) -> tuple[float, int, Timing]:
    """Matmul rate in FLOP/s of an n x n @ n x n product (2n^3 FLOPs); returns (rate, n, timing) (chapter 00).

    Without `n`, the size doubles from 256 until one product lasts `target_s` (GPU: also n >= 4096).
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown matmul precision {dtype!r}; use one of {list(DTYPES)}")
    dev = as_device(device)
    if target_s is None:
        target_s = 0.02 if dev.type == "cpu" else 0.005
    tdtype = DTYPES[dtype]
    allow = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        if n is None:
            n, cap = 256, (16384 if dev.type == "cuda" else 4096)
            while True:
                a = torch.randn(n, n, device=dev).to(tdtype)
                t = time_fn(lambda: a @ a, device=dev, warmup=1, repeats=1)
                if (t.median >= target_s and (dev.type != "cuda" or n >= 4096)) or n >= cap:
                    break
                n *= 2
        if n <= 0:
            raise ValueError(f"matrix size must be positive, got {n}")
        a = torch.randn(n, n, device=dev).to(tdtype)
        b = torch.randn(n, n, device=dev).to(tdtype)
        t = time_fn(lambda: a @ b, device=dev, warmup=2, repeats=repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow
    return 2 * n**3 / t.median, n, t


@dataclass(frozen=True)
class Ceilings:
    """Measured ceilings of one device: read and copy bandwidth (bytes/s) and matmul rate per precision (chapter 00)."""

    device: str
    kind: str
    read_bw: float
    copy_bw: float
    matmul: dict[str, float]
    bytes_tested: int
    matmul_sizes: dict[str, int]
    datasheet: GPUSpec | None = None

    @property
    def peak_bw(self) -> float:
        """The larger of the read and copy bandwidths: the book's 'measured peak' (chapter 00)."""
        return max(self.read_bw, self.copy_bw)

    def fastest(self, dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32")) -> str:
        """The precision in `dtypes` with the highest measured matmul rate; ties go to the first (chapter 01)."""
        return max(dtypes, key=lambda d: self.matmul.get(d, 0.0))

    def ridge_point(self, dtype: str = "fp32") -> float:
        """Measured FLOPs per byte where this device's roofline bends (chapter 02)."""
        return self.matmul[dtype] / self.peak_bw

    def table(self) -> str:
        """The ceilings as a small text table, with the datasheet beside them when the device is in the catalog."""
        ds = self.datasheet
        rows = [("memory read bandwidth", f"{self.read_bw / GB:,.1f} GB/s",
                 f"{ds.bandwidth_gbs:,.0f} GB/s" if ds else "-"),
                ("memory copy bandwidth (read+write)", f"{self.copy_bw / GB:,.1f} GB/s",
                 f"{ds.bandwidth_gbs:,.0f} GB/s" if ds else "-")]
        for name, rate in self.matmul.items():
            sheet = f"{ds.tflops[name]:,.1f} TFLOP/s" if ds and name in ds.tflops else "-"
            rows.append((f"matmul {name} (n={self.matmul_sizes[name]})", f"{rate / TFLOP:,.3f} TFLOP/s", sheet))
        w = max(len(r[0]) for r in rows)
        lines = [f"{'ceiling':<{w}}  {'measured':>18}  {'datasheet':>16}"]
        lines += [f"{a:<{w}}  {b:>18}  {c:>16}" for a, b, c in rows]
        lines.append(f"device: {self.device}; bandwidth tensors {self.bytes_tested / 2**20:,.0f} MiB")
        lines.append(f"datasheet: {ds.name} ({ds.source})" if ds else "datasheet: none in the catalog for this device")
        return "\n".join(lines)


_CEILINGS: dict[str, Ceilings] = {}


def measured_ceilings(device: torch.device | str | None = None, *, refresh: bool = False,
                      dtypes: list[str] | None = None) -> Ceilings:
    """Measure (once per kernel, then cached) the device's bandwidth and matmul ceilings (chapter 00)."""
    dev = as_device(device)
    key = f"{dev}:{dtypes}"
    if key in _CEILINGS and not refresh:
        return _CEILINGS[key]
    nbytes = bandwidth_test_bytes(dev)
    read_bw, _ = measure_read_bandwidth(nbytes, dev)
    copy_bw, _ = measure_copy_bandwidth(nbytes, dev)
    rates, sizes = {}, {}
    for name in dtypes or supported_matmul_dtypes(dev):
        rates[name], sizes[name], _ = measure_matmul(name, dev)
    name = device_name(dev)
    ceilings = Ceilings(device=name, kind=dev.type, read_bw=read_bw, copy_bw=copy_bw, matmul=rates,
                        bytes_tested=nbytes, matmul_sizes=sizes,
                        datasheet=datasheet_for(name) if dev.type == "cuda" else None)
    _CEILINGS[key] = ceilings
    return ceilings


def bandwidth_sweep(sizes: list[int], device: torch.device | str | None = None, *,
                    repeats: int = 7) -> list[tuple[int, float]]:
    """Read bandwidth (bytes/s) at each tensor size: where the caches end and memory begins (chapter 00)."""
    from .build import progress
    dev = as_device(device)
    out = []
    for nbytes in progress(sizes, desc="bandwidth sweep"):
        bw, _ = measure_read_bandwidth(nbytes, dev, repeats=repeats)
        out.append((int(nbytes), bw))
    return out


def sweep_sizes(device: torch.device | str | None = None, points_per_octave: int = 1) -> list[int]:
    """Tensor sizes from 16 KiB up to the bandwidth test size, doubling (chapter 00)."""
    top = bandwidth_test_bytes(device)
    sizes, s = [], 16 * 2**10
    while s <= top:
        sizes.append(s)
        s = int(s * 2 ** (1 / points_per_octave))
    return sizes


def reference_suite(device: torch.device | str | None = None) -> dict:
    """The preface's recorded results: measured ceilings and read bandwidth against tensor size (chapter 00)."""
    dev = as_device(device)
    c = measured_ceilings(dev, refresh=True)
    values = {"read_bw_gbs": c.read_bw / GB, "copy_bw_gbs": c.copy_bw / GB, "bytes_tested": float(c.bytes_tested)}
    values.update({f"matmul_{k}_tflops": v / TFLOP for k, v in c.matmul.items()})
    sweep = bandwidth_sweep(sweep_sizes(dev), dev)
    return {"values": values,
            "series": {"read_bw_vs_size": {"x": [s for s, _ in sweep], "y": [bw / GB for _, bw in sweep],
                                           "x_label": "tensor size (bytes)", "y_label": "read bandwidth (GB/s)"}}}
