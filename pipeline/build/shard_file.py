"""One shard on disk, written so that it is either complete or absent.

Records go to a temporary file next to the final name; ``commit`` writes the end-of-archive
blocks, fsyncs and renames, so a crash or an error never leaves a file under the shard's
name that is shorter than what the index will say. The sha256 and the record offsets are
computed on the way, so the index entry costs no second read.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..format.index import ShardInfo
from ..format.tar import END_OF_ARCHIVE, member_header, padding

_FLUSH_BYTES = 8 << 20
_MAX_IOV = 1024


class ShardFile:
    """Accumulates records of one shard; use as a context manager (aborts on error)."""

    def __init__(self, path: Path, url: str) -> None:
        self.path = path
        self.url = url
        self.tmp_path = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self._fd: int | None = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._sha = hashlib.sha256()
        self._pending: list[bytes | memoryview] = []
        self._pending_bytes = 0
        self.position = 0
        self.samples = 0
        self.offsets: list[int] = []

    def add_record(self, key: str, payload: bytes, rows: int) -> None:
        """Append the record ``<key>.msgpack`` holding ``rows`` samples."""
        header = member_header(f"{key}.msgpack", len(payload))
        self.offsets.append(self.position)
        self.samples += rows
        self._append(header)
        self._append(payload)
        pad = padding(len(payload))
        if pad:
            self._append(pad)
        if self._pending_bytes >= _FLUSH_BYTES:
            self._flush()

    def _append(self, data: bytes | memoryview) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        self.position += len(data)

    def _flush(self) -> None:
        assert self._fd is not None
        for i in range(0, len(self._pending), _MAX_IOV):
            chunk = self._pending[i:i + _MAX_IOV]
            for part in chunk:
                self._sha.update(part)
            total = sum(len(part) for part in chunk)
            written = os.writev(self._fd, chunk)
            if written != total:  # a short write (disk full, signal): finish it by hand
                rest = b"".join(chunk)[written:]
                while rest:
                    n = os.write(self._fd, rest)
                    rest = rest[n:]
        self._pending.clear()
        self._pending_bytes = 0

    def commit(self) -> ShardInfo:
        """Finish the archive, make it durable and give it its final name."""
        self._append(END_OF_ARCHIVE)
        self._flush()
        assert self._fd is not None
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        os.replace(self.tmp_path, self.path)
        return ShardInfo(self.url, self.samples, len(self.offsets), self.position,
                         self._sha.hexdigest(), self.offsets)

    def abort(self) -> None:
        """Drop the partial shard: nothing is left under the final or temporary name."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.tmp_path.unlink(missing_ok=True)

    def __enter__(self) -> "ShardFile":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
