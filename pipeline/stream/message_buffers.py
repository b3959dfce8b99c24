"""Shared memory for the messages of DataLoader workers, reused once the training process is
done with them.

A worker gathers each unit (about ``shuffle_buffer`` samples) straight into shared memory, so
that it crosses to the main process without a copy. Fresh shared memory for every unit costs
the worker a file of its own in ``/dev/shm`` to size, and a page fault and a zeroed page for
every 4 KB it writes: about a fifth of the CPU of a 2-worker epoch on a 2-core machine. The
units of an epoch have nearly the same size, so each can go into the memory of one the main
process has finished with.

Only the main process knows when that is: a unit's batches are views of its tensors, held by
the training loop (or copied to pinned memory, in DataLoader's pinning thread) for as long as it
likes. So each tensor a worker sends from a reused buffer travels with a *ticket*, a number never
sent before; when the main process lets go of that tensor's storage (a weak reference tells), it
writes the ticket into the buffer's cell of a small table shared with the workers, and the worker
reuses a buffer only when its cell holds the ticket it sent with it. A late release from a worker
that died cannot free a buffer of its replacement (tickets are unique per worker process), and a
tensor the worker cannot find in its message again is never reused. A buffer whose release does
not come is forgotten once the worker needs its place: it costs then what fresh memory costs.
"""

from __future__ import annotations

import gc
import multiprocessing.util
import os
import weakref
from typing import Any, Iterator, NamedTuple

import numpy as np
import torch

#: Buffers a worker keeps: enough for the tensors of the messages in flight (``prefetch_factor``
#: queued, one being gathered, one or two held by the main process) for a few fields each.
SLOTS = 32
#: A buffer serves sizes down to 4/5 of its own, which is an eighth above what was first asked.
_SLACK = 8


class Lent(NamedTuple):
    """A worker's message, and where its reused buffers are in it: for each, the path to a tensor
    on it (keys and indexes into the message's dicts, lists and tuples), its slot and its
    ticket. A NamedTuple, so that DataLoader's pinning thread pins the message inside."""

    message: Any
    worker: int
    slots: tuple[tuple[tuple[Any, ...], int, int], ...]


class ReleaseTable:
    """The table of released tickets, one row per worker: made by the loader before its workers
    start (it is shared with them), read by the workers, written by the main process."""

    def __init__(self, workers: int) -> None:
        self.tickets = torch.zeros((workers, SLOTS), dtype=torch.int64).share_memory_()

    def fit(self, workers: int) -> None:
        """Rows for ``workers`` workers (``num_workers`` may change between iterations; messages
        still out write into the table they were watched in)."""
        if len(self.tickets) < workers:
            self.tickets = torch.zeros((workers, SLOTS), dtype=torch.int64).share_memory_()

    def watch(self, lent: Lent) -> Any:
        """The message of ``lent``, each reused buffer's ticket to be written back once the main
        process holds no view of it: now if what came is a pinned copy, else when the storage of
        the tensor at its path is let go."""
        cells = self.tickets.numpy()[lent.worker]
        for path, slot, ticket in lent.slots:
            tensor = _at(lent.message, path)
            if tensor.is_pinned():  # the pinning thread copied it and let go of the original
                cells[slot] = ticket
            else:
                weakref.finalize(tensor.untyped_storage(), cells.__setitem__, slot, ticket)
        return lent.message


class _Buffer:
    __slots__ = ("storage", "ticket", "taken")

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self.storage = storage
        self.ticket = 0  # the ticket it was last sent with (0: not sent yet)
        self.taken = 0  # when it was last taken, counted in takes


class WorkerBuffers:
    """One worker's reused buffers (made in the worker by the loader's ``worker_init_fn``)."""

    def __init__(self, table: ReleaseTable, worker: int) -> None:
        self.worker = worker
        self._released = table.tickets.numpy()[worker]
        self._released[:] = 0
        self._buffers: list[_Buffer | None] = [None] * SLOTS
        self._pending: list[int] = []  # slots taken since the last message
        self._next_ticket = (int.from_bytes(os.urandom(4), "little") << 30) + 1  # unique to this process
        self._takes = 0
        self.allocations = 0  # buffers made: a steady worker makes none after its first messages

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialised tensor in shared memory: a released buffer's, when one fits, else a
        new buffer's; ``None`` when every slot is taken for this message (it then needs memory
        of its own)."""
        size = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
        slot = self._free_slot(size)
        if slot is None:
            return None
        buffer = self._buffers[slot]
        if buffer is None:
            buffer = self._buffers[slot] = _Buffer(torch.UntypedStorage._new_shared(size + size // _SLACK))
            self.allocations += 1
        self._takes += 1
        buffer.ticket, buffer.taken = 0, self._takes
        self._pending.append(slot)
        return torch.empty(0, dtype=dtype).set_(buffer.storage, 0, shape)

    def lend(self, message: Any) -> Any:
        """``message`` as a :class:`Lent` naming the buffers taken for it, which are not reused
        before the main process releases them. A buffer it does not hold is forgotten: it may
        still be sent inside."""
        found = {}
        wanted = {self._buffers[slot].storage.data_ptr(): slot for slot in self._pending}  # type: ignore[union-attr]
        for path, tensor in _tensors(message):
            slot = wanted.get(tensor.untyped_storage().data_ptr())
            if slot is not None and slot not in found:
                found[slot] = path
        slots = []
        for slot in self._pending:
            if slot not in found:
                self._buffers[slot] = None
                continue
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            self._buffers[slot].ticket = ticket  # type: ignore[union-attr]
            slots.append((found[slot], slot, ticket))
        self._pending = []
        return Lent(message, self.worker, tuple(slots)) if slots else message

    def trim(self) -> None:
        """Let go of the buffers not out (a worker done with an epoch: it may idle a while)."""
        for slot, buffer in enumerate(self._buffers):
            if buffer is not None and slot not in self._pending and self._reusable(slot, buffer):
                self._buffers[slot] = None

    def _reusable(self, slot: int, buffer: _Buffer) -> bool:
        """Whether the main process released ``buffer`` and nothing in this process holds it."""
        return int(self._released[slot]) == buffer.ticket and _only_holder(buffer.storage)

    def _free_slot(self, size: int) -> int | None:
        """The slot of the smallest released buffer that holds ``size`` bytes and not much more;
        else an empty slot; else that of a buffer let go: released but of the wrong size, or,
        the oldest, still out (forgotten: the main process keeps its own mapping of it). A
        released buffer not taken in the last ``SLOTS`` takes is let go: recent messages have
        not needed its memory."""
        best, empty, unfit, out = None, None, None, []
        for slot, buffer in enumerate(self._buffers):
            if buffer is None:
                empty = slot if empty is None else empty
            elif slot in self._pending:
                continue
            elif not self._reusable(slot, buffer):
                out.append(slot)
            elif buffer.taken < self._takes - SLOTS:
                self._buffers[slot] = None
                empty = slot if empty is None else empty
            elif size <= buffer.storage.nbytes() <= size + size // 4 and (
                    best is None or buffer.storage.nbytes() < self._buffers[best].storage.nbytes()):  # type: ignore[union-attr]
                best = slot
            else:
                unfit = slot
        if best is not None:
            return best
        slot = empty if empty is not None else unfit if unfit is not None else \
            min(out, key=lambda s: self._buffers[s].ticket, default=None)  # type: ignore[union-attr]
        if slot is not None:
            self._buffers[slot] = None
        return slot


def _only_holder(storage: torch.UntypedStorage) -> bool:
    """Whether no tensor of this process is on ``storage`` (only the pool's reference is left);
    ``False`` where torch cannot tell, so that nothing is reused then."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    return use_count is not None and use_count(storage._cdata) == 1


def _tensors(message: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], torch.Tensor]]:
    """The tensors of a message, with their paths: its own (in a dict or a tuple), or those of
    its batches (in a list of them). Not inside columns of values (a list of strings, say):
    the gather never puts a buffer there."""
    if isinstance(message, torch.Tensor):
        yield path, message
    elif len(path) < 2 and isinstance(message, dict):
        for key, value in message.items():
            yield from _tensors(value, (*path, key))
    elif len(path) < 2 and (isinstance(message, tuple) or (isinstance(message, list) and not path)):
        for index, value in enumerate(message):
            yield from _tensors(value, (*path, index))


def _at(message: Any, path: tuple[Any, ...]) -> torch.Tensor:
    for step in path:
        message = message[step]
    return message


_installed: dict[int, WorkerBuffers] = {}


def install(buffers: WorkerBuffers) -> None:
    """Make ``buffers`` this process's (a worker's) message buffers, let go as it exits: a worker
    exits without freeing its objects, and under the ``file_system`` sharing strategy (which
    PyTorch's "Too many open files" error advises) a buffer's segment stayed in /dev/shm until
    the training process ended, a unit's worth for each worker that ended (every epoch without
    persistent workers)."""
    _installed.clear()
    _installed[os.getpid()] = buffers
    multiprocessing.util.Finalize(None, _let_go, exitpriority=100)  # (before multiprocessing's own, at 0 and below)


def _let_go() -> None:
    _installed.clear()
    gc.collect()  # (a buffer in a cycle; what the worker inherited is frozen out of it: see LoaderWorker)


def installed() -> WorkerBuffers | None:
    """This process's message buffers, if its loader gave it some (a forked child has none)."""
    return _installed.get(os.getpid())
