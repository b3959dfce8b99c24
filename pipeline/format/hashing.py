"""A stream that hashes (sha256) and counts what is read through it: how a shard's sha256 and
size come out of the one pass that also walks its records (verify, and indexing shards)."""

from __future__ import annotations

import hashlib
from typing import BinaryIO


class HashingReader:
    """``read`` passes the bytes of ``stream`` through, adding them to ``sha`` and ``size``."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.sha = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.sha.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        """Read what is left, so that the hash and size cover the whole stream."""
        while self.read(1 << 20):
            pass
