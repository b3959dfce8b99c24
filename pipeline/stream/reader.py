"""Read samples out of shards as columns: rows of an indexed shard, or all of a foreign one.

Columns are what the rest of the reader works with: a NumPy array per field (rows on the
first axis) or, for values that are not equally shaped arrays, a list. Packed records already
are columns; unpacked records are stacked once per read, never per batch.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..format.codec import KEYS_FIELD, ROWS_FIELD
from ..format.errors import SampleError, ShardError
from ..format.index import Schema, ShardInfo
from ..format.packing import record_rows
from ..format.records import decode_fields, iter_records
from ..format.shard_table import check_record
from ..storage.opener import open_stream, read_range
from ..storage.retry import RetryPolicy, RetrySink

Columns = dict[str, Any]
_RESERVED = (ROWS_FIELD, KEYS_FIELD)


#: Samples at least this large stay separate arrays (views into the bytes read) until a batch
#: is gathered: one copy per sample instead of two.
LARGE_SAMPLE_BYTES = 16 << 10


def stack_values(values: Sequence[Any]) -> Any:
    """One column from per-sample values: an array if they are equally shaped arrays or
    numbers (except large arrays, kept as a list of views until batching), else the list."""
    first = values[0]
    if isinstance(first, np.ndarray) and first.nbytes >= LARGE_SAMPLE_BYTES:
        return list(values)
    if isinstance(first, (np.ndarray, np.generic, int, float, bool)):
        try:
            return np.stack(values) if isinstance(first, (np.ndarray, np.generic)) else np.asarray(values)
        except ValueError:
            return list(values)
    return list(values)


def concat_columns(parts: Sequence[Columns]) -> Columns:
    """Join column sets of consecutive rows."""
    if len(parts) == 1:
        return parts[0]
    out: Columns = {}
    for name in parts[0]:
        cols = [p[name] for p in parts]
        if all(isinstance(c, np.ndarray) for c in cols) and len({c.shape[1:] for c in cols}) == 1:
            out[name] = np.concatenate(cols)
        else:
            out[name] = [v for c in cols for v in c]
    return out


def assemble_columns(pieces: Iterable[Columns], rows: int) -> Columns:
    """Join consecutive column sets of ``rows`` rows in all, copying each piece into arrays
    allocated once: memory peaks at the result plus one piece, not at twice the result."""
    out: Columns = {}
    position = 0
    for piece in pieces:
        n = len(next(iter(piece.values())))
        for name, col in piece.items():
            target = out.get(name)
            if target is None and isinstance(col, np.ndarray) and position == 0:
                target = out[name] = np.empty((rows,) + col.shape[1:], col.dtype)
            if isinstance(target, np.ndarray) and isinstance(col, np.ndarray) \
                    and target.shape[1:] == col.shape[1:] and target.dtype == col.dtype:
                target[position:position + n] = col
                continue
            if isinstance(target, np.ndarray):  # shapes or dtypes vary: fall back to a list
                target = out[name] = list(target[:position])
            out.setdefault(name, []).extend(col)
        position += n
    if position != rows:
        raise ValueError(f"pieces hold {position} rows, expected {rows}")
    return out


def _record_columns(fields: dict[str, Any], url: str, offset: int, wanted: set[str] | None) -> tuple[Columns, int]:
    try:
        rows = record_rows(fields)
    except SampleError as exc:
        raise ShardError(url, offset, str(exc)) from None
    packed = ROWS_FIELD in fields
    columns = {}
    for name, value in fields.items():
        if name in _RESERVED or (wanted is not None and name not in wanted):
            continue
        if packed:
            try:
                length = len(value)
            except TypeError:
                length = None
            if length != rows:
                raise ShardError(url, offset, f"packed record: field {name!r} has {length} rows, expected {rows}")
            columns[name] = value
        else:
            columns[name] = [value]
    if wanted is not None and len(columns) != len(wanted):
        missing = sorted(wanted - set(columns))
        raise ShardError(url, offset, f"record lacks field(s) {missing}")
    return columns, rows


RangeReader = Callable[[str, int, int, ShardInfo], bytes | memoryview]


def _read_range(url: str, start: int, stop: int, shard: ShardInfo) -> bytes:
    return read_range(url, start, stop)


def read_rows(url: str, shard: ShardInfo, pack: int, row_start: int, row_stop: int,
              wanted: set[str] | None = None, reader: RangeReader = _read_range,
              schema: Schema | None = None, check_records: bool = True) -> Columns:
    """Rows ``[row_start, row_stop)`` of an indexed shard, with one ranged read (through
    ``reader``: a cache, for instance); every record must match the index's ``schema``."""
    first, last = row_start // pack, -(-row_stop // pack)
    start = int(shard.offsets[first])
    stop = int(shard.offsets[last]) if last < shard.records else shard.bytes
    data = reader(url, start, stop, shard)
    parts: list[Columns] = []
    singles: dict[str, list] = {}
    n_records = 0
    for record in iter_records(data, url, start, whole=False):  # members are views of data: no copies
        check_record(record, shard, first + n_records, url, check_records)
        columns, rows = _record_columns(decode_fields(record, url, schema), url, record.offset, wanted)
        expected = min(pack, shard.samples - (first + n_records) * pack)
        if rows != expected:
            raise ShardError(url, record.offset, f"record {record.key!r} holds {rows} rows, the index says {expected}")
        n_records += 1
        if pack == 1:
            for name, col in columns.items():
                singles.setdefault(name, []).append(col[0])
        else:
            parts.append(columns)
        if n_records == last - first:
            break  # the range ends here: do not look for a next header
    if n_records != last - first:
        raise ShardError(url, start, f"expected {last - first} records from here (as the index says), found {n_records}")
    if pack == 1:
        return {name: stack_values(values) for name, values in singles.items()}
    columns = concat_columns(parts)
    skip = row_start - first * pack
    n = row_stop - row_start
    return {name: col[skip:skip + n] for name, col in columns.items()}


def iter_foreign_rows(url: str, wanted: set[str] | None = None, fields: set[str] | None = None, *,
                      policy: RetryPolicy | None = None, stats: RetrySink | None = None) -> Iterator[Columns]:
    """Every record of a shard without an index, as columns (one row, or a packed record's rows);
    all with the same ``fields`` (by default those of the first record) so that they collate.
    The shard is streamed under ``policy``, its retries reported to ``stats``."""
    with open_stream(url, policy, stats=stats) as stream:
        for record in iter_records(stream, url):
            columns = _record_columns(decode_fields(record, url), url, record.offset, wanted)[0]
            fields = set(columns) if fields is None else fields
            if columns.keys() != fields:
                raise ShardError(url, record.offset, f"record {record.key!r} has fields {sorted(columns)}, "
                                 f"earlier records {sorted(fields)}")
            yield columns
