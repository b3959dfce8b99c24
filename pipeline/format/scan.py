"""Read a finished shard back into its index entry and schema, without an index to compare with.

A resumed build uses this on the shards a killed run left: instead of writing a shard again,
it scans the file and keeps it when the result matches the plan. The entry is computed the way
the writer computes it (sha256 of the whole file, the byte offset and checksum of every record,
records and samples counted), so a kept shard's entry equals the one a fresh write would have produced.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from .codec import KEYS_FIELD, ROWS_FIELD
from .errors import IndexFormatError, SampleError, ShardError
from .index import FieldSpec, Schema, ShardInfo, merge_schema, merge_spec, spec_of
from .packing import record_rows
from .records import decode_fields, iter_records
from .shard_table import record_checksum
from .tar import END_OF_ARCHIVE, member_bytes


def scan_shard(data: bytes | memoryview, url: str) -> tuple[ShardInfo, Schema]:
    """The index entry (``ShardInfo`` named ``url``) and the field schema of a shard held in
    ``data`` (e.g. a mapped file).

    Accepts exactly what this library's writer produces: records one after another, then the
    end-of-archive blocks and nothing else. Anything else (a truncated member, a record that
    does not decode, fields that differ between records, missing or extra trailing bytes)
    raises :class:`ShardError` naming the byte offset.
    """
    view = memoryview(data).cast("B")
    offsets: list[int] = []
    checksum: list[int] = []
    samples = 0
    schema: Schema | None = None
    end = 0
    seen: set[tuple] = set()  # layouts of records already in the schema: most records repeat one
    for record in iter_records(view, url):
        fields = decode_fields(record, url)
        try:
            rows = record_rows(fields)
            layout = _layout(fields, rows)
            if layout is None or layout not in seen:
                schema = merge_schema(schema, record_schema(fields, rows), f"record {record.key!r}")
                if layout is not None:
                    seen.add(layout)
        except (SampleError, IndexFormatError) as exc:
            raise ShardError(url, record.offset, str(exc)) from None
        offsets.append(record.offset)
        checksum.append(record_checksum(record.members.values()))
        samples += rows
        end = record.offset + sum(member_bytes(len(member)) for member in record.members.values())
    if view[end:] != END_OF_ARCHIVE:
        raise ShardError(url, end, f"expected the {len(END_OF_ARCHIVE)} end-of-archive bytes after the last "
                         f"record and nothing else, found {len(view) - end} bytes")
    info = ShardInfo(url, samples, len(offsets), len(view), hashlib.sha256(view).hexdigest(), offsets, checksum)
    return info, schema or {}


def record_schema(fields: Mapping[str, Any], rows: int) -> Schema:
    """Field specs of one decoded record, per sample: a packed record's columns (arrays with a
    leading axis of ``rows``, or lists of ``rows`` values) describe each of their rows."""
    packed = ROWS_FIELD in fields
    schema: Schema = {}
    for name, value in fields.items():
        if name in (ROWS_FIELD, KEYS_FIELD):
            continue
        if not packed:
            schema[name] = spec_of(value)
            continue
        if _rows_of(value) != rows:
            raise SampleError(f"packed column {name!r} does not hold the record's {rows} rows")
        schema[name] = _list_spec(name, value) if isinstance(value, list) else spec_of(value, packed=True)
    return schema


def _layout(fields: Mapping[str, Any], rows: int) -> tuple | None:
    """What a record's schema depends on, cheap to compare: the rows, and each field's name,
    type, dtype and shape; ``None`` when a list column makes every value count."""
    layout: list[Any] = [rows]
    for name, value in fields.items():
        if name in (ROWS_FIELD, KEYS_FIELD):
            continue
        if isinstance(value, list):
            return None
        layout.append((name, type(value), getattr(value, "dtype", None), getattr(value, "shape", None)))
    return tuple(layout)


def _rows_of(column: Any) -> int | None:
    try:
        return len(column)
    except TypeError:  # a scalar, or an array of no dimension
        return None


def _list_spec(name: str, values: list) -> FieldSpec:
    """One spec for the values of a list column, as the writer merges them sample by sample."""
    spec = spec_of(values[0])
    for value in values[1:]:
        spec = merge_spec(name, spec, spec_of(value), "a packed record")
    return spec
