"""GPU measurements published by others, each with its source and setup, for chapters to draw beside the reader's own
numbers, always labelled as published (chapters 01, 02, 04, 05 and 06).

The figures live in `published.json` next to this file, as their sources state them; the book measured none of them.
A chapter asks for an entry by key and shows its value, its setup and where it comes from:

    >>> from book import published
    >>> e = published.get("gpt-fast/Llama-2-7B/bf16")
    >>> e.values["tokens_per_s"], e.hardware
    (104.9, 'A100 80GB')
"""
from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

FORMAT = "book-published/1"
PATH = Path(__file__).with_name("published.json")
NOT_STATED = "not stated"               # a precision or hardware the source does not give
_FIELDS = ("key", "who", "model", "precision", "hardware", "setup", "values", "source", "url", "chapters")

__all__ = ["FORMAT", "PATH", "Published", "PublishedFormatError", "load", "get", "for_chapter", "caption"]


class PublishedFormatError(ValueError):
    """A published-measurements file that does not follow the format (chapter 01)."""


@dataclass(frozen=True)
class Published:
    """One published measurement: numbers, what they measured, on what, and who says so (chapter 01)."""

    key: str
    who: str                             # the source in a few words: "gpt-fast", "Leviathan et al. 2023"
    model: str
    precision: str
    hardware: str
    setup: str
    values: dict[str, float]
    source: str
    url: str | None
    chapters: tuple[str, ...]
    baseline: str | None = None          # the key of the entry this one is a speedup over, where it has one
    extra: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        """A short legend label that says the number is published, not measured here."""
        return f"{self.who}, {self.hardware} (published)"

    def cite(self) -> str:
        """Source and address, for a caption or a table."""
        return f"{self.source}, {self.url}" if self.url else self.source


def _check(data: Any, where: str) -> dict[str, Published]:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PublishedFormatError(f"{where}: not a published-measurements file (expected \"format\": \"{FORMAT}\")")
    out: dict[str, Published] = {}
    for i, e in enumerate(data.get("entries", [])):
        missing = [f for f in _FIELDS if f not in e]
        if missing:
            raise PublishedFormatError(f"{where}: entry {i} lacks {', '.join(missing)}")
        key = e["key"]
        if key in out:
            raise PublishedFormatError(f"{where}: key {key!r} appears twice")
        vals = e["values"]
        if not vals or not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in vals.values()):
            raise PublishedFormatError(f"{where}: {key}: values must be positive numbers, got {vals!r}")
        for name, low in vals.items():
            if name.endswith("_low") and not low <= vals.get(name[:-4] + "_high", math.inf):
                raise PublishedFormatError(f"{where}: {key}: {name} is above its _high")
        for name in ("who", "source", "setup", "hardware", "model"):
            if not str(e[name]).strip():
                raise PublishedFormatError(f"{where}: {key}: empty {name}")
        if e["url"] is not None and not str(e["url"]).startswith("https://"):
            raise PublishedFormatError(f"{where}: {key}: url must be https://... or null, got {e['url']!r}")
        extra = {k: v for k, v in e.items() if k not in _FIELDS and k != "baseline"}
        out[key] = Published(key=key, who=e["who"], model=e["model"], precision=e["precision"], hardware=e["hardware"],
                             setup=e["setup"], values={k: float(v) for k, v in vals.items()}, source=e["source"],
                             url=e["url"], chapters=tuple(e["chapters"]), baseline=e.get("baseline"), extra=extra)
    for p in out.values():
        if p.baseline is not None and p.baseline not in out:
            raise PublishedFormatError(f"{where}: {p.key}: baseline {p.baseline!r} is not an entry")
    return out


@lru_cache(maxsize=4)
def load(path: str | Path = PATH) -> dict[str, Published]:
    """Every published entry by key, checked (chapter 01)."""
    path = Path(path)
    return _check(json.loads(path.read_text()), str(path))


def get(key: str) -> Published:
    """One entry, or a KeyError that lists the keys there are (chapter 01)."""
    entries = load()
    if key not in entries:
        raise KeyError(f"no published measurement {key!r}; there are: {', '.join(sorted(entries))}")
    return entries[key]


def for_chapter(chapter: str) -> list[Published]:
    """The entries a chapter draws, in file order (chapter 01)."""
    return [p for p in load().values() if chapter in p.chapters]


def caption(entries: list[Published], width: int = 80) -> str:
    """'Published, not measured by the book:' and one line per entry with its setup and source (chapter 01)."""
    lines = ["Published, not measured by the book:"]
    for p in entries:
        what = (p.model if p.precision == NOT_STATED else       # one parenthesis: "(masked diffusion, ..., bf16)"
                f"{p.model[:-1]}, {p.precision})" if p.model.endswith(")") else f"{p.model} ({p.precision})")
        where = "hardware not stated" if p.hardware == NOT_STATED else f"on {p.hardware}"
        lines.append(textwrap.fill(f"{p.who}: {what}, {where}; {p.setup}.", width,
                                   initial_indent="  ", subsequent_indent="    "))
        lines.append(textwrap.fill(f"source: {p.cite()}", width, initial_indent="    ", subsequent_indent="      ",
                                   break_long_words=False, break_on_hyphens=False))
    return "\n".join(lines)
