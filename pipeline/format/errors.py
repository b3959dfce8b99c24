"""Exceptions of the shard format: each one names where the problem is.

Readers and writers raise these, never bare ``ValueError``/``KeyError``, so that a user
who sees one knows which file, shard, record or byte offset to look at.
"""

from __future__ import annotations


class FormatError(Exception):
    """Base class of every error the shard format raises."""


class SampleError(FormatError, ValueError):
    """A sample cannot be encoded (unsupported type, bad field name) or decoded."""


class LocatedError(FormatError):
    """An error at a place: a URL, the byte offset when known, and the reason.

    Built from its message alone (``LocatedError(message)``), as a DataLoader does when it
    re-raises a worker's exception in the main process, it keeps that message.
    """

    def __init__(self, url: str, offset: int | None = None, reason: str | None = None) -> None:
        self.url = url
        self.offset = offset
        self.reason = reason
        if reason is None:
            super().__init__(url)
            return
        shown = self.display(url)
        super().__init__(f"{shown}: {reason}" if offset is None else f"{shown} at byte {offset}: {reason}")

    @staticmethod
    def display(url: str) -> str:
        """How the URL appears in the message."""
        return url


class ShardError(LocatedError):
    """A shard is malformed: bad tar header, truncated member, undecodable record."""


class IndexFormatError(FormatError):
    """An index file is missing, unreadable, of an unknown version, or inconsistent."""
