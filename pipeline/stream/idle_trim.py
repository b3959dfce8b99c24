"""Reusable memory given back once a process stops reading for a while, not at every epoch's end.

A process that reads keeps the buffers it receives ranges and joins rows into
(:mod:`pipeline.storage.buffers`) and, in a DataLoader worker, those it sends its messages in
(:mod:`.message_buffers`), reused unit after unit. Let go at the end of every epoch, they made
the first units of the next epoch pay for fresh memory again (the kernel zeroes every page of
it): a fifth of the wall time of back-to-back epochs of 300 MB on local shards, with 2 workers
on 2 cores. A persistent worker may idle for long between epochs, though (while the training
process evaluates, or saves a checkpoint), and should not hold that memory meanwhile. So the
end of the last reading in a process asks for the trim :data:`IDLE_S` later, and a reading that
starts before then calls it off.
"""

from __future__ import annotations

import atexit
import threading

from ..storage.buffers import process_pool
from ..storage.per_process import per_process
from . import message_buffers

IDLE_S = 2.0  # how long a process reads nothing before its reusable memory goes


class IdleTrim:
    """Counts the readings under way in this process, and trims once none has been for
    :data:`IDLE_S`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # held while trimming: a reading starts after a trim under way
        self._reading = 0
        self._generation = 0  # changes whenever a reading starts: a trim asked for before is off
        self._timer: threading.Timer | None = None
        self._stopped = False  # at exit: no trim is asked for after

    def started(self) -> None:
        """A reading starts: no trim until every reading has ended."""
        with self._lock:
            self._reading += 1
            self._call_off()

    def ended(self) -> None:
        """A reading ended: trim :data:`IDLE_S` from now, unless another starts meanwhile."""
        with self._lock:
            self._reading -= 1
            if self._reading or self._stopped:
                return
            self._timer = threading.Timer(IDLE_S, self._trim, (self._generation,))
            self._timer.daemon = True  # waited for by nothing at exit (see stop, for a trim under way)
            self._timer.start()

    def call_off(self) -> None:
        """Call off any trim asked for; a reading that ends later asks for one again."""
        with self._lock:
            self._call_off()

    def stop(self) -> None:
        """At exit: call off any trim asked for, and any asked for later (a reading that ends
        after this starts no timer). A trim under way is waited for, so that no thread frees
        memory while the interpreter finalizes."""
        with self._lock:
            self._stopped = True
            self._call_off()

    def _call_off(self) -> None:
        self._generation += 1  # a timer that fired already, waiting for the lock, sees it
        if self._timer is not None:
            self._timer.cancel()  # its thread ends now, not when it would have trimmed
            self._timer = None

    def _trim(self, generation: int) -> None:
        with self._lock:
            if generation != self._generation or self._reading:
                return
            process_pool().trim()
            buffers = message_buffers.installed()
            if buffers is not None:
                buffers.trim()


idle_trim = per_process(IdleTrim)
atexit.register(lambda: idle_trim().stop())
