"""Where ``on_error="skip"`` stops: it stands in for damaged pieces, not for a lost server.

A piece whose read spent its retries is skipped like a damaged one: one such read may be a
server's bad minute. But when the server is gone, every piece fails so, each after the whole
retry budget, and skipping them fills the epoch with repeats of the few rows read before, for as
long as the epoch lasts (tens of minutes), without an error. Reads of several shards of a set
in a row failing so, with none of its reads succeeding between them, end the epoch instead."""

from __future__ import annotations

from ..storage import SourceError
from ..storage.errors import RetriesSpent

#: distinct shards of one set whose reads spent their retries, none read between them
LOST_AFTER_SHARDS = 3


class LostStorage:
    """The shards of each source whose reads spent their retries since its last good read."""

    def __init__(self) -> None:
        self._failing: dict[int, set[int]] = {}

    def read(self, source: int) -> None:
        """A read of ``source`` succeeded: its server answers."""
        self._failing.pop(source, None)

    def failed(self, exc: SourceError | Exception, source: int, shard: int) -> None:
        """A read of ``shard`` of ``source`` failed with ``exc``; raise when reads of
        :data:`LOST_AFTER_SHARDS` of its shards in a row spent their retries."""
        if not isinstance(exc, RetriesSpent):
            return  # (a missing or damaged shard is the skip policy's to stand in for)
        failing = self._failing.setdefault(source, set())
        failing.add(shard)
        if len(failing) >= LOST_AFTER_SHARDS:
            raise SourceError(exc.url, exc.offset, f"{exc.reason}; reads of {len(failing)} shards of this set in a "
                              f"row failed so, none read between them: the storage does not answer. "
                              f"on_error='skip' stands in for damaged pieces, not for a lost server: start again "
                              f"once it answers (from a checkpoint: loader.state_dict())") from None
