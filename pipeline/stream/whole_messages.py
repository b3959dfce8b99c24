"""The main process's reads of its workers' messages, which a message cut short cannot block.

The workers' messages cross one pipe: each a length, then its pickled bytes. One larger than
the pipe holds (64 KiB; a unit of text fields is megabytes) goes in pieces, as fast as the main
process reads them. A worker killed between two pieces (the out-of-memory killer strikes the
process that holds most, often a worker with much to send) leaves the rest of its message
unwritten for ever. multiprocessing's ``Queue.get`` reads a message with blocking reads once it
has seen its length, and waits for that rest for ever: neither PyTorch's check that the workers
live nor the loader's watch runs again. (Measured: 4 hangs in about 80 runs that killed a
worker of a loader of text at a random moment; none in 162 since.)

Here a message's bytes are read as they come, each wait at most ``wait_s``. A wait in which
none came, while a worker has died (killed or crashed: a non-zero exit), ends the reading of
the queue: the bytes after the dead worker's piece would be read as the rest of its message.
Every read of the queue then raises PyTorch's error for a dead worker, which the loader makes
a :class:`~pipeline.stream.worker_deaths.WorkerError`.
"""

from __future__ import annotations

import os
import queue
import select
import struct
import time
from multiprocessing.reduction import ForkingPickler
from typing import Any, Sequence

_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")  # after a length of -1: a message of 2 GiB or more


class WholeMessages:
    """The ``get`` of a workers' result queue (a ``multiprocessing.Queue``) in the main process,
    given its parts rather than the queue (installed as the queue's ``get``, it would make a
    reference cycle). Only whole messages are taken off the pipe. ``workers`` are the worker
    processes that write to it: set once they are started (torch's list, which it only adds to)."""

    def __init__(self, results: Any, wait_s: float) -> None:
        self._reader = results._reader
        self._reader_lock = results._rlock
        self._room = results._sem  # a put takes a place, a get gives it back
        self._ready = select.poll()
        self._ready.register(self._reader.fileno(), select.POLLIN)
        self.workers: Sequence[Any] = ()
        self._wait_s = wait_s
        self._dead: str | None = None  # the pids of the dead workers, once one's message was cut short
        self._head: bytearray | None = None  # the length of the message being read, and its body,
        self._body: bytearray | None = None  # as far as ``_done`` (see _message)
        self._done = 0

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """As ``multiprocessing.Queue.get``; once a dead worker's message was cut short, the
        error PyTorch raises for a dead worker, every time (from its check, which leaves out a
        worker that had ended its share of the epoch, it might never come)."""
        if self._dead is not None:
            raise self._death()
        wait_s = None if block and timeout is None else (timeout if block else 0.0)
        deadline = None if wait_s is None else time.monotonic() + wait_s
        if not self._reader_lock.acquire(True, wait_s):
            raise queue.Empty
        try:
            if not self._ready.poll(None if deadline is None else max(deadline - time.monotonic(), 0.0) * 1000):
                raise queue.Empty
            data = self._message()
            self._room.release()
        finally:
            self._reader_lock.release()
        return ForkingPickler.loads(data)

    def _message(self) -> bytearray:
        """The next message's bytes. How far its reading got is kept here as it goes: one cut off
        by an interrupt (Ctrl-C in a notebook) goes on where it stopped at the next get, rather
        than leave its rest to be read as the next message."""
        if self._body is None:
            if self._head is None:
                self._head, self._done = bytearray(_LENGTH.size), 0
            self._fill(self._head)
            (size,) = _LENGTH.unpack_from(self._head)
            if size == -1:
                if len(self._head) == _LENGTH.size:
                    self._head += bytes(_LONG_LENGTH.size)
                self._fill(self._head)
                (size,) = _LONG_LENGTH.unpack_from(self._head, _LENGTH.size)
            self._body, self._done = bytearray(size), 0
        self._fill(self._body)
        body, self._head, self._body = self._body, None, None
        return body

    def _fill(self, buffer: bytearray) -> None:
        """Read into ``buffer`` from byte ``self._done`` to its end."""
        descriptor = self._reader.fileno()
        with memoryview(buffer) as view:
            while self._done < len(buffer):
                if not self._ready.poll(self._wait_s * 1000):
                    dead = [worker.pid for worker in self.workers if worker.exitcode not in (None, 0)]
                    if dead:
                        self._dead = ", ".join(map(str, dead))
                        raise self._death()
                    continue
                count = os.readv(descriptor, [view[self._done:]])
                if count == 0:
                    raise EOFError("the workers' pipe ended during a message")
                self._done += count

    def _death(self) -> RuntimeError:
        return RuntimeError(f"DataLoader worker (pid(s) {self._dead}) exited unexpectedly; a message from the workers "
                            f"stopped coming part-way")
