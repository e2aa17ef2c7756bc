"""glibc malloc settings of a training rank (see `tune_malloc` for why)."""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""mallopt parameters (glibc <malloc.h>)."""


MMAP_THRESHOLD = 32 << 20
"""Blocks under this come from the heap (glibc refuses more than 32 MiB on 64-bit)."""
TRIM_THRESHOLD = 256 << 20
"""Free memory at the top of the heap kept instead of handed back to the OS."""
SETTINGS = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def tune_malloc(libc: Any = None, settings: tuple[tuple[int, int], ...] = SETTINGS) -> list[tuple[int, int]]:
    """Keep the step's tensor memory in this process's heap; returns the settings glibc accepted.

    Why: on CPU every step allocates and frees the same few-MiB activation and gradient tensors.
    With glibc's dynamic defaults the largest ones are fresh mmaps and the freed top of the heap is
    trimmed back to the OS, so each step faults its pages in again, in forward and backward.  With
    blocks under `MMAP_THRESHOLD` from the heap and up to `TRIM_THRESHOLD` of free heap kept, the
    pages stay mapped.  No-op where there is no glibc `mallopt` (macOS; musl's is a stub and refuses).

    Args:
        libc: the C library (tests pass a fake); default: this process's.
        settings: (mallopt parameter, value) pairs.
    """
    if libc is None:
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name) if name else None
        except OSError:
            libc = None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return []
    return [(param, value) for param, value in settings if mallopt(param, value) == 1]  # 1 = accepted
