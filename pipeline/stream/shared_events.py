"""The Events a loader shares with its workers, once one of the workers died.

A multiprocessing ``Event`` is a flag and a condition whose lock is a semaphore that every
process holding the Event takes. ``is_set()`` takes that lock; ``set()`` takes it, wakes each
process asleep in ``wait()``, and waits for each to say it woke. PyTorch's workers look at their
stop Event, under the lock, after every wait for work; a read backing off before its retry
sleeps on the loader's abandon Event. A worker killed there (the out-of-memory killer strikes
anywhere) never lets the lock go, nor says it woke: the loader then waits for ever, in
PyTorch's check of the stop Event as it finds the death, or in ``set()`` as it stops the others.
(PyTorch counts on a death signal to interrupt such a wait; none comes for a worker already dead.)

So once a worker has died, the loader reads and sets both Events through their flags alone
(:class:`FlagOnly`): no lock is taken and no one is woken. The workers left see the flag the
next time they look (a back-off after its pause), or, if the dead worker held the lock, are
stopped as PyTorch stops a worker that does not exit.
"""

from __future__ import annotations

from typing import Any, Iterable


class FlagOnly:
    """A multiprocessing Event, read and set through its flag (a semaphore that counts more than
    zero once set) without its lock."""

    def __init__(self, event: Any) -> None:
        self._flag = event._flag

    def is_set(self) -> bool:
        if self._flag.acquire(False):
            self._flag.release()
            return True
        return False

    def set(self) -> None:
        # up by two (it is set once or twice): a worker that looks at the flag under the lock
        # takes one for a moment, and a look without the lock must still find one
        self._flag.release()
        self._flag.release()


def any_died(workers: Iterable[Any]) -> bool:
    """Whether one of the worker processes ``workers`` ended other than by returning."""
    for worker in workers:
        try:
            if worker.exitcode not in (None, 0):
                return True
        except ValueError:  # a closed process object: gone long ago, and reaped
            continue
    return False


def unlock_once_one_died(iterator: Any) -> None:
    """Once a worker of ``iterator`` (a DataLoader's iterator over worker processes) has died,
    read and set its stop Event, and its abandon Event (``_abandon_reads``, if any), through
    their flags alone."""
    if isinstance(iterator._workers_done_event, FlagOnly) or not any_died(iterator._workers):
        return
    iterator._workers_done_event = FlagOnly(iterator._workers_done_event)
    if iterator._abandon_reads is not None:
        iterator._abandon_reads = FlagOnly(iterator._abandon_reads)
