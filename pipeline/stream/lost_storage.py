"""Where ``on_error="skip"`` stops: it stands in for damaged pieces, not for a lost server.

A piece whose read spent its retries is skipped like a damaged one: one such read may be a
server's bad minute. But when the server is gone, every piece fails so, each after the whole
retry budget, and skipping them fills the epoch with repeats of the few rows read before, for as
long as the epoch lasts (tens of minutes), without an error. So reads of several shards of a
set spending their retries, none of its reads succeeding between them, for longer than a read
may retry (the policy's deadline), end the epoch instead. Both conditions matter: a unit's
pieces are read at once on several threads, so one short outage fails several shards at the
same moment, and the reads after it succeed."""

from __future__ import annotations

import time
from typing import Callable

from ..fork_safe import ForkSafeLock
from ..storage import SourceError
from ..storage.errors import RetriesSpent

#: distinct shards of one set whose reads spent their retries, none read between them
LOST_AFTER_SHARDS = 3


class _Run:
    """Failures of one source since its last good read: when the first came, and of which shards."""

    def __init__(self, now: float) -> None:
        self.began = now
        self.shards: set[int] = set()


class LostStorage:
    """The reads of each source that spent their retries since its last good read."""

    def __init__(self, deadline: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.deadline = deadline
        self.clock = clock
        self._runs: dict[int, _Run] = {}
        self._lock = ForkSafeLock()  # (a worker's reader threads report at once)

    def __getstate__(self) -> dict:  # (sent to DataLoader workers: each starts afresh)
        return {"deadline": self.deadline, "clock": self.clock}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def read(self, source: int) -> None:
        """A read of ``source`` succeeded: its server answers."""
        if source not in self._runs:  # (each piece read asks: the lock only when there is a run to end)
            return
        with self._lock:
            self._runs.pop(source, None)

    def failed(self, exc: Exception, source: int, shard: int) -> None:
        """A read of ``shard`` of ``source`` failed with ``exc``; raise once reads of
        :data:`LOST_AFTER_SHARDS` of its shards have spent their retries, none read between
        them, for longer than the retry deadline."""
        if not isinstance(exc, RetriesSpent):
            return  # (a missing or damaged shard is the skip policy's to stand in for)
        now = self.clock()
        with self._lock:
            run = self._runs.setdefault(source, _Run(now))
            run.shards.add(shard)
            lost = len(run.shards) >= LOST_AFTER_SHARDS and now - run.began > self.deadline
            count, seconds = len(run.shards), now - run.began
        if lost:
            raise SourceError(exc.url, exc.offset, f"{exc.reason}; reads of {count} shards of this set failed so "
                              f"for {seconds:.0f}s, none read between them: the storage does not answer. "
                              f"on_error='skip' stands in for damaged pieces, not for a lost server: start again "
                              f"once it answers (from a checkpoint: loader.state_dict())") from None
