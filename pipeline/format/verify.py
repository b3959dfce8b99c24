"""Check a shard set against its index: sizes, sha256, record offsets and counts, decoding.

Every problem is reported with the shard, the record number and byte offset when known, and
the reason; a shard's check stops at its first problem (what follows is not trustworthy).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from .codec import KEYS_FIELD, ROWS_FIELD
from .errors import FormatError, SampleError, ShardError
from .index import INDEX_NAME, DatasetIndex, ShardInfo, load_index
from .packing import record_rows
from .records import decode_fields, iter_records
from .shard_table import check_record


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a shard."""

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
    """A read-only stream that hashes what passes through it."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.sha = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.sha.update(data)
        return data


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


def verify_shard(path: Path, info: ShardInfo, index: DatasetIndex) -> Problem | None:
    """The first problem of one shard, or ``None`` if it matches its index entry."""
    url = info.url
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return Problem(url, f"missing file {path}")
    if size != info.bytes:
        return Problem(url, f"size is {size} bytes, the index says {info.bytes}")
    samples = 0
    number = 0  # the record being read
    keys: dict[str, int] = {}  # where each record key was first seen
    with open(path, "rb") as raw:
        stream = _HashingReader(raw)
        try:
            for record in iter_records(stream, url):  # type: ignore[arg-type]
                if number >= info.records:
                    return Problem(url, f"more records than the {info.records} the index says",
                                   number, record.offset)
                if keys.setdefault(record.key, record.offset) != record.offset:
                    return Problem(url, f"record key {record.key!r} appears twice (first at byte "
                                   f"{keys[record.key]})", number, record.offset)
                fields = decode_fields(record, url, index.fields or None)  # the loader's schema check
                _check_packed_rows(fields, url, number, record.offset)
                check_record(record, info, number, url)  # after decoding: its reasons say more
                samples += record_rows(fields)
                number += 1
        except (ShardError, SampleError) as exc:
            reason = exc.reason if isinstance(exc, ShardError) else str(exc)
            offset = exc.offset if isinstance(exc, ShardError) else None
            return Problem(url, reason, number, offset)
        while stream.read(1 << 20):
            pass
    if number != info.records:
        return Problem(url, f"{number} records, the index says {info.records}")
    if samples != info.samples:
        return Problem(url, f"{samples} samples, the index says {info.samples}")
    if stream.sha.hexdigest() != info.sha256:
        return Problem(url, f"sha256 {stream.sha.hexdigest()} differs from the index's {info.sha256}")
    return None


def _check_table(path: Path, sha256: str) -> list[Problem]:
    """The shard table's own checksum (its size and counts were checked when it was opened)."""
    digest = hashlib.sha256()
    with open(path, "rb") as table:
        while block := table.read(1 << 22):
            digest.update(block)
    if digest.hexdigest() != sha256:
        return [Problem(path.name, f"sha256 {digest.hexdigest()} differs from the index's {sha256}")]
    return []


def verify(index_path: str | os.PathLike[str],
           on_shard: Callable[[ShardInfo, Problem | None], None] | None = None) -> list[Problem]:
    """Check every shard named by an index (a file, or a folder holding ``index.json``)."""
    index_path = Path(index_path)
    if index_path.is_dir():
        index_path = index_path / INDEX_NAME
    try:
        index = load_index(index_path)
    except FormatError as exc:
        return [Problem(str(index_path), str(exc))]
    problems = [] if index.table is None else _check_table(index_path.parent / index.table.name, index.table.sha256)
    for info in index.shards:
        problem = verify_shard(index_path.parent / info.url, info, index)
        if problem is not None:
            problems.append(problem)
        if on_shard is not None:
            on_shard(info, problem)
    return problems
