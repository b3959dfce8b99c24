"""The main process's reads of its workers' messages, which a message cut short cannot block.

The workers' messages cross one pipe: each a length, then its pickled bytes. One larger than
the pipe holds (64 KiB; a unit of text fields is megabytes) goes in pieces, as fast as the main
process reads them. A worker killed between two pieces (the out-of-memory killer strikes the
process that holds most, often a worker with much to send) leaves the rest of its message
unwritten for ever. multiprocessing's ``Queue.get`` reads a message with blocking reads once it
has seen its length, and waits for that rest for ever: neither PyTorch's check that the workers
live nor the loader's watch runs again. (Measured: 2 hangs in 53 runs that killed a worker
of a loader of text at a random moment.)

Here a message's bytes are read as they come, each wait at most ``wait_s``. A wait in which
none came, while a worker has died (killed or crashed: a non-zero exit), ends the reading of
the queue: the bytes after the dead worker's piece would be read as the rest of its message.
The queue then reads as empty, and the loader's check finds the dead worker and raises its
:class:`~pipeline.stream.workers.WorkerError`.
"""

from __future__ import annotations

import os
import queue
import struct
import time
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Sequence

_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")  # after a length of -1: a message of 2 GiB or more


class WholeMessages:
    """The ``get`` of a workers' result queue (a ``multiprocessing.Queue``) in the main process,
    given its parts rather than the queue (installed as the queue's ``get``, it would make a
    reference cycle), and ``workers``, which says the worker processes that write to it. Only
    whole messages are taken off the pipe."""

    def __init__(self, results: Any, workers: Callable[[], Sequence[Any]], wait_s: float) -> None:
        self._reader = results._reader
        self._reader_lock = results._rlock
        self._room = results._sem  # a put takes a place, a get gives it back
        self._workers = workers
        self._wait_s = wait_s
        self._broken = False

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """As ``multiprocessing.Queue.get``; empty for good once a dead worker's message was cut short."""
        wait_s = None if block and timeout is None else (timeout if block else 0.0)
        if self._broken:
            time.sleep(self._wait_s if wait_s is None else wait_s)
            raise queue.Empty
        deadline = None if wait_s is None else time.monotonic() + wait_s
        if not self._reader_lock.acquire(True, wait_s):
            raise queue.Empty
        try:
            if not self._reader.poll(None if deadline is None else max(deadline - time.monotonic(), 0.0)):
                raise queue.Empty
            data = self._message()
            self._room.release()
        finally:
            self._reader_lock.release()
        return ForkingPickler.loads(data)

    def _message(self) -> bytearray:
        (size,) = _LENGTH.unpack(self._read(_LENGTH.size))
        if size == -1:
            (size,) = _LONG_LENGTH.unpack(self._read(_LONG_LENGTH.size))
        return self._read(size)

    def _read(self, size: int) -> bytearray:
        out = bytearray(size)
        descriptor = self._reader.fileno()
        done = 0
        with memoryview(out) as view:
            while done < size:
                if not wait([descriptor], self._wait_s):
                    if any(worker.exitcode not in (None, 0) for worker in self._workers()):
                        self._broken = True
                        raise queue.Empty
                    continue
                count = os.readv(descriptor, [view[done:]])
                if count == 0:
                    raise EOFError("the workers' pipe ended during a message")
                done += count
        return out
