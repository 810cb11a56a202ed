"""Keep freed NumPy buffers in the process heap, so the cost model's arrays do not fault in again.

The cost model evaluates every candidate at once: for 32,768 GPUs (52,568 candidates) a
column is a 420 KB array and one prediction allocates several hundred of them. glibc serves
a block above its mmap threshold with ``mmap`` and gives the heap's free top back to the
kernel above its trim threshold (mallopt(3): ``M_MMAP_THRESHOLD``, 128 KiB at start and
raised dynamically; ``M_TRIM_THRESHOLD``, twice that), so memory freed by one step of the
model is returned and the next step faults it in again, one 4 KiB page at a time. Measured
on the development machine (docs/benchmarks.md): about 34,000 minor page faults per
prediction; 106 ms warm with glibc's defaults, 43 ms with both thresholds raised. The first
prediction of a process faults its memory in either way (a single `axoplan rank` or
`calibrate`, whose predictions are small, take the same time with and without).

:func:`keep_freed_memory` raises both, once, at the start of the `axoplan` command. A library
user may call it too, or set ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` (glibc's
environment variables; when either is set we leave the allocator alone). Elsewhere than glibc
it does nothing.
"""

from __future__ import annotations

import os
import sys

__all__ = ["keep_freed_memory", "MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES"]

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's ceiling for the threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True if they were set.

    False (and nothing changed) off Linux, without glibc, or when the user set either
    threshold in the environment."""
    if not sys.platform.startswith("linux") or any(v in os.environ for v in _ENV):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt to call
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap_set = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    return mmap_set and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
