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
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20


def _c() -> Any:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name) if name else False
        except OSError:
            _libc = False
    return _libc


def map_large_blocks() -> None:
    """Allocate every block of 1 MiB or more straight from the OS, and give it back on free.

    glibc raises that threshold on its own after such a block is freed, so a process that
    once read a 30 MB body would afterwards keep its large buffers in a heap that large
    requests fragment and never shrink. Fixing the threshold turns that adaptation off.
    """
    libc = _c()
    if libc and hasattr(libc, "mallopt"):
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def release_memory() -> None:
    """Hand freed heap memory back to the operating system (glibc's `malloc_trim`).

    After a large request the allocator keeps its high-water mark otherwise: a gateway that
    once parsed a 30 MB body would hold that memory for good.
    """
    libc = _c()
    if libc and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
