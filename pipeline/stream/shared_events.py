"""The main process's side of the Events a loader shares with its workers: set without their lock.

A multiprocessing ``Event`` is a flag (a semaphore) and a condition whose lock is a semaphore
that every process holding the Event takes. ``is_set()`` takes that lock; ``set()`` takes it,
wakes each process asleep in ``wait()``, and waits for each to say it woke. PyTorch's workers
look at their stop Event, under the lock, after every wait for work; a read backing off before
its retry sleeps on the loader's abandon Event, 50 ms at a time. A worker killed there (the
out-of-memory killer strikes anywhere) never lets the lock go, or never says it woke, and the
main process waited for ever: in PyTorch's check of its stop Event as it found the death, or in
``set()`` as it stopped the other workers. (PyTorch counts on a death signal to interrupt such a
wait; none comes for a worker that died before it began.)

The main process only ever sets these Events, once, and nothing clears them. So it sets them
through their flag alone and keeps whether it did (:class:`SetHere`): it never takes their lock
nor waits for a sleeper. The workers see the flag the next time they look: PyTorch's as they are
told to stop, a back-off within 50 ms. Where a dead worker held the lock, the workers left wait
on it, and are stopped as PyTorch stops a worker that does not exit (5 s, then SIGTERM).
"""

from __future__ import annotations

from typing import Any


class SetHere:
    """The main process's side of a multiprocessing Event its workers read: set here only."""

    def __init__(self, event: Any) -> None:
        # held whole: a spawned worker opens each of its semaphores by name, which goes with it
        self._event = event
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._event._flag.release()  # counts one once set (as Event.set leaves it)
