"""Map a shard URL to bytes: a byte range (indexed reads) or a stream (whole shards).

Local paths and ``file://`` URLs are read here; every failure names the URL, the byte offset
and the cause.
"""

from __future__ import annotations

import os
from typing import BinaryIO
from urllib.parse import urlparse

from ..format.errors import FormatError


class SourceError(FormatError, OSError):
    """A shard or index cannot be read from its URL."""


def local_path(url: str) -> str:
    """The file system path of a local URL (``file://`` or a plain path)."""
    if url.startswith("file://"):
        return urlparse(url).path
    if "://" in url:
        raise SourceError(f"{url}: scheme {url.split('://', 1)[0]!r} is not supported (local paths and file:// are)")
    return url


def read_range(url: str, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of ``url``; fewer bytes than asked for is an error."""
    path = local_path(url)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise SourceError(f"{url}: cannot open: {exc.strerror}") from None
    try:
        chunks = []
        position = start
        while position < stop:
            data = os.pread(fd, min(stop - position, 64 << 20), position)
            if not data:
                raise SourceError(f"{url}: ends at byte {position}, expected data up to byte {stop}")
            chunks.append(data)
            position += len(data)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


def open_stream(url: str) -> BinaryIO:
    """A buffered binary stream of a whole shard."""
    path = local_path(url)
    try:
        return open(path, "rb", buffering=1 << 20)
    except OSError as exc:
        raise SourceError(f"{url}: cannot open: {exc.strerror}") from None
