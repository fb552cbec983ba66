"""Helpers for the book *Why LLM decoding is slow, measured*. Each function's docstring names the chapter that teaches it.

Modules, bottom-up: device -> timing -> kernels -> hardware -> models -> llama -> bench; verdict (sentences computed
from measurements); build, plots, exercises -> widgets;
reference (resolves each chapter's suite lazily).
"""
from __future__ import annotations

import os

# Offline by default: weights and data sets are never downloaded unless the reader opts in (BOOK_ONLINE=1).
if os.environ.get("BOOK_ONLINE", "").strip().lower() not in ("1", "true", "yes"):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

import random  # noqa: E402

import torch  # noqa: E402

from . import device, hardware, kernels, models, timing, verdict  # noqa: E402
from .build import is_static, progress  # noqa: E402
from .device import device_name, pick_device, synchronize  # noqa: E402
from .exercises import check_choice, check_number  # noqa: E402
from .timing import Timing, time_fn  # noqa: E402
from .widgets import grid, slider  # noqa: E402

__version__ = "0.1.0"
__all__ = ["setup", "seed_everything", "set_online", "time_fn", "Timing", "slider", "grid", "progress", "is_static",
           "check_number", "check_choice", "pick_device", "synchronize", "device", "hardware", "kernels", "models",
           "timing", "verdict"]

COLAB_GPU_HINT = ("No GPU found: every measurement on this page runs on the CPU (GPU numbers\n"
                  "beside them are labelled reference or published results). The formulas\n"
                  "are the same; a CPU's ceilings differ, and the lines under each result\n"
                  "say what this device shows. For a GPU in Colab: Runtime > Change\n"
                  "runtime type > T4 GPU (or better), then Runtime > Run all.")


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and torch (all devices) (chapter 00)."""
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)  # also seeds every CUDA device


def set_online(online: bool) -> None:
    """Allow (True) or forbid (False) downloads from the Hugging Face hub, also after transformers is imported (chapter 00)."""
    os.environ["HF_HUB_OFFLINE"] = "0" if online else "1"
    try:
        import huggingface_hub.constants as c
        c.HF_HUB_OFFLINE = not online
    except ImportError:
        pass


def setup(seed: int = 0, *, online: bool | None = None, device: str | None = None, measure: bool = True,
          verbose: bool = True, table: bool = True) -> torch.device:
    """Seed everything, pick the device, go offline unless asked, and print a device summary (chapter 00).

    `online=None` reads $BOOK_ONLINE. `measure=True` also measures the device's ceilings (cached per kernel), and
    prints their table where `table` (chapter 00 prints it under its own explanation instead).
    """
    from . import plots, reference
    seed_everything(seed)
    if online is None:
        online = os.environ.get("BOOK_ONLINE", "").strip().lower() in ("1", "true", "yes")
    set_online(online)
    dev = pick_device(device)
    plots.apply_style()
    if not verbose:
        if measure:
            hardware.measured_ceilings(dev)
        return dev
    lines = [f"device: {dev.type} - {device_name(dev)}",
             f"torch {torch.__version__}" + (f", CUDA {torch.version.cuda}" if dev.type == "cuda" else "")
             + f", book {__version__}",
             "Hugging Face hub: " + ("online (downloads allowed)" if online else
                                     "offline (HF_HUB_OFFLINE=1);\n  book.setup(online=True) allows downloads")]
    refs = reference.load_references()
    lines.append("numbers measured on this page: live on this device; recorded ones (training\n"
                 "  manifest, reference GPU, published runs) are labelled as such;\n"
                 + (f"reference results recorded on {', '.join(sorted({r.device for r in refs}))}\n"
                    "  (shown beside yours where a chapter has them)" if refs
                    else "no reference-GPU results are recorded yet"))
    print("\n".join(lines))
    if dev.type == "cpu":
        print(COLAB_GPU_HINT)
    if measure:
        c = hardware.measured_ceilings(dev)
        if table:
            print()
            print(c.table())
    return dev
