"""Handing freed memory back to the operating system.

CPython and the tokenizer allocate from glibc's heap, which keeps its high-water mark: a
gateway that once parsed a 30 MB body, or built the vocabulary table while loading a
model, would hold that memory for good. `release_memory` asks glibc to return it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

_libc: Any = None


def release_memory() -> None:
    """Hand freed heap memory back to the operating system (glibc's `malloc_trim`).

    After a large request the allocator keeps its high-water mark otherwise: a gateway that
    once parsed a 30 MB body would hold that memory for good.
    """
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name) if name else False
        except OSError:
            _libc = False
    if _libc and hasattr(_libc, "malloc_trim"):
        _libc.malloc_trim(0)
