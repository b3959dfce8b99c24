"""One shard on disk, written so that it is either complete or absent.

Records go to a temporary file next to the final name; ``commit`` writes the end-of-archive
blocks, fsyncs and renames, so a crash or an error never leaves a file under the shard's
name that is shorter than what the index will say. The sha256 and the record offsets are
computed on the way, so the index entry costs no second read.

Hashing and writing run in a background thread (both release the GIL) while the caller
encodes the next records: on two cores that nearly doubles the throughput of large samples.
Record payloads arrive as lists of buffers that reference the source arrays, so array data is
copied once, by the kernel, on its way to the page cache.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..format.shard_table import ShardInfo, record_checksum
from ..format.tar import BLOCK, END_OF_ARCHIVE, member_header, padding
from ..storage.destination import write_error

Buffer = bytes | memoryview

_FLUSH_BYTES = 8 << 20
_QUEUED_FLUSHES = 3  # bounds memory: at most this many flushes wait for the writer thread
_MAX_IOV = 1024
_JOIN_BYTES = 16 << 10  # a record smaller than this is copied into one buffer, rather than hashed and written in parts


class _Worker:
    """Applies a function to each submitted item, in order, in its own thread; the first
    error is kept, later items are skipped."""

    def __init__(self, name: str, apply: Callable[[list[Buffer]], None]) -> None:
        self.apply = apply
        self.error: BaseException | None = None
        self.queue: queue.Queue[list[Buffer] | None] = queue.Queue(maxsize=_QUEUED_FLUSHES)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.apply(item)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    self.error = exc


class _BackgroundWriter:
    """Hashes and writes lists of buffers to a file descriptor, in order, in two threads of
    its own (hashlib and os.writev release the GIL, so both run beside the encoder). The first
    error is raised to the caller at its next call."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.sha = hashlib.sha256()
        self._workers = (_Worker("shard-hash", self._hash), _Worker("shard-write", self._write))

    def _hash(self, buffers: list[Buffer]) -> None:
        for part in buffers:
            self.sha.update(part)

    def _write(self, buffers: list[Buffer]) -> None:
        """Write ``buffers`` in order. A short write (Linux writes less than 2 GiB a call, so a
        sample larger than that always makes one; a signal) goes on from the byte it reached:
        joining what was left into one copy took as much memory again as the record."""
        pending = list(buffers)
        while pending:
            written = os.writev(self.fd, pending[:_MAX_IOV])
            done = 0
            while done < len(pending) and len(pending[done]) <= written:
                written -= len(pending[done])
                done += 1
            pending = pending[done:]
            if written:  # (the first part left was written in part)
                pending[0] = memoryview(pending[0])[written:]

    def submit(self, buffers: list[Buffer]) -> None:
        self.raise_error()
        for worker in self._workers:
            worker.queue.put(buffers)

    def finish(self) -> None:
        """Wait until everything submitted is hashed and written; raise the first error."""
        for worker in self._workers:
            worker.queue.put(None)
        for worker in self._workers:
            worker.thread.join()
        self.raise_error()

    def raise_error(self) -> None:
        for worker in self._workers:
            if worker.error is not None:
                raise worker.error


class ShardFile:
    """Accumulates records of one shard; use as a context manager (aborts on error)."""

    def __init__(self, path: Path, url: str) -> None:
        self.path = path
        self.url = url
        self.tmp_path = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self._fd: int | None = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._writer = _BackgroundWriter(self._fd)
        self._pending: list[Buffer] = []
        self._pending_bytes = 0
        self.position = 0
        self.samples = 0
        self.offsets: list[int] = []
        self.checksum: list[int] = []  # of each record's payload: readers check it (see shard_table)

    def add_record(self, key: str, parts: Sequence[Buffer], rows: int) -> None:
        """Append the record ``<key>.msgpack`` whose payload is the concatenation of ``parts``
        and which holds ``rows`` samples. The parts must not change until the shard is done."""
        size = sum(map(len, parts))
        header, pad = member_header(f"{key}.msgpack", size), padding(size)
        if size < _JOIN_BYTES:  # (a small record's parts as one buffer: the threads take each in a call of their own)
            record = b"".join((header, *parts, pad))
            self.checksum.append(record_checksum((memoryview(record)[len(header):len(header) + size],)))
            self._pending.append(record)
        else:
            self.checksum.append(record_checksum(parts))
            self._pending += (header, *parts, pad)
        self.offsets.append(self.position)
        self.samples += rows
        self._pending_bytes += len(header) + size + len(pad)
        self.position += len(header) + size + len(pad)
        if self._pending_bytes >= _FLUSH_BYTES:
            self._flush()

    def add_fixed_records(self, records: np.ndarray, rows_per_record: int) -> None:
        """Append whole records already laid out as a (records, record_bytes) uint8 array
        (see :mod:`pipeline.write.fixed_records`), each holding ``rows_per_record`` samples."""
        count, size = records.shape
        self.offsets.extend(range(self.position, self.position + count * size, size))
        if count:
            payload = int(bytes(records[0, 124:136]).strip(b"\0 "), 8)  # the records differ only in data
            flat = memoryview(records).cast("B")
            self.checksum.extend(record_checksum((flat[at:at + payload],)) for at in range(BLOCK, count * size, size))
        self.samples += count * rows_per_record
        self._append(memoryview(records).cast("B"))
        if self._pending_bytes >= _FLUSH_BYTES:
            self._flush()

    def _append(self, data: Buffer) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        self.position += len(data)

    def _flush(self) -> None:
        self._writer.submit(self._pending)
        self._pending = []
        self._pending_bytes = 0

    def commit(self) -> ShardInfo:
        """Finish the archive, make it durable and give it its final name."""
        self._append(END_OF_ARCHIVE)
        self._flush()
        self._writer.finish()
        assert self._fd is not None
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        os.replace(self.tmp_path, self.path)
        return ShardInfo(self.url, self.samples, len(self.offsets), self.position,
                         self._writer.sha.hexdigest(), self.offsets, self.checksum)

    def abort(self) -> None:
        """Drop the partial shard: nothing is left under the final or temporary name."""
        if self._fd is not None:
            try:
                self._writer.finish()
            except BaseException:  # noqa: BLE001 - the shard is being dropped anyway
                pass
            os.close(self._fd)
            self._fd = None
        self.tmp_path.unlink(missing_ok=True)

    def __enter__(self) -> "ShardFile":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
            named = write_error(exc, self.path) if isinstance(exc, OSError) else exc
            if named is not exc:
                raise named from exc
