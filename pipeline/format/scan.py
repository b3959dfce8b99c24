"""Read a shard into its index entry and schema, without an index to compare with.

Two users: a resumed build scans the shards a killed run left (:func:`scan_shard`: exactly what
this library's writer produces), and ``pipeline index`` scans shards written by other tools
(:func:`scan_stream`: any plain tar a reader can walk, streamed once). The entry is computed the
way the writer computes it (sha256 of the whole file, the byte offset and checksum of every
record, records and samples counted), so a shard scanned has the entry a fresh write would
have produced, and every reader checks it the same way.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import replace
from typing import Any, BinaryIO, Mapping

from .codec import KEYS_FIELD, ROWS_FIELD
from .errors import IndexFormatError, SampleError, ShardError
from .hashing import HashingReader
from .index import FieldSpec, Schema, ShardInfo, merge_spec, spec_of
from .numbers import outside_int64
from .shard_table import record_checksum
from .tar import END_OF_ARCHIVE
from .walk import WalkedRecord, walk_shard

_RESERVED = (ROWS_FIELD, KEYS_FIELD)


class SchemaInference:
    """The schema of records seen one after another: each field's spec merged over the records
    that hold it. With ``optional``, a field some records lack is optional; without, every
    record must hold the fields of the first."""

    def __init__(self, optional: bool = False) -> None:
        self.optional = optional
        self.specs: dict[str, FieldSpec] = {}
        self.present: Counter[str] = Counter()
        self.records = 0
        self._seen: set[tuple] = set()  # layouts already merged: most records repeat one

    def add(self, walked: WalkedRecord) -> None:
        names = [name for name in walked.fields if name not in _RESERVED]
        if self.records and not self.optional and set(names) != set(self.specs):
            missing, extra = sorted(set(self.specs) - set(names)), sorted(set(names) - set(self.specs))
            raise IndexFormatError(f"record {walked.key!r}: fields differ from earlier samples "
                                   f"(missing {missing}, extra {extra})")
        layout = _layout(walked.fields, walked.rows)
        if layout is None or layout not in self._seen:
            for name, spec in record_schema(walked.fields, walked.rows).items():
                old = self.specs.get(name)
                self.specs[name] = spec if old is None else merge_spec(name, old, spec, f"record {walked.key!r}")
            if layout is not None:
                self._seen.add(layout)
        self.present.update(names)
        self.records += 1

    def schema(self) -> Schema:
        return {name: replace(spec, optional=True) if self.present[name] < self.records else spec
                for name, spec in self.specs.items()}


class _Scan:
    """What a scan collects from the records walked: their offsets, checksums, rows, schema."""

    def __init__(self, url: str, optional: bool) -> None:
        self.url = url
        self.offsets: list[int] = []
        self.checksums: list[int] = []
        self.rows: list[int] = []
        self.packed: list[bool] = []  # whether each record is packed (a pack of 1 writes none so)
        self.inference = SchemaInference(optional)
        self.end = 0

    def add(self, walked: WalkedRecord) -> None:
        try:
            self.inference.add(walked)
        except (SampleError, IndexFormatError) as exc:
            raise ShardError(self.url, walked.offset, str(exc)) from None
        self.offsets.append(walked.offset)
        self.checksums.append(record_checksum(walked.record.members.values()))
        self.rows.append(walked.rows)
        self.packed.append(ROWS_FIELD in walked.fields)
        self.end = walked.end

    def entry(self, size: int, sha256: str) -> ShardInfo:
        return ShardInfo(self.url, sum(self.rows), len(self.offsets), size, sha256, self.offsets, self.checksums)


def scan_shard(data: bytes | memoryview, url: str) -> tuple[ShardInfo, Schema, list[int | None]]:
    """The index entry (``ShardInfo`` named ``url``), the field schema and the rows of each
    record (``None`` for a sample stored unpacked) of a shard held in ``data`` (e.g. a mapped
    file).

    Accepts exactly what this library's writer produces: records one after another, then the
    end-of-archive blocks and nothing else. Anything else (a truncated member, a record that
    does not decode, fields that differ between records, missing or extra trailing bytes)
    raises :class:`ShardError` naming the byte offset.
    """
    view = memoryview(data).cast("B")
    scan = _Scan(url, optional=False)
    for walked in walk_shard(view, url):
        scan.add(walked)
    if view[scan.end:] != END_OF_ARCHIVE:
        raise ShardError(url, scan.end, f"expected the {len(END_OF_ARCHIVE)} end-of-archive bytes after the last "
                         f"record and nothing else, found {len(view) - scan.end} bytes")
    rows = [n if packed else None for n, packed in zip(scan.rows, scan.packed)]
    return scan.entry(len(view), hashlib.sha256(view).hexdigest()), scan.inference.schema(), rows


def scan_stream(stream: BinaryIO, url: str) -> tuple[ShardInfo, Schema, list[int]]:
    """The index entry, the schema (fields that some records lack are optional) and the rows of
    each record of a shard of any origin, read once from ``stream``: a plain tar whose members
    group into records by key (``0001.jpg`` + ``0001.cls``, or our ``.msgpack``). The end of the
    archive may be followed by zero padding (tar pads to its blocking factor), nothing else."""
    reader = HashingReader(stream)
    scan = _Scan(url, optional=True)
    for walked in walk_shard(reader, url):  # type: ignore[arg-type]  (read to its end: see iter_members)
        scan.add(walked)
    return scan.entry(reader.size, reader.sha.hexdigest()), scan.inference.schema(), scan.rows


def record_schema(fields: Mapping[str, Any], rows: int) -> Schema:
    """Field specs of one decoded record, per sample: a packed record's columns (arrays with a
    leading axis of ``rows``, or lists of ``rows`` values) describe each of their rows."""
    packed = ROWS_FIELD in fields
    schema: Schema = {}
    for name, value in fields.items():
        if name in _RESERVED:
            continue
        if not packed:
            schema[name] = spec_of(value)
        else:
            schema[name] = _list_spec(name, value) if isinstance(value, list) else spec_of(value, packed=True)
    return schema


def _layout(fields: Mapping[str, Any], rows: int) -> tuple | None:
    """What a record's schema depends on, cheap to compare: the rows, and each field's name,
    type, dtype and shape; ``None`` when a list column makes every value count."""
    layout: list[Any] = [rows]
    for name, value in fields.items():
        if name in _RESERVED:
            continue
        if isinstance(value, list):
            return None
        layout.append((name, type(value), getattr(value, "dtype", None), getattr(value, "shape", None),
                       outside_int64(value)))  # (such an int makes the field's batches lists: see spec_of)
    return tuple(layout)


def _list_spec(name: str, values: list) -> FieldSpec:
    """One spec for the values of a list column, as the writer merges them sample by sample."""
    spec = spec_of(values[0])
    for value in values[1:]:
        spec = merge_spec(name, spec, spec_of(value), "a packed record")
    return spec
