"""One object per process: what a forked child must make anew rather than inherit (threads do
not survive a fork, and sockets or buffers shared with the parent would be used by both)."""

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
