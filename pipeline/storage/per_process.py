"""One object per process: what a forked child must make anew rather than inherit (threads do
not survive a fork, and sockets or buffers shared with the parent would be used by both); and
whether a process is still there, for what a killed one left behind."""

from __future__ import annotations

import os
from typing import Callable, TypeVar

T = TypeVar("T")


def per_process(make: Callable[[], T]) -> Callable[[], T]:
    """A function returning ``make()``'s object of this process, made on its first call here
    (the parent's is dropped in a child, not shared)."""
    made: dict[int, T] = {}

    def get() -> T:
        pid = os.getpid()
        if pid not in made:
            made.clear()
            made[pid] = make()
        return made[pid]
    return get


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (another user's, which we may not signal,
    counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
