"""Buffers for remote ranges, reused once nothing refers to them any more.

A worker reading remote shards receives every byte of an epoch into memory of its own, a few
hundred KB to a few MB per range. Fresh memory for each range costs twice: the kernel maps and
zeroes every page of it (a page fault per 4 KB: on a 2-core machine that was half the CPU of an
HTTP epoch), and blocks of many sizes freed in several threads fragment the heap, which grows for
hours. A unit of the plan needs about the same ranges as the one before it, so its buffers can
be those of the one before: after the first unit, reading a range allocates nothing.

A buffer is lent as a memoryview of a NumPy view of it: everything made from the bytes (slices,
arrays decoded zero-copy, records walked) refers to that view, and the pool takes the buffer back
only when the view is gone (a weak reference tells), so bytes still in use are never overwritten,
whoever holds them and for however long.
"""

from __future__ import annotations

import bisect
import functools
import os
import threading
import weakref
from typing import Callable, Sequence

import numpy as np

#: Capacities are an eighth above the size asked for, rounded up to this: ranges of nearly the
#: same size (a chunk, give or take a record) then fit each other's buffers.
GRAIN = 64 << 10


class BufferPool:
    """Writable buffers of at least the size asked for. Buffers lent and idle are this pool's
    memory; idle ones beyond the most ever lent at once are let go (the largest first): the pool
    holds at most twice what its reader needs at once, and about that much in a steady run."""

    def __init__(self) -> None:
        self.peak_lent = 0
        self.allocations = 0  # buffers made: a steady reader makes none after its first units
        self._lent: list[tuple[np.ndarray, weakref.ref]] = []
        self._lent_bytes = 0
        self._idle: list[np.ndarray] = []  # smallest first
        self._idle_bytes = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> memoryview:
        """``size`` writable bytes, no other range's."""
        with self._lock:
            self._collect()
            buffer = self._fitting(size)
            if buffer is None:
                buffer = np.empty(-(-max(size + size // 8, 1) // GRAIN) * GRAIN, np.uint8)
                self.allocations += 1
            view = buffer[:size]
            self._lent.append((buffer, weakref.ref(view)))
            self._lent_bytes += buffer.nbytes
            self.peak_lent = max(self.peak_lent, self._lent_bytes)
            return memoryview(view)

    @property
    def held_bytes(self) -> int:
        """Bytes of the buffers lent and idle."""
        with self._lock:
            return self._lent_bytes + self._idle_bytes

    def _collect(self) -> None:
        """Buffers whose view is gone become idle; idle ones beyond the most lent at once go."""
        still = []
        for buffer, view in self._lent:
            if view() is not None:
                still.append((buffer, view))
                continue
            bisect.insort(self._idle, buffer, key=lambda b: b.nbytes)
            self._idle_bytes += buffer.nbytes
            self._lent_bytes -= buffer.nbytes
        self._lent = still
        while self._idle_bytes > self.peak_lent:
            self._idle_bytes -= self._idle.pop().nbytes

    def _fitting(self, size: int) -> np.ndarray | None:
        """The smallest idle buffer that holds ``size`` bytes without wasting half of itself."""
        i = bisect.bisect_left(self._idle, size, key=lambda b: b.nbytes)
        if i == len(self._idle) or self._idle[i].nbytes > 2 * max(size, GRAIN):
            return None
        self._idle_bytes -= self._idle[i].nbytes
        return self._idle.pop(i)


@functools.lru_cache(maxsize=1)
def _pool_of(pid: int) -> BufferPool:
    return BufferPool()


def process_pool() -> BufferPool:
    """This process's pool (a forked worker starts with none of its parent's buffers)."""
    return _pool_of(os.getpid())


def pooled_concatenate(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``np.concatenate(arrays)`` into memory of :func:`process_pool`: the rows of a unit are
    joined in every unit, and fresh memory for them cost page faults, unit after unit."""
    return _into_pool(np.concatenate, arrays, (sum(len(a) for a in arrays), *arrays[0].shape[1:]))


def pooled_stack(arrays: Sequence[np.ndarray | np.generic]) -> np.ndarray:
    """``np.stack(arrays)`` (of equally shaped arrays) into memory of :func:`process_pool`."""
    return _into_pool(np.stack, arrays, (len(arrays), *np.shape(arrays[0])))


def _into_pool(join: Callable[..., np.ndarray], arrays: Sequence, shape: tuple[int, ...]) -> np.ndarray:
    """``join(arrays, out=...)`` into pooled memory; plain ``join(arrays)`` where the arrays hold
    objects, differ in dtype (NumPy promotes them) or in shape, or some are not arrays (``None``
    for a missing field, say: NumPy says what it makes of them)."""
    first = arrays[0]
    if first.dtype.hasobject or any(not isinstance(a, (np.ndarray, np.generic)) or a.dtype != first.dtype
                                    or a.shape[1:] != first.shape[1:] for a in arrays):
        return join(arrays)
    if join is np.stack and any(a.shape != first.shape for a in arrays):
        return join(arrays)
    size = int(np.prod(shape, dtype=np.int64)) * first.dtype.itemsize
    return join(arrays, out=np.frombuffer(process_pool().take(size), first.dtype).reshape(shape))
