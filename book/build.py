"""How the book is being run, a live kernel or the static HTML build, and progress bars for long sweeps (chapter 00)."""
from __future__ import annotations

import os
from typing import Iterable, TypeVar

__all__ = ["is_static", "progress"]

T = TypeVar("T")


def is_static() -> bool:
    """True while `make book` executes chapters for the static HTML book ($BOOK_STATIC=1) (chapter 00)."""
    return os.environ.get("BOOK_STATIC", "").strip().lower() in ("1", "true", "yes")


def progress(iterable: Iterable[T], desc: str | None = None, total: int | None = None, **kwargs) -> Iterable[T]:
    """A tqdm progress bar for a long sweep; silent in the static build, where nobody watches it (chapter 00)."""
    from tqdm.auto import tqdm
    return tqdm(iterable, desc=desc, total=total, disable=is_static(), leave=False, **kwargs)
