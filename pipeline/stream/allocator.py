"""Large blocks straight from the OS in the DataLoader workers that read remote shards.

A remote read used to join the pieces a socket gives into one bytes object of a range's size
(0.5-4 MB), in several request threads at once. glibc serves blocks that large with mmap until
the first one is freed; then it raises its mmap threshold to that size, and later blocks come
from per-thread arenas, which fragment: a worker's memory grew for an hour before it levelled off
(+20 MB/h over a 2-hour soak). With the threshold fixed at 128 KiB, a 12-minute soak beside one
without it grew +1 MB/h against +101 MB/h, at the same speed. Ranges now land in reused buffers
(:mod:`pipeline.storage.buffers`); the fixed threshold still sends the workers' other large
blocks (obstore's responses, NumPy's temporaries) to mmap. Only workers get this: in the
training process it would send the user's own large temporaries to mmap too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 128 << 10  # glibc's default, kept from moving


@functools.lru_cache(maxsize=None)
def fix_mmap_threshold(pid: int) -> bool:
    """Fix glibc's mmap threshold in this process (``pid``: once per process); ``False`` where
    the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
