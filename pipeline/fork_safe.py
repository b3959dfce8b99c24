"""A lock that survives a fork unheld, for state that reader threads share in every process of
a loader (the main one, forked DataLoader workers, spawned ones)."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any


class ForkSafeLock:
    """A ``threading.Lock`` that a forked child gets anew, and unheld.

    Why: a fork copies a lock as it stands. One that a reader thread of the parent held at that
    moment would stay held for ever in the child, where that thread does not exist, and the
    child's first reader would wait on it for ever. A pickled one (for a worker started with
    spawn) is made anew too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = self._lock  # the lock its holder took (a child forked under it has a new one)
        _locks.add(self)

    def __enter__(self) -> "ForkSafeLock":
        lock = self._lock
        lock.acquire()
        self._held = lock
        return self

    def __exit__(self, *exc: Any) -> None:
        self._held.release()

    def __reduce__(self) -> tuple:
        return ForkSafeLock, ()

    def _renew(self) -> None:
        self._lock = threading.Lock()


_locks: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


def _renew_locks() -> None:
    for lock in list(_locks):
        lock._renew()


os.register_at_fork(after_in_child=_renew_locks)
