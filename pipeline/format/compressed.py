"""Shards compressed with gzip (a ``.tar.gz``, as webdataset's ``ShardWriter("x-%06d.tar.gz")``
writes them): recognised by their first bytes and decompressed as they are read, so that the tar
reader sees a plain tar whatever the shard's name says."""

from __future__ import annotations

import gzip
import zlib
from typing import Any, BinaryIO

from .errors import ShardError

GZIP_MAGIC = b"\x1f\x8b"


class _Peeked:
    """A stream whose first bytes were read to look at them, read again from the start."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self.head, self.stream = head, stream

    def read(self, size: int = -1) -> bytes:
        if not self.head:
            return self.stream.read(size)
        if size < 0:
            data, self.head = self.head + self.stream.read(), b""
            return data
        data, self.head = self.head[:size], self.head[size:]
        return data if len(data) == size else data + self.stream.read(size - len(data))


class _Gunzipped:
    """A gzip stream read as the tar it holds. Damage to the compressed bytes (a cut, a bad
    block, a checksum that differs, which gzip checks at the end: read to the end) is a
    :class:`ShardError` naming the shard; errors of the stream below pass through."""

    def __init__(self, compressed: Any, url: str) -> None:
        self.file = gzip.GzipFile(fileobj=compressed, mode="rb")
        self.url = url

    def read(self, size: int = -1) -> bytes:
        try:
            return self.file.read(size)
        except ShardError:
            raise
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ShardError(self.url, None, f"gzip-compressed shard is damaged or cut: {exc}") from None


def open_archive(stream: BinaryIO, url: str) -> BinaryIO:
    """The tar stream in ``stream``: decompressed as it is read when it is gzip-compressed (a
    ``.tar.gz``, as webdataset writes with ``ShardWriter("x-%06d.tar.gz")``; byte offsets in
    errors are then those of the decompressed tar), else as it is."""
    head = stream.read(2)
    peeked = _Peeked(head, stream)
    if head != GZIP_MAGIC:
        return peeked  # type: ignore[return-value]
    return _Gunzipped(peeked, url)  # type: ignore[return-value]
