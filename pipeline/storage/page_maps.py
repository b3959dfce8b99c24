"""Read-only mappings of a file's pages that hold no file descriptor.

Why: Python's ``mmap`` keeps a duplicate of the file's descriptor open for as long as the mapping
lives (before Python 3.13's ``trackfd=False``), and a loader's unit holds a mapping of every shard
it reads until the unit is gathered: a unit of thousands of small shards (a million small
samples in shards of 100) ran out of descriptors, 1,024 a process by default. A mapping needs no
descriptor once made (POSIX), so here the descriptor is the caller's to close at once, and the
pages are unmapped when the last view of them goes. Where libc cannot be called (Windows), it is
``mmap`` as before.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import weakref


def _libc() -> ctypes.CDLL | None:
    if os.name != "posix":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int64]
        if sys.maxsize <= 2**32:  # (a 32-bit off_t: offsets of 2 GiB and more need mmap64)
            return None
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()
_FAILED = ctypes.c_void_p(-1).value  # MAP_FAILED


def map_pages(fd: int, length: int, offset: int = 0) -> memoryview:
    """Bytes ``[offset, offset + length)`` of the open file ``fd`` as a read-only view of its
    pages (``offset`` a multiple of ``mmap.ALLOCATIONGRANULARITY``, ``length`` > 0); ``fd`` may
    be closed as soon as this returns. Raises ``OSError`` as ``mmap`` does."""
    if _LIBC is None:
        return memoryview(mmap.mmap(fd, length, offset=offset, access=mmap.ACCESS_READ))
    address = _LIBC.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
    if address is None or address == _FAILED:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    pages = (ctypes.c_ubyte * length).from_address(address)
    # unmapped once no view refers to them, but not at exit, where a thread may still read them (a
    # read-ahead thread stopped by its own exit handler, which runs after finalize's): the system does
    unmapped = weakref.finalize(pages, _LIBC.munmap, address, length)
    unmapped.atexit = False
    return memoryview(pages).cast("B").toreadonly()
