"""Check one shard, read from a stream, against its index entry: size, sha256, record offsets,
checksums and counts, decoding; and a shard table against its sha256.

Every problem is reported with the shard, the record number and byte offset when known, and
the reason; a shard's check stops at its first problem (what follows is not trustworthy). Where
the bytes come from is the caller's business (:mod:`pipeline.check.verify` opens them by path
or URL), so this module reads nothing but the streams it is given, each once, front to back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import BinaryIO

from .codec import KEYS_FIELD, ROWS_FIELD
from .errors import SampleError, ShardError
from .index import DatasetIndex, ShardInfo, TableFile
from .packing import record_rows
from .records import decode_fields, iter_records
from .shard_table import check_record


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a shard (or with the shard table): ``shard`` names it, ``record``
    and ``offset`` say where in it when known."""

    shard: str
    reason: str
    record: int | None = None
    offset: int | None = None

    def __str__(self) -> str:
        where = self.shard
        if self.record is not None:
            where += f" record {self.record}"
        if self.offset is not None:
            where += f" (byte {self.offset})"
        return f"{where}: {self.reason}"


class _HashingReader:
    """A read-only stream that hashes and counts what passes through it."""

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


def _check_packed_rows(fields: dict, url: str, number: int, offset: int) -> None:
    """Every column of a packed record holds the rows the record says it holds."""
    names = set(fields) - {ROWS_FIELD, KEYS_FIELD}
    rows = record_rows(fields)
    if ROWS_FIELD in fields:
        for name in names:
            try:
                length = len(fields[name])
            except TypeError:
                length = None
            if length != rows:
                raise ShardError(url, offset, f"packed record {number}: field {name!r} has "
                                 f"{length} rows, the record says {rows}")


def _record_problem(stream: _HashingReader, info: ShardInfo, index: DatasetIndex, shard: str) -> Problem | None:
    """The first problem of the records of a shard (offsets, checksums, keys, decoding, counts)."""
    samples = 0
    number = 0  # the record being read
    keys: dict[str, int] = {}  # where each record key was first seen
    try:
        for record in iter_records(stream, shard):  # type: ignore[arg-type]
            if number >= info.records:
                return Problem(shard, f"more records than the {info.records} the index says", number, record.offset)
            if keys.setdefault(record.key, record.offset) != record.offset:
                return Problem(shard, f"record key {record.key!r} appears twice (first at byte "
                               f"{keys[record.key]})", number, record.offset)
            fields = decode_fields(record, shard, index.fields or None)  # the loader's schema check
            _check_packed_rows(fields, shard, number, record.offset)
            check_record(record, info, number, shard)  # after decoding: its reasons say more
            samples += record_rows(fields)
            number += 1
    except (ShardError, SampleError) as exc:
        reason = exc.reason if isinstance(exc, ShardError) else str(exc)
        offset = exc.offset if isinstance(exc, ShardError) else None
        return Problem(shard, reason, number, offset)
    if number != info.records:
        return Problem(shard, f"{number} records, the index says {info.records}")
    if samples != info.samples:
        return Problem(shard, f"{samples} samples, the index says {info.samples}")
    return None


def verify_stream(stream: BinaryIO, shard: str, info: ShardInfo, index: DatasetIndex) -> Problem | None:
    """The first problem of one shard, read whole from ``stream``, or ``None`` if it matches its
    index entry; ``shard`` names it in the problem. A size that differs from the index's is
    reported before what it breaks (a cut shard's last record is cut too)."""
    reader = _HashingReader(stream)
    problem = _record_problem(reader, info, index, shard)
    reader.drain()
    if reader.size != info.bytes:
        return Problem(shard, f"size is {reader.size} bytes, the index says {info.bytes}")
    if problem is not None:
        return problem
    if reader.sha.hexdigest() != info.sha256:
        return Problem(shard, f"sha256 {reader.sha.hexdigest()} differs from the index's {info.sha256}")
    return None


def verify_table_stream(stream: BinaryIO, shown: str, table: TableFile) -> Problem | None:
    """The shard table's own checksum, read from ``stream`` (its size and counts were checked
    when the index was opened); ``shown`` names it in the problem."""
    reader = _HashingReader(stream)
    reader.drain()
    if reader.sha.hexdigest() != table.sha256:
        return Problem(shown, f"sha256 {reader.sha.hexdigest()} differs from the index's {table.sha256}")
    return None
