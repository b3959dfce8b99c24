"""``verify``: every shard of a set, local or remote, against its index.

Each shard is streamed once (never whole in memory) through
:func:`~pipeline.format.verify.verify_stream`, which checks its size, sha256, record count,
offsets, checksums and decoding; the shard table is checked against its own sha256. A shard
that cannot be read (missing on the server, say) is a problem of that shard, not the end of
the check.
"""

from __future__ import annotations

import os
from functools import partial
from typing import BinaryIO, Callable

from ..format.index import ShardInfo
from ..format.verify import Problem, verify_stream, verify_table_stream
from ..storage import SourceError, is_remote, join, open_stream, redact
from ..storage.indexes import open_index


def _check_file(base: str, name: str, check: Callable[[BinaryIO, str], Problem | None]) -> Problem | None:
    """``check(stream, shown)`` of the file ``name`` of the set in the folder ``base``; a file
    that cannot be read is a problem of that file. ``shown`` names it as the index does when the
    set is local (its folder is the one the user gave), by its URL when remote (one to fetch)."""
    shown = name
    try:
        url = join(base, name)  # refuses a name that is a pipe: command: it must never run
        shown = redact(url) if is_remote(base) else name
        with open_stream(url) as stream:
            return check(stream, shown)
    except SourceError as exc:
        reason = exc.reason or str(exc)
        if not exc.offset:
            return Problem(shown, f"missing file or unreadable: {reason}")
        return Problem(shown, f"read failed: {reason}", offset=exc.offset)


def verify(location: str | os.PathLike[str],
           on_shard: Callable[[ShardInfo, Problem | None], None] | None = None) -> list[Problem]:
    """Check every shard named by the index at ``location`` (an index file, its folder, or a URL
    of either: ``https://...``, ``s3://bucket/prefix``), calling ``on_shard(info, problem)``
    after each. An index that cannot be opened raises :class:`~pipeline.IndexFormatError`
    (there is nothing to check the shards against)."""
    found = open_index(location)
    index, base = found.index, found.base
    problems = []
    if index.table is not None:
        problems.append(_check_file(base, index.table.name, partial(verify_table_stream, table=index.table)))
    for info in index.shards:
        problem = _check_file(base, info.url, partial(verify_stream, info=info, index=index))
        problems.append(problem)
        if on_shard is not None:
            on_shard(info, problem)
    return [problem for problem in problems if problem is not None]
