"""Tables as sources: Parquet files, Arrow IPC files and streams, ``datasets.save_to_disk`` folders.

A row is a sample and a column a field (see :mod:`.table_columns` for how each Arrow type is
stored). The choices that matter:

- **Bounded memory.** A Parquet row group or an Arrow record batch may hold gigabytes, so
  neither is read whole. Parquet is decoded a batch of rows at a time (``iter_batches`` over one
  row group, with read buffering and no pre-buffering of column chunks), and a read that starts
  where the last one ended continues the same decoder. Parquet cannot seek inside a row group, so
  a task that starts inside one decodes the rows before its start: files of many row groups
  spread better over workers than files of a few huge ones. Arrow IPC files are memory-mapped afresh
  for each read and only the rows read are touched; the mapping goes with the block that uses it,
  so its pages do not stay in the process's memory.
- **Small tasks.** A source pickles as its paths, its columns and a table of row groups (or
  record batches) with their row counts; a window keeps only the entries it covers. Files are
  reopened in the worker process.
- **Errors before writing.** Opening checks that every file has the same columns of the same
  types, that each column's type can be stored and its name is a valid field name, and looks for
  nulls where it costs no data read (Parquet statistics, the null counts of Arrow batches).
  Every read checks its rows for nulls as well; an error names the file, the column and the rows.

Arrow IPC files are in :mod:`.table_arrow`. Needs pyarrow (``pip install 'pipeline[parquet]'``).
"""

from __future__ import annotations

import bisect
import copy
import functools
import os
import shlex
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:
    raise ImportError("reading Parquet and Arrow files needs pyarrow: pip install 'pipeline[parquet]'") from None

from ...format.codec import check_field_names
from ...format.errors import SampleError
from ..rows import RowBlock
from ..source import Source, span_identity
from .table_columns import RAGGED, column_kinds, fill_value, packable, signature, to_columns
from .table_features import array_shapes, class_names, features_differ
from .table_files import Inputs, parquet_files
from .table_nulls import FileNulls
from .unchanged import check_unchanged, file_version

#: Rows decoded at once from a Parquet row group: about this many bytes of them (a read of a build,
#: about 16 MB, spans a few batches; larger batches only take more memory).
BATCH_BYTES = 4 << 20
#: How much of a Parquet column chunk is fetched at a time (rather than the whole chunk).
READ_BUFFER = 1 << 20

class Unit(NamedTuple):
    """A row group (Parquet) or a record batch (Arrow) of one file."""

    file: int  # position in the source's paths
    locator: int  # row group number; record batch number (IPC file) or its message's byte offset (IPC stream)
    first_row: int  # in its file
    rows: int


class Piece(NamedTuple):
    """Rows read from one unit: where they come from (for errors) and the rows."""

    path: Path
    first_row: int
    batch: pa.RecordBatch


class TableSource(Source):
    """Rows of tables in one or more files with the same schema; see the module docstring.
    Subclasses read the units of their format."""

    kind = "table"

    def __init__(self, inputs: Inputs, columns: Sequence[str] | None = None,
                 fill: Mapping[str, Any] | None = None) -> None:
        if isinstance(columns, str):  # (each letter would be taken for a column)
            raise TypeError(f"columns= takes a list of column names, e.g. columns={columns.split(',')!r}; got "
                            f"{columns!r}")
        self.__dict__.update(self.open_state())
        self.paths = [Path(p) for p in self.files(inputs)]  # Paths: made absolute for a cluster's workers
        self.versions = [file_version(path) for path in self.paths]  # (see .unchanged)
        first = self.schema(self.paths[0])
        self.columns = self._select(first, columns)
        self.shapes = array_shapes(first, self.columns)
        self.kinds = column_kinds(first, self.columns, self.paths[0], self.shapes)
        self.metadata = class_names(first, self.columns)
        self.fill = {}
        for name, value in (fill or {}).items():
            if name not in self.kinds:
                raise SampleError(f"a fill is given for column {name!r}, which is not among the columns read: "
                                  f"{', '.join(self.columns)}")
            self.fill[name] = fill_value(name, first.field(name).type, value)
        for path in self.paths[1:]:
            self._check_same_schema(first, self.schema(path), path, all_columns=columns is None)
        self.units: list[Unit] = []
        data_bytes = 0
        for number, path in enumerate(self.paths):
            for unit, unit_bytes in self.scan(number, path):
                self.units.append(unit)
                data_bytes += unit_bytes
        self._starts = np.cumsum([0] + [unit.rows for unit in self.units]).tolist()
        self._skip, self._rows = 0, self._starts[-1]
        self._row_bytes = max(data_bytes // max(self._rows, 1), 1)
        self.fixed_shape = packable(self.kinds)
        many = f" and {len(self.paths) - 1} more files" if len(self.paths) > 1 else ""
        self.description = f"{self.kind} {self.paths[0]}{many}"

    # -- what a format provides

    def files(self, inputs: Inputs) -> list[Path]:
        """The files of ``inputs``, folders expanded."""
        raise NotImplementedError

    def schema(self, path: Path) -> pa.Schema:
        """The file's schema, read from its metadata."""
        raise NotImplementedError

    def scan(self, number: int, path: Path) -> Iterator[tuple[Unit, int]]:
        """The file's units and their bytes (of the columns read), refusing nulls seen on the way."""
        raise NotImplementedError

    def read_unit(self, unit: Unit, lo: int, hi: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        """Rows ``[lo, hi)`` of ``unit`` as batches, each with the unit's row number of its first row."""
        raise NotImplementedError

    # -- the source

    def __len__(self) -> int:
        return self._rows

    def approx_row_bytes(self) -> int:
        return self._row_bytes

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, **self.open_state()}  # open files stay in the process that opened them

    def open_state(self) -> dict[str, Any]:
        """The attributes that hold open files, as a fresh source has them."""
        return {}

    def read(self, start: int, stop: int) -> RowBlock:
        start, stop = start + self._skip, stop + self._skip
        pieces = []
        i = bisect.bisect_right(self._starts, start) - 1
        while start < stop:
            unit = self.units[i]
            lo, hi = start - self._starts[i], min(stop, self._starts[i + 1]) - self._starts[i]
            for offset, batch in self.read_unit(unit, lo, hi):
                pieces.append(Piece(self.paths[unit.file], unit.first_row + offset, batch))
            start = self._starts[i] + hi
            i += 1
        blocks = []
        for piece in pieces:  # joined once converted: the files' types may differ in what changes nothing
            nulls = FileNulls(piece.path, self.columns, self.fill)
            nulls.add(piece.first_row, piece.batch)
            nulls.refuse()
            blocks.append(RowBlock(to_columns(piece.path, piece.first_row, piece.batch, self.kinds, self.fill,
                                              self.shapes)))
        return RowBlock.concat(blocks)

    def identity(self, digest: Any, start: int, stop: int) -> None:
        """Each row group's (batch's) file and place in it. A file is named by its path under the
        folder all inputs lie in (the base name alone took one partition's ``part-0.parquet``
        for another's, and a resume kept shards of other rows), and its size and time: a file
        written again is new rows, however many."""
        def name_of(i: int) -> tuple[str, int, int, int]:
            file = self.units[i].file
            return self._names_in_plan[file], self.versions[file].size, self.versions[file].mtime_ns // 10**9, \
                self.units[i].locator
        span_identity(digest, self._starts, name_of, start + self._skip, stop + self._skip)

    @functools.cached_property
    def _names_in_plan(self) -> list[str]:
        """The files' names in a plan (see :func:`_plan_names`): once, not for each shard planned."""
        return _plan_names(self.paths)

    def why_shapes_vary(self, field: str) -> str:
        if field not in self.fill or self.kinds[field] != RAGGED:
            return ""
        return (f" (a null of a column of lists of any length, as {field!r} is, is filled with an empty list: cast "
                f"the column to lists of one length, pyarrow.list_(type, length), to fill a null with that many "
                f"copies of its fill)")

    def place(self, row: int) -> tuple[str, str]:
        """The file of ``row`` and its row there."""
        row += self._skip
        i = bisect.bisect_right(self._starts, row) - 1
        unit = self.units[i]
        return str(self.paths[unit.file]), f"row {unit.first_row + row - self._starts[i]} (counting from 0 in the file)"

    def window(self, start: int, stop: int) -> Source:
        """Rows ``[start, stop)``: the same files, only the units that hold those rows."""
        first = bisect.bisect_right(self._starts, start + self._skip) - 1
        last = bisect.bisect_left(self._starts, stop + self._skip)
        window = copy.copy(self)
        window.__dict__.update(self.open_state())
        window.units = self.units[first:last]
        window._starts = [s - self._starts[first] for s in self._starts[first:last + 1]]
        window._skip, window._rows = start + self._skip - self._starts[first], stop - start
        return window

    # -- checks

    def _select(self, schema: pa.Schema, columns: Sequence[str] | None) -> list[str]:
        names = schema.names
        repeated = sorted({name for name in names if names.count(name) > 1})
        chosen = list(names if columns is None else columns)
        if repeated and set(repeated) & set(chosen):
            raise SampleError(f"{self.paths[0]}: several columns are named {repeated[0]!r}; leave them out with "
                              f"--columns (columns=[...] in Python)")
        unknown = [name for name in chosen if name not in names]
        if unknown:
            raise SampleError(f"{self.paths[0]} has no column {unknown[0]!r}; its columns are: {', '.join(names)}")
        if not chosen or len(set(chosen)) != len(chosen):
            raise SampleError(f"columns {chosen}: choose at least one column, each once")
        for name in chosen:
            try:
                check_field_names({name: None}, name)
            except SampleError:
                others = shlex.quote(",".join(n for n in chosen if n != name))
                raise SampleError(
                    f"{self.paths[0]}: column {name!r} cannot be a field name (names starting with '__' are "
                    f"reserved, and a name cannot be empty): rename it, or leave it out with --columns {others} "
                    f"(columns=[...] in Python)") from None
        return chosen

    def _check_same_schema(self, first: pa.Schema, schema: pa.Schema, path: Path, all_columns: bool) -> None:
        for name in self.columns:
            if name not in schema.names:
                raise SampleError(f"{path} has no column {name!r}, which {self.paths[0]} has; every file needs "
                                  f"the same columns")
            theirs, ours = schema.field(name).type, first.field(name).type
            if signature(theirs) != signature(ours):
                raise SampleError(f"column {name!r} is {theirs} in {path} but {ours} in {self.paths[0]}; every "
                                  f"file needs the same column types (--dtype casts what is read, after this "
                                  f"check): write the files again with one type (pandas: "
                                  f"df[{name!r}].astype(...); pyarrow: table.cast(schema)), or build each set of "
                                  f"files alike on its own")
        differ = features_differ(schema, self.columns, self.metadata, self.shapes)
        if differ:
            raise SampleError(f"{path}: its datasets features give {differ[0]}, {self.paths[0]} {differ[1]}; every "
                              f"file needs the same, or build each set of files alike on its own")
        extra = [name for name in schema.names if name not in self.columns]
        if all_columns and extra:
            raise SampleError(f"{path} has column {extra[0]!r}, which {self.paths[0]} has not; every file needs "
                              f"the same columns (or choose some with --columns)")


def _plan_names(paths: Sequence[Path]) -> list[str]:
    """The files' paths under the folder they all lie in (a file alone: its name), the same
    wherever that folder is moved."""
    if len(paths) == 1:
        return [paths[0].name]
    common = os.path.commonpath([os.path.abspath(path) for path in paths])
    return [os.path.relpath(os.path.abspath(path), common) for path in paths]


class _Cursor:
    """Where a Parquet decoder stands in a row group: its current batch and the row it starts at."""

    def __init__(self, unit: Unit, batches: Iterator[pa.RecordBatch]) -> None:
        self.unit, self.batches, self.start = unit, batches, 0
        self.batch = next(batches)

    def advance(self, path: Path) -> None:
        self.start += self.batch.num_rows
        try:
            self.batch = next(self.batches)
        except StopIteration:
            raise SampleError(f"{path}: row group {self.unit.locator} ends at row {self.unit.first_row + self.start}, "
                              f"its metadata says {self.unit.rows} rows (did the file change?)") from None


class ParquetSource(TableSource):
    """Parquet files, or folders of ``*.parquet`` files (in name order)."""

    kind = "parquet"

    def files(self, inputs: Inputs) -> list[Path]:
        return parquet_files(inputs)

    def schema(self, path: Path) -> pa.Schema:
        return _parquet_file(path).schema_arrow

    def open_state(self) -> dict[str, Any]:
        return {"_cursor": None, "_open": None}

    def _file(self, number: int) -> pq.ParquetFile:
        if self._open is None or self._open[0] != number:
            self._open = (number, _parquet_file(self.paths[number], pre_buffer=False, buffer_size=READ_BUFFER))
            check_unchanged(self.paths[number], self.versions[number])
        return self._open[1]

    def _batches(self, number: int, row_group: int, columns: list[str], row_bytes: int) -> Iterator[pa.RecordBatch]:
        return _decoded(self.paths[number], self._file(number).iter_batches(
            max(BATCH_BYTES // row_bytes, 1), row_groups=[row_group], columns=columns))

    def scan(self, number: int, path: Path) -> Iterator[tuple[Unit, int]]:
        # statistics count empty lists as nulls: trust them for columns without variable-length lists; those are
        # read here only in a file with nulls found, to name them in the same error (else the build finds them)
        unfilled = [name for name in self.columns if name not in self.fill]
        watched = [name for name in unfilled if self.kinds[name] != RAGGED]
        metadata = _parquet_file(path).metadata
        nulls = _null_counts(metadata, watched)
        groups = []  # (row group, its first row, its bytes, its columns that may hold nulls)
        first_row = 0
        for group in range(metadata.num_row_groups):
            meta = metadata.row_group(group)
            data_bytes, maybe = 0, set()
            for leaf in map(meta.column, range(meta.num_columns)):
                where = leaf.path_in_schema
                name = next((n for n in self.columns if where == n or where.startswith(f"{n}.")), None)
                if name is None:
                    continue
                data_bytes += leaf.total_uncompressed_size
                stats = leaf.statistics
                if name in unfilled and stats is not None and stats.has_null_count and stats.null_count:
                    maybe.add(name)
            groups.append((group, first_row, meta.num_rows, data_bytes, maybe))
            first_row += meta.num_rows
        suspected = any(maybe & set(watched) for *_, maybe in groups)
        found = FileNulls(path, self.columns, self.fill)
        for group, first_row, rows, data_bytes, maybe in groups:
            read = [name for name in self.columns if name in maybe] if suspected else []
            start = first_row
            for batch in self._batches(number, group, read, data_bytes // max(rows, 1) + 1) if read else ():
                found.add(start, batch, nulls.get)  # (reading only those columns of this row group)
                start += batch.num_rows
            if rows:
                yield Unit(number, group, first_row, rows), data_bytes
        found.refuse()

    def read_unit(self, unit: Unit, lo: int, hi: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        cursor = self._cursor
        if cursor is None or cursor.unit != unit or cursor.start > lo:
            cursor = self._cursor = _Cursor(unit, self._batches(unit.file, unit.locator, self.columns, self._row_bytes))
        path = self.paths[unit.file]
        while lo < hi:
            while cursor.start + cursor.batch.num_rows <= lo:
                cursor.advance(path)
            take = min(hi, cursor.start + cursor.batch.num_rows) - lo
            yield lo, cursor.batch.slice(lo - cursor.start, take)
            lo += take


def _null_counts(metadata: pq.FileMetaData, names: list[str]) -> dict[str, int]:
    """Nulls of each column of ``names`` stored as one leaf, in the whole file, where every row
    group's statistics count them."""
    counts: dict[str, int] = {}
    leaves = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    for name in names:
        if name not in leaves:  # a list or struct: several leaves, or statistics that count empty lists
            continue
        stats = [metadata.row_group(g).column(leaves[name]).statistics for g in range(metadata.num_row_groups)]
        if all(stat is not None and stat.has_null_count for stat in stats):
            counts[name] = sum(stat.null_count for stat in stats)
    return counts


_MAGIC = {"Parquet": (b"PAR1",), "Arrow IPC": (b"ARROW1", b"\xff\xff\xff\xff")}  # (an IPC stream's first)
_CONVERT = {"Parquet": "pyarrow.parquet.write_table(pyarrow.csv.read_csv(path), 'table.parquet')",
            "Arrow IPC": "pyarrow.feather.write_feather(pyarrow.csv.read_csv(path), 'table.arrow')"}


def unreadable(path: Path, exc: Exception, kind: str = "Parquet") -> SampleError:
    """The error of a file pyarrow cannot read, whose own error names no file: a file of another
    format (a CSV, say) is told apart from one cut short or damaged, which a copy mends."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:  # gone since it was listed: pyarrow's error says so
        head = b""
    other = next((name for name, magic in _MAGIC.items() if name != kind and head.startswith(magic)), None)
    if head and other is not None:
        command = "build parquet" if other == "Parquet" else "build arrow"
        return SampleError(f"{path}: a file in {other} format, not {kind}: build it with 'pipeline {command}' "
                           f"(pipeline.{command.replace(' ', '_')} in Python)")
    if head.startswith(b"FEA1"):  # (the first Feather format, before it became Arrow IPC)
        return SampleError(f"{path}: a Feather file of version 1, which is not Arrow IPC: write it again as version "
                           f"2 (pyarrow.feather.write_feather(pyarrow.feather.read_table(path), 'table.arrow')), or "
                           f"leave it out of the inputs")
    if head and not head.startswith(_MAGIC[kind]):  # (an empty file is one cut short)
        return SampleError(f"{path}: not in {kind} format (it starts with {head!r}): convert it first (a CSV file: "
                           f"{_CONVERT[kind]}), or leave it out of the inputs")
    return SampleError(f"{path}: not a readable {kind} file ({exc}): replace it with a whole copy, or leave it "
                       f"out of the inputs")


def _parquet_file(path: Path, **options: Any) -> pq.ParquetFile:
    """``path`` opened: pyarrow's error for a file not Parquet (or cut short) names no file."""
    try:
        return pq.ParquetFile(path, **options)
    except (pa.ArrowException, OSError) as exc:
        raise unreadable(path, exc) from None


def _decoded(path: Path, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` of ``path``, a decoding error (a corrupt page) naming the file."""
    try:
        yield from batches
    except (pa.ArrowException, OSError) as exc:
        raise unreadable(path, exc) from None
