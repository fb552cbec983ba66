"""Which device the book runs on, and how to wait for it (chapter 00)."""
from __future__ import annotations

import os
import platform

import torch

__all__ = ["pick_device", "synchronize", "device_name", "device_kind", "last_level_cache_bytes", "memory_bytes"]


def pick_device(prefer: str | None = None) -> torch.device:
    """Pick cuda, then mps, then cpu; `prefer` or $BOOK_DEVICE overrides (chapter 00)."""
    choice = prefer or os.environ.get("BOOK_DEVICE")
    if choice:
        dev = torch.device(choice)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {choice!r} was asked for, but torch sees no CUDA GPU here")
        if dev.type == "mps" and not torch.backends.mps.is_available():
            raise RuntimeError(f"device {choice!r} was asked for, but torch sees no Apple MPS device here")
        if dev.type not in ("cuda", "mps", "cpu"):
            raise ValueError(f"unknown device {choice!r}: use 'cuda', 'mps' or 'cpu'")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def as_device(device: torch.device | str | None) -> torch.device:
    """Normalise a device argument; None means the book's default device (chapter 00)."""
    return pick_device() if device is None else torch.device(device)


def device_kind(device: torch.device | str | None = None) -> str:
    """'cuda', 'mps' or 'cpu' (chapter 00)."""
    return as_device(device).type


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until all queued work on the device has finished: GPUs run asynchronously (chapter 00)."""
    dev = as_device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def device_name(device: torch.device | str | None = None) -> str:
    """A human name for the device, e.g. 'NVIDIA H200' or 'Intel(R) Xeon(R) Processor (2 threads)' (chapter 00)."""
    dev = as_device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "mps":
        return f"Apple {platform.machine()} GPU (MPS)"
    return f"{_cpu_model_name()} ({torch.get_num_threads()} threads)"


def last_level_cache_bytes(device: torch.device | str | None = None) -> int | None:
    """Size of the last-level cache (GPU L2 or CPU L3/L2) in bytes, when the system says (chapter 00)."""
    dev = as_device(device)
    if dev.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0)) or None
    if dev.type == "cpu":
        best = 0
        base = "/sys/devices/system/cpu/cpu0/cache"
        try:
            for entry in os.listdir(base):
                if not entry.startswith("index"):
                    continue
                with open(f"{base}/{entry}/size") as f:
                    text = f.read().strip()
                units = {"K": 1024, "M": 1024**2, "G": 1024**3}
                best = max(best, int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
        except (OSError, ValueError, KeyError):
            return None
        return best or None
    return None


def memory_bytes(device: torch.device | str | None = None) -> int | None:
    """Total memory of the device (GPU memory, or the machine's RAM for the CPU) in bytes (chapter 00)."""
    dev = as_device(device)
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
