"""Giving the C heap's free pages back to the system, after a burst of memory was freed.

A sweep of thousands of short scripts makes tables, archives and SQLite pages for each
process while it runs and lets go of them once the recording holds its rows; glibc keeps
the freed pages, free in the heap of ``gpuwatch record`` and never used again.
``malloc_trim`` returns them: it is the gpuwatch process's own heap, never the watched
run's, and it is called once per batch of settled processes, not per process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_looked = False


def trim() -> bool:
    """Return the heap's free pages to the system; False where there is no glibc."""
    global _trim, _looked
    if not _looked:
        _looked = True
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _trim = libc.malloc_trim  # glibc only: musl has none
                _trim.argtypes = [ctypes.c_size_t]
                _trim.restype = ctypes.c_int
            except (OSError, AttributeError):
                _trim = None
    if _trim is None:
        return False
    _trim(0)
    return True
