"""Recorded results of reference devices, so a book built anywhere can show GPU numbers beside the reader's (chapter 00).

A reference file is JSON:

    {"format": "book-reference/1", "device": "NVIDIA H200", "kind": "cuda", "date": "2026-11-20",
     "torch": "2.13.0", "cuda": "12.8", "suites": {"<chapter>": {"values": {"name": 1.0},
     "series": {"name": {"x": [...], "y": [...], "x_label": "...", "y_label": "..."}}}}}

`python -m book.reference record` runs every registered suite on the current device and writes one file into
`book/references/`; `python -m book.reference list` shows what is recorded.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

FORMAT = "book-reference/1"
REFERENCE_DIR = Path(__file__).with_name("references")

#: Each chapter's measurement suite: "module:function", called as function(device, quick=False) -> {"values",
#: "series"}; quick=True shrinks its sweeps (a check that it runs, not a reference).
SUITES: dict[str, str] = {
    "00_how_to_use_this_book": "book.hardware:reference_suite",
    "01_serial_decoding": "book.decode:reference_suite",
    "02_roofline": "book.roofline:reference_suite",
    "03_memory_breakdown": "book.memory:reference_suite",
}

__all__ = ["FORMAT", "SUITES", "Reference", "read", "write", "load_references", "latest", "record", "main"]


class ReferenceFormatError(ValueError):
    """A reference file that does not follow the format (chapter 00)."""


@dataclass
class Reference:
    """The recorded results of one device (chapter 00)."""

    device: str
    kind: str
    date: str
    torch: str
    cuda: str | None
    suites: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: Path | None = None
    quick: bool = False                  # recorded with `record --quick`: smaller sweeps, never shipped

    def values(self, suite: str) -> dict[str, float]:
        """Scalar results of one chapter's suite."""
        return dict(self.suites.get(suite, {}).get("values", {}))

    def series(self, suite: str, name: str) -> tuple[list[float], list[float]] | None:
        """(x, y) of one recorded series, or None when this reference lacks it."""
        s = self.suites.get(suite, {}).get("series", {}).get(name)
        return (list(s["x"]), list(s["y"])) if s else None

    def label(self) -> str:
        return f"{self.device} (recorded {self.date}, torch {self.torch})"

    def to_json(self) -> dict[str, Any]:
        data = {"format": FORMAT, "device": self.device, "kind": self.kind, "date": self.date, "torch": self.torch,
                "cuda": self.cuda, "suites": self.suites}
        return {**data, "quick": True} if self.quick else data


def _validate(data: Any, where: str) -> None:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ReferenceFormatError(f"{where}: not a reference file (expected \"format\": \"{FORMAT}\")")
    for key in ("device", "kind", "date", "torch", "suites"):
        if key not in data:
            raise ReferenceFormatError(f"{where}: missing field {key!r}")
    if not isinstance(data["suites"], dict):
        raise ReferenceFormatError(f"{where}: 'suites' must map chapter names to results")
    for suite, body in data["suites"].items():
        if not isinstance(body, dict):
            raise ReferenceFormatError(f"{where}: suite {suite!r} must be an object")
        for name, v in body.get("values", {}).items():
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ReferenceFormatError(f"{where}: {suite}.values.{name} must be a finite number, got {v!r}")
        for name, s in body.get("series", {}).items():
            if not isinstance(s, dict) or len(s.get("x", [])) != len(s.get("y", [None])):
                raise ReferenceFormatError(f"{where}: {suite}.series.{name} needs x and y lists of equal length")


def read(path: str | Path) -> Reference:
    """Load and validate one reference file (chapter 00)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ReferenceFormatError(f"{path}: not valid JSON ({err})") from err
    _validate(data, str(path))
    return Reference(device=data["device"], kind=data["kind"], date=data["date"], torch=data["torch"],
                     cuda=data.get("cuda"), suites=data["suites"], path=path, quick=bool(data.get("quick")))


def write(ref: Reference, path: str | Path) -> Path:
    """Write a reference file (validated first) (chapter 00)."""
    data = ref.to_json()
    _validate(data, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def load_references(directory: str | Path | None = None) -> list[Reference]:
    """Every reference file shipped with the book, oldest first; quick recordings are left out (chapter 00)."""
    d = Path(directory) if directory else REFERENCE_DIR
    refs = [read(p) for p in sorted(d.glob("*.json"))] if d.is_dir() else []
    return sorted((r for r in refs if not r.quick), key=lambda r: r.date)


def latest(suite: str, *, kind: str = "cuda", directory: str | Path | None = None) -> Reference | None:
    """The newest reference of a device kind that recorded this chapter's suite, or None (chapter 00)."""
    if suite not in SUITES:
        raise KeyError(f"unknown suite {suite!r}; registered suites: {', '.join(SUITES)}")
    refs = [r for r in load_references(directory) if r.kind == kind and suite in r.suites]
    return refs[-1] if refs else None


def describe(suite: str, *, kind: str = "cuda", directory: str | Path | None = None) -> str:
    """One plain sentence on whether a reference exists for this chapter (chapter 00)."""
    ref = latest(suite, kind=kind, directory=directory)
    if ref is None:
        return ("No reference-GPU results have been recorded for this chapter yet:\n"
                "every number on this page comes from the device that ran it.")
    return f"Reference results beside yours:\n{ref.label()}."


def _resolve_suite(name: str) -> Callable[..., dict[str, Any]]:
    module, func = SUITES[name].split(":")
    return getattr(importlib.import_module(module), func)


def record(suites: list[str] | None = None, *, device: str | None = None,
           out_dir: str | Path | None = None, quick: bool = False) -> Path:
    """Run the registered suites on this device and write one reference file; returns its path. `quick` runs each
    suite with smaller sweeps, to check that the command works; its file says so, must go to `out_dir` and is
    never drawn in a chapter (chapter 00)."""
    import torch

    from .device import device_name, pick_device
    if quick and out_dir is None:
        raise ValueError("a quick recording is a check, not a reference: give out_dir (--out) for it")
    names = suites or list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise KeyError(f"unknown suite(s) {unknown}; registered suites: {', '.join(SUITES)}")
    dev = pick_device(device)
    results = {}
    for name in names:
        print(f"recording {name} on {device_name(dev)} ...", flush=True)
        results[name] = _resolve_suite(name)(dev, quick=quick)
    ref = Reference(device=device_name(dev), kind=dev.type, date=_dt.date.today().isoformat(),
                    torch=torch.__version__, cuda=torch.version.cuda if dev.type == "cuda" else None, suites=results,
                    quick=quick)
    slug = re.sub(r"[^a-z0-9]+", "-", ref.device.lower()).strip("-")
    return write(ref, Path(out_dir or REFERENCE_DIR) / f"{slug}-{ref.date}.json")


def main(argv: list[str] | None = None) -> int:
    """Command line: `python -m book.reference record|list` (chapter 00)."""
    parser = argparse.ArgumentParser(prog="python -m book.reference", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the measurement suites on this device and write a reference file")
    rec.add_argument("--suite", action="append", choices=list(SUITES), help="only this suite (repeatable)")
    rec.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    rec.add_argument("--out", help=f"folder to write into (default {REFERENCE_DIR})")
    rec.add_argument("--quick", action="store_true", help="smaller sweeps, to check the command works (needs --out; "
                     "the file is marked quick and never drawn)")
    sub.add_parser("list", help="list the recorded reference files")
    args = parser.parse_args(argv)
    if args.command == "record":
        if args.quick and not args.out:
            parser.error("--quick needs --out: a quick recording is a check, not a reference to ship")
        print(f"wrote {record(args.suite, device=args.device, out_dir=args.out, quick=args.quick)}")
    else:
        refs = load_references()
        if not refs:
            print("no reference files recorded yet")
        for r in refs:
            print(f"{r.path.name}: {r.label()}; suites: {', '.join(r.suites)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
