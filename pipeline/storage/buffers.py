"""Buffers for remote ranges, and for the rows joined from them, reused once nothing refers to
them any more.

A worker reading remote shards receives every byte of an epoch into memory of its own, a few
hundred KB to a few MB per range, and joins the rows of a unit into more. Fresh memory for each
costs twice: the kernel maps and zeroes every page of it (a page fault per 4 KB: a quarter of
the CPU of an epoch on a 2-core machine), and blocks of many sizes freed in several threads
fragment the heap, which grows for hours. A unit of the plan needs about the same ranges as the
one before it, so its buffers can be those of the one before: in a steady run, reading a range
allocates nothing.

A buffer is lent as a memoryview whose exporter is a ctypes array over it, made for that loan:
everything made from the bytes (slices, casts, arrays decoded zero-copy, ``np.ndarray(buffer=)``,
tensors of those) holds that exporter, directly or through the memoryview, and the pool takes
the buffer back only when the exporter is gone (a weak reference tells). So bytes still in use
are never overwritten, whoever holds them and for however long. (A NumPy view would not do:
NumPy links an array made from it to the buffer itself, past the view.)
"""

from __future__ import annotations

import bisect
import ctypes
import threading
import weakref
from collections import deque
from typing import Any, Callable, Sequence

import numpy as np

from .per_process import per_process

#: Capacities are an eighth above the size asked for, rounded up to this, and a buffer serves
#: sizes down to 4/5 of its capacity: ranges of nearly the same size (a chunk, give or take a
#: record) then fit each other's buffers, and none holds much more than it needs.
GRAIN = 16 << 10
#: Joins smaller than this are left to NumPy: glibc serves them from the heap's free blocks.
SMALL = 128 << 10
#: An idle buffer not lent over this many loans goes; so do the ones idle longest while the pool
#: holds more than twice the most lent at once over as many.
RECENT = 256


class BufferPool:
    """Writable buffers of at least the size asked for. The buffers lent and idle are this
    pool's memory; an idle one not lent again over :data:`RECENT` loans is let go, and so are
    the ones idle longest while the pool holds more than twice the most lent at once over as
    many. So a steady reader keeps the buffers its units take turns with (of several sizes:
    an epoch's last block is smaller than the others), and a burst is given back once it is over."""

    def __init__(self) -> None:
        self.peak_lent = 0  # the most bytes lent at once, ever
        self.allocations = 0  # buffers made: a steady reader makes none after its first units
        self._lent: list[tuple[np.ndarray, weakref.ref]] = []
        self._lent_bytes = 0
        # (bytes, order of coming back, loans made by then, buffer), smallest first
        self._idle: list[tuple[int, int, int, np.ndarray]] = []
        self._returns = 0
        self._loans = 0
        self._idle_bytes = 0
        self._recent: deque[int] = deque(maxlen=RECENT)  # bytes lent at each recent loan
        self._lock = threading.Lock()

    def take(self, size: int) -> memoryview:
        """``size`` writable bytes that nothing else uses."""
        with self._lock:
            self._collect()
            buffer = self._fitting(size)
            capacity = max(-(-(size + size // 8) // GRAIN), 1) * GRAIN if buffer is None else buffer.nbytes
            self._let_go_beyond_need(capacity)  # after the fitting buffer is out: the one needed now never goes
            if buffer is None:
                buffer = np.empty(capacity, np.uint8)
                self.allocations += 1
            exporter = (ctypes.c_ubyte * size).from_buffer(buffer)
            self._lent.append((buffer, weakref.ref(exporter)))
            self._lent_bytes += buffer.nbytes
            self.peak_lent = max(self.peak_lent, self._lent_bytes)
            self._recent.append(self._lent_bytes)
            self._loans += 1
            return memoryview(exporter).cast("B")

    def trim(self) -> None:
        """Let go of every idle buffer (a reader done for now: the end of an epoch, say)."""
        with self._lock:
            self._collect()
            self._idle, self._idle_bytes = [], 0

    @property
    def held_bytes(self) -> int:
        """Bytes of the buffers lent and idle."""
        with self._lock:
            return self._lent_bytes + self._idle_bytes

    def _collect(self) -> None:
        """Buffers whose exporter is gone become idle."""
        still = []
        for buffer, exporter in self._lent:
            if exporter() is not None:
                still.append((buffer, exporter))
                continue
            self._returns += 1
            bisect.insort(self._idle, (buffer.nbytes, self._returns, self._loans, buffer))
            self._idle_bytes += buffer.nbytes
            self._lent_bytes -= buffer.nbytes
        self._lent = still

    def _let_go_beyond_need(self, lending: int) -> None:
        """Idle buffers not lent again over :data:`RECENT` loans go, and the ones idle longest
        while the pool would hold more than twice the most lent at once (``lending`` more bytes
        lent now). Asked after the buffer of a loan is taken out, so that the one needed now
        never goes: buffers of other sizes waiting beside it must not cost a unit the buffer its
        rows are joined in."""
        lent = self._lent_bytes + lending  # with the loan under way
        keep = 2 * max(max(self._recent, default=0), lent)
        while self._idle:
            oldest = min(range(len(self._idle)), key=lambda i: self._idle[i][1])
            size, _, returned, _ = self._idle[oldest]
            if returned > self._loans - RECENT and self._idle_bytes + lent <= keep:
                return
            del self._idle[oldest]
            self._idle_bytes -= size

    def _fitting(self, size: int) -> np.ndarray | None:
        """The smallest idle buffer that holds ``size`` bytes and not much more; of several that
        size, the one back last. Why the last: a steady reader then takes turns with the few it
        needs, and a burst's surplus stays idle until it ages out (taking the one idle longest
        would cycle through every buffer and keep them all young)."""
        i = bisect.bisect_left(self._idle, (size,))
        if i == len(self._idle) or self._idle[i][0] * 4 > (size + GRAIN) * 5:
            return None
        i = bisect.bisect_left(self._idle, (self._idle[i][0] + 1,)) - 1  # the last of that size
        nbytes, _, _, buffer = self._idle.pop(i)
        self._idle_bytes -= nbytes
        return buffer


#: This process's pool (a forked worker starts with none of its parent's buffers).
process_pool = per_process(BufferPool)


def pooled_concatenate(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """``np.concatenate(arrays)``, into memory of :func:`process_pool` when it is large: the rows
    of a unit are joined in every unit, and fresh memory for them cost page faults each time."""
    return _into_pool(np.concatenate, arrays, lambda first: (sum(len(a) for a in arrays), *first.shape[1:]))


def pooled_stack(arrays: Sequence[np.ndarray | np.generic]) -> np.ndarray:
    """``np.stack(arrays)``, into memory of :func:`process_pool` when it is large."""
    return _into_pool(np.stack, arrays, lambda first: (len(arrays), *first.shape))


def _into_pool(join: Callable[..., np.ndarray], arrays: Sequence, shape_of: Callable[[Any], tuple[int, ...]]
               ) -> np.ndarray:
    """``join(arrays, out=...)`` into pooled memory, where NumPy would make one large array of
    the arrays' own dtype; else plain ``join(arrays)``, which promotes, raises or makes what it
    makes (of ``None`` for a missing field, say)."""
    if not _joins_as_they_are(join, arrays):
        return join(arrays)
    first = arrays[0]
    shape = shape_of(first)
    size = int(np.prod(shape, dtype=np.int64)) * first.dtype.itemsize
    if size < SMALL:
        return join(arrays)
    return join(arrays, out=np.frombuffer(process_pool().take(size), first.dtype).reshape(shape))


def _joins_as_they_are(join: Callable[..., np.ndarray], arrays: Sequence) -> bool:
    """Whether ``arrays`` are arrays of one dtype (no objects) whose shapes ``join`` takes as they
    are: equal, for a stack; equal but for the first axis, for a concatenation."""
    first = arrays[0]
    if not isinstance(first, (np.ndarray, np.generic)) or first.dtype.hasobject:
        return False
    axes = 1 if join is np.concatenate else 0  # the axes after which shapes must agree
    return first.ndim >= axes and all(isinstance(a, (np.ndarray, np.generic)) and a.dtype == first.dtype
                                      and a.shape[axes:] == first.shape[axes:] for a in arrays)
