"""What a process has already warned of, so that a warning that would come again for every
shard, every epoch (the same cause met again) is given once, and logged at DEBUG after that.

The registry is the process's: a DataLoader worker has its own (a copy of its parent's where
it was forked), so each worker warns at most once of each thing too.
"""

from __future__ import annotations

from typing import Hashable

_SEEN: set[Hashable] = set()


def first_time(what: Hashable) -> bool:
    """Whether this process meets ``what`` (a key naming the warning and its cause) for the first
    time; from then on it has met it."""
    first = what not in _SEEN
    _SEEN.add(what)
    return first
