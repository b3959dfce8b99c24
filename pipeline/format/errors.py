"""Exceptions of the shard format: each one names where the problem is.

Readers and writers raise these, never bare ``ValueError``/``KeyError``, so that a user
who sees one knows which file, shard, record or byte offset to look at.
"""

from __future__ import annotations


class FormatError(Exception):
    """Base class of every error the shard format raises."""


class SampleError(FormatError, ValueError):
    """A sample cannot be encoded (unsupported type, bad field name) or decoded."""


class ShardError(FormatError):
    """A shard is malformed: bad tar header, truncated member, undecodable record.

    The message always carries the shard URL and the byte offset of the problem.
    """

    def __init__(self, url: str, offset: int | None = None, reason: str | None = None) -> None:
        self.url = url
        self.offset = offset
        self.reason = reason
        if reason is None:  # rebuilt from its message alone (as DataLoader does across processes)
            super().__init__(url)
            return
        where = f"{url}" if offset is None else f"{url} at byte {offset}"
        super().__init__(f"{where}: {reason}")


class IndexFormatError(FormatError):
    """An index file is missing, unreadable, of an unknown version, or inconsistent."""
