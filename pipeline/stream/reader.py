"""Read samples out of shards as columns: rows of an indexed shard, or all of a foreign one.

Columns are what the rest of the reader works with: a NumPy array per field (rows on the
first axis) or, for values that are not equally shaped arrays, a list. Packed records already
are columns; unpacked records are stacked once per read, never per batch.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..format.codec import KEYS_FIELD, ROWS_FIELD
from ..format.compressed import open_archive
from ..format.errors import ShardError
from ..format.fixed_runs import RunLayouts
from ..format.index import Schema, ShardInfo
from ..format.numbers import inexact_int, joins_exactly
from ..format.packing import SAMPLE_KEY, sample_keys
from ..format.tar import BLOCK
from ..format.walk import WalkedRecord, walk_shard
from ..storage import redact
from ..storage.buffers import pooled_concatenate, pooled_stack
from ..storage.errors import CutShort
from ..storage.opener import open_stream, read_range
from ..storage.retry import RetryPolicy, RetrySink
from .shared_memory import SharedNumber

Columns = dict[str, Any]
_RESERVED = frozenset((ROWS_FIELD, KEYS_FIELD))
log = logging.getLogger("pipeline.stream")


#: Samples at least this large stay separate arrays (views into the bytes read) until a batch
#: is gathered: one copy per sample instead of two.
LARGE_SAMPLE_BYTES = 16 << 10


def stack_values(values: Sequence[Any], one_type: bool = True) -> Any:
    """One column from per-sample values: an array if they are equally shaped arrays of one
    dtype (stacked, an int64 beside a float32 would become a float64: another number), or numbers
    an array holds exactly, of one type (with ``one_type`` false, ints beside floats too: a stream
    without an index, which has no field of several types to keep them in) (except large arrays,
    kept as a list of views until batching), else the list."""
    first = values[0]
    if isinstance(first, np.ndarray) and first.nbytes >= LARGE_SAMPLE_BYTES:
        return list(values)
    if isinstance(first, (np.ndarray, np.generic)):
        if any(getattr(v, "dtype", None) != first.dtype for v in values):
            return list(values)
        try:
            return pooled_stack(values)
        except ValueError:
            return list(values)
    if isinstance(first, (int, float)):  # bool is an int
        if one_type and len(set(map(type, values))) > 1:  # an int beside a float would become a float
            return list(values)
        numbers = np.asarray(values)  # (uint64 where every int is >= 0 and one no int64 holds: no tensor's)
        exact = numbers.dtype.kind in "bif" and inexact_int(values, numbers) is None
        return numbers if exact else list(values)
    return list(values)


def concat_columns(parts: Sequence[Columns]) -> Columns:
    """Join column sets of consecutive rows."""
    if len(parts) == 1:
        return parts[0]
    out: Columns = {}
    for name in parts[0]:
        cols = [p[name] for p in parts]
        if all(isinstance(c, np.ndarray) for c in cols) and len({c.shape[1:] for c in cols}) == 1 \
                and joins_exactly(cols):
            out[name] = pooled_concatenate(cols)
        else:
            out[name] = [v for c in cols for v in c]
    return out


def _record_columns(walked: WalkedRecord, wanted: set[str] | None, fill: Mapping[str, Any]) -> Columns:
    """The columns of one checked record: ``wanted`` fields (all by default; ``"__key__"``, the
    samples' keys, only when wanted), a field the record lacks filled with ``fill``'s value for
    it (else ``None``), one per row."""
    fields, rows = walked.fields, walked.rows
    packed = ROWS_FIELD in fields
    columns = {}
    for name, value in fields.items():
        if name in _RESERVED or (wanted is not None and name not in wanted):
            continue
        columns[name] = value if packed else [value]
    if wanted is not None and SAMPLE_KEY in wanted:  # (the walk checked a packed record's keys)
        columns[SAMPLE_KEY] = sample_keys(walked.key, fields)
    for name in (wanted or ()):
        if name not in columns:
            value = fill.get(name)  # a copy for each row: a transform may change one in place
            columns[name] = [value.copy() if isinstance(value, np.ndarray) else value for _ in range(rows)]
    return columns


#: Reads bytes ``[start, stop)`` of a shard (its URL and index entry given): a cache, say.
RangeReader = Callable[[str, int, int, ShardInfo], bytes | memoryview]
#: Told of a record left out (it failed its checks) and the samples lost with it, instead of raising.
LostRecordHandler = Callable[[ShardError, int], None]


def _read_range(url: str, start: int, stop: int, shard: ShardInfo) -> bytes:
    return read_range(url, start, stop)


def repeat_rows(columns: Columns, rows: int, first: int = 0) -> Columns:
    """``rows`` rows taken cyclically from ``columns``, from row ``first`` on."""
    index = (first + np.arange(rows)) % len(next(iter(columns.values())))
    return {name: col[index] if isinstance(col, np.ndarray) else [col[i] for i in index]
            for name, col in columns.items()}


def stand_in(parts: Sequence[Columns | int]) -> Columns | None:
    """Consecutive parts as one set of columns, each lost part (a number: its rows) replaced in
    place by as many rows of the parts read (so that every row keeps its place); ``None`` when
    every part was lost. What the skip policy delivers for damage: stand-ins, counted."""
    good = [part for part in parts if not isinstance(part, int)]
    if not good:
        return None
    if len(good) == len(parts):
        return concat_columns(good)
    pool = concat_columns(good)
    out, taken = [], 0
    for part in parts:
        if isinstance(part, int):
            if part:
                out.append(repeat_rows(pool, part, taken))
                taken += part
        else:
            out.append(part)
    return concat_columns(out)


class _RowCollector:
    """The rows ``[row_start, row_stop)`` of a run of records of ``pack`` rows, as columns, the
    rows of records left out marked as lost (for :func:`stand_in`)."""

    def __init__(self, shard: ShardInfo, pack: int, row_start: int, row_stop: int) -> None:
        self.shard, self.pack, self.row_start, self.row_stop = shard, pack, row_start, row_stop
        self.singles: dict[str, list] = {}
        self.parts: list[Columns | int] = []

    def wanted_rows(self, number: int) -> slice:
        """Which rows of record ``number`` fall in the range."""
        first = number * self.pack
        rows = min(self.pack, self.shard.samples - first)
        return slice(max(self.row_start - first, 0), min(self.row_stop - first, rows))

    def add(self, columns: Columns, number: int) -> None:
        if self.pack == 1:
            for name, column in columns.items():
                self.singles.setdefault(name, []).append(column[0])
            return
        rows = self.wanted_rows(number)
        self.parts.append({name: column[rows] if isinstance(column, np.ndarray) else stack_values(column[rows])
                           for name, column in columns.items()})

    def lose(self, rows: int) -> None:
        self._flush()
        self.parts.append(rows)

    def _flush(self) -> None:
        if self.singles:
            self.parts.append({name: stack_values(values) for name, values in self.singles.items()})
            self.singles = {}

    def columns(self) -> Columns | None:
        """The rows read, lost ones stood in for; ``None`` when every record was lost."""
        return stand_in(self.unjoined()) if self.parts or self.singles else {}

    def unjoined(self) -> list[Columns | int]:
        """The rows read as the parts :func:`stand_in` joins: records' columns, lost rows' counts."""
        self._flush()
        return self.parts


def _read_to_the_end(reader: RangeReader, url: str, start: int, stop: int, shard: ShardInfo,
                     last: bool) -> bytes | memoryview:
    """Bytes ``[start, stop)`` of the shard (its records are views of them: no copies). A range
    that takes in the shard's last record ends with the tar's end-of-archive blocks, which hold
    no data: a shard cut short only there (written by a tool that stopped before them, or cut
    in a copy) is read to where it ends, when its last record is whole in what is there."""
    try:
        return reader(url, start, stop, shard)
    except CutShort as exc:
        if not last or exc.offset is None or exc.offset <= start:
            raise
        end, reason = exc.offset, exc.reason
    data = reader(url, start, end, shard)
    if not _last_record_whole(memoryview(data), url, start, end, shard):
        raise CutShort(url, end, reason)  # (a new error: one kept in a local here would be a cycle)
    return data


def _last_record_whole(view: memoryview, url: str, start: int, end: int, shard: ShardInfo) -> bool:
    """Whether the shard's last record ends in ``view`` (its bytes from ``start`` to ``end``).
    A cut inside the end-of-archive blocks leaves part of a block, which no member fits in: the
    walk ends at the last whole block (else it read that part as a header cut short)."""
    offset = int(shard.offsets[shard.records - 1])
    blocks = (end - offset) // BLOCK * BLOCK
    try:
        walked = next(walk_shard(view[offset - start:offset - start + blocks], url, start=offset,
                                 first_record=shard.records - 1, whole=False, checksums=False, records=1))
    except (ShardError, StopIteration):
        return False
    return walked.end <= end


def read_rows(url: str, shard: ShardInfo, pack: int, row_start: int, row_stop: int,
              wanted: set[str] | None = None, reader: RangeReader = _read_range,
              schema: Schema | None = None, check_records: bool = True,
              fill: Mapping[str, Any] | None = None, on_lost: LostRecordHandler | None = None,
              join: bool = True, layouts: RunLayouts | None = None) -> Columns | list[Columns | int] | None:
    """Rows ``[row_start, row_stop)`` of an indexed shard, with one ranged read (through
    ``reader``: a cache, for instance); every record is checked against the index (its start,
    its checksum unless ``check_records`` is false, its rows, the ``schema``), and a field a
    record lacks is filled in from ``fill`` (else ``None``). A record that fails raises, or with
    ``on_lost`` is reported and stood in for in place by rows read (see :func:`stand_in`), the
    others read on from where the index says they start: damage costs the damaged record only.
    ``None`` when every record of the range was lost. With ``join`` false, the records' columns
    and lost rows are left as parts for :func:`stand_in` (that of a larger read, joining pieces
    of many ranges, then copies each row once, not twice). ``layouts``: what this reader learnt of
    records laid out alike (:mod:`pipeline.format.fixed_runs`), to check runs of them in bulk."""
    if wanted is None and schema:  # every field of the schema, filled in where a record lacks it
        wanted = set(schema)
    first, last = row_start // pack, -(-row_stop // pack)
    start = int(shard.offsets[first])
    stop = int(shard.offsets[last]) if last < shard.records else shard.bytes
    view = memoryview(_read_to_the_end(reader, url, start, stop, shard, last == shard.records))
    if layouts is not None:
        if not layouts.tried:
            _learn_first(layouts, view, url, shard, pack, first, schema, check_records)
        fixed = _fixed_run(layouts, view, shard, pack, first, last, row_start, row_stop, wanted, check_records)
        if fixed is not None:
            return stand_in(fixed) if join else fixed
    learn = layouts is not None
    collector = _RowCollector(shard, pack, row_start, row_stop)
    done = first  # the records before this one are read, or reported lost

    def lose(exc: ShardError, number: int) -> None:
        nonlocal done
        if on_lost is None:
            raise exc
        rows = collector.wanted_rows(number)
        on_lost(exc, rows.stop - rows.start)
        collector.lose(rows.stop - rows.start)
        done = number + 1

    one_by_one = False  # after the tar structure broke: each record walked in the bytes the index gives it
    while done < last:
        attempt, at = done, int(shard.offsets[done])
        until = stop if not one_by_one else int(shard.offsets[done + 1]) if done + 1 < shard.records else shard.bytes
        try:
            for walked in walk_shard(view[at - start:until - start], url, start=at, first_record=done, whole=False,
                                     schema=schema, entry=shard, checksums=check_records,
                                     records=1 if one_by_one else last - done, on_bad_record=lose):
                expected = min(pack, shard.samples - walked.number * pack)
                if walked.rows != expected:
                    lose(ShardError(url, walked.offset, f"record {walked.key!r} holds {walked.rows} rows, "
                                                        f"the index says {expected}"), walked.number)
                    continue
                collector.add(_record_columns(walked, wanted, fill or {}), walked.number)
                if learn:  # the first record walked here shows how the next runs may be laid out
                    layouts.learn(walked, view[walked.offset - start:walked.end - start])  # type: ignore[union-attr]
                    learn = False
                done = walked.number + 1
            missing = done == attempt if one_by_one else done < last  # the bytes ran out before the record
            if missing:
                raise ShardError(url, int(shard.offsets[done]), f"no record {done} where the index says it starts")
        except ShardError as exc:
            if on_lost is None:
                raise
            if not one_by_one:  # a record is yielded once the next one's header is read: the one
                one_by_one = True  # before the break may be sound, so walk again from the first not done
                continue
            lose(exc, done)
    return collector.columns() if join else collector.unjoined()


def _learn_first(layouts: RunLayouts, view: memoryview, url: str, shard: ShardInfo, pack: int, first: int,
                 schema: Schema | None, check_records: bool) -> None:
    """Learn the layout of record ``first`` (the first in ``view``), walked with the checks the
    range gets (its checksum unless ``check_records`` is false), before a source's first range
    is read: else that range is walked a record at a time, learnt from only as it starts, and a
    mix of many sets pays a walked range for each of them (200 sets of 500 samples: 11,000
    records walked, a tenth of the epoch). A record that fails is left to the walk that reads
    the range, which says what is wrong."""
    layouts.tried = True
    at = int(shard.offsets[first])
    until = int(shard.offsets[first + 1]) if first + 1 < shard.records else shard.bytes
    try:
        walked = next(walk_shard(view[:until - at], url, start=at, first_record=first, whole=False, schema=schema,
                                 entry=shard, checksums=check_records, records=1))
    except (ShardError, StopIteration):
        return
    if walked.rows == min(pack, shard.samples - first * pack):
        layouts.learn(walked, view[walked.offset - at:walked.end - at])


def _fixed_run(layouts: RunLayouts, view: memoryview, shard: ShardInfo, pack: int, first: int, last: int,
               row_start: int, row_stop: int, wanted: set[str] | None, check_records: bool) -> list[Columns] | None:
    """Rows ``[row_start, row_stop)`` (of records ``[first, last)``, which are in ``view``) as parts for
    :func:`stand_in`, if their records form a run of a layout learnt, every check passed in bulk
    (the rows of each as the index says); ``None`` when they are to be walked."""
    if not layouts.by_size:
        return None
    base = int(shard.offsets[first])
    starts = np.asarray(shard.offsets[first:last], np.int64) - base
    checksums = np.asarray(shard.checksum[first:last]) if check_records else None
    run = layouts.read(view, starts, checksums)
    if run is None or (wanted is not None and not wanted <= run[1].keys()):
        return None
    layout, found = run
    if {min(pack, shard.samples - number * pack) for number in (first, last - 1)} != {layout.rows}:
        return None  # records of other rows than the index says (fewer from one on: the ends tell): the walk says which
    fields = {name: column for name, column in found.items() if wanted is None or name in wanted}
    if pack == 1:  # one part: large samples as views each, until their batch is gathered
        fields = {name: column[:, 0] for name, column in fields.items()} if layout.packed else fields
        return [{name: list(column) if column.nbytes >= LARGE_SAMPLE_BYTES * len(column) else column
                 for name, column in fields.items()}]
    lo, hi = row_start - first * pack, row_stop - (last - 1) * pack  # of the first and the last record
    return [{name: column[i, lo if i == 0 else 0:hi if i == len(starts) - 1 else pack]
             for name, column in fields.items()} for i in range(len(starts))]


class _TimedReads:
    """A stream that reports the seconds each read waited (the storage part of a profile)."""

    def __init__(self, stream: Any, on_wait: Callable[[float], None]) -> None:
        self.stream, self.on_wait = stream, on_wait

    def read(self, size: int = -1) -> bytes:
        started = time.perf_counter()
        try:
            return self.stream.read(size)
        finally:
            self.on_wait(time.perf_counter() - started)


def iter_foreign_rows(url: str, wanted: set[str] | None = None, fields: set[str] | None = None, *,
                      policy: RetryPolicy | None = None, stats: RetrySink | None = None,
                      fill: Mapping[str, Any] | None = None, on_lost: LostRecordHandler | None = None,
                      on_wait: Callable[[float], None] | None = None,
                      told: SharedNumber | None = None) -> Iterator[Columns]:
    """Every record of a shard without an index (a plain tar, or one gzip-compressed), as
    columns (one row, or a packed record's rows), with the ``fields`` given (by default those of
    the first record; a record that lacks one has it filled from ``fill``, else ``None``). The
    shard is streamed under ``policy``, its retries reported to ``stats``. A record that fails
    its own checks raises, or with ``on_lost`` costs that record only; a broken tar structure
    ends the shard (without an index, nothing after it can be found). ``on_wait`` is told the
    seconds each read of the shard's bytes took. A record with fields that are not read is
    warned of, unless ``told`` (the dataset's mark, which its workers share) says one was."""
    def lost(exc: ShardError, number: int) -> None:
        if on_lost is None:
            raise exc
        on_lost(exc, 1)

    with open_stream(url, policy, stats=stats) as raw:
        stream = open_archive(raw if on_wait is None else _TimedReads(raw, on_wait), url)  # type: ignore[arg-type]
        unread = wanted is None  # fields not chosen: tell of a record's fields that are not read (once a shard)
        for walked in walk_shard(stream, url, on_bad_record=lost):
            if fields is None:
                fields = _first_fields(walked, wanted, fill or {}, url)
            if unread and walked.fields.keys() - fields - _RESERVED:
                unread = False
                _log_unread(url, walked.key, sorted(walked.fields.keys() - fields - _RESERVED), sorted(fields), told)
            yield _record_columns(walked, fields, fill or {})  # (the walk reads to the end, where a gzip-compressed
            # shard checks its checksum)


def _log_unread(url: str, key: str, unread: list[str], fields: list[str], told: SharedNumber | None) -> None:
    """Tell that record ``key`` of the shard at ``url`` has fields that are not read: a warning the
    first time a dataset's processes meet such a record (``told`` is 0), DEBUG after that (every
    shard of a set, read every epoch by workers started anew, would tell it again, for ever)."""
    first = told is None or not told.get()
    if told is not None:
        told.set(1)
    log.log(logging.WARNING if first else logging.DEBUG,
            "%s: record %r has fields %s that are not read (the fields read are %s, those of the shards' first "
            "record): pass fields= naming every field, and fill= a value for the records without one, to read "
            "them%s", redact(url), key, unread, fields,
            "; other records with fields that are not read are logged at DEBUG level" if first else "")


def _first_fields(walked: WalkedRecord, wanted: set[str] | None, fill: Mapping[str, Any], url: str) -> set[str]:
    """The fields of a stream without an index: those of its first record, or ``wanted``, of
    which the first record must hold those that ``fill`` has no value for (a name misspelt would
    otherwise be a column of ``None``)."""
    found = set(walked.fields) - set(_RESERVED)
    if wanted is None:
        return found
    absent = sorted(wanted - found - set(fill) - {SAMPLE_KEY})
    if absent:
        raise ShardError(url, walked.offset, f"the first record, {walked.key!r}, has no field {absent} (it has "
                                             f"{sorted(found)}): check fields=, or give fill= a value for them")
    return set(wanted)
