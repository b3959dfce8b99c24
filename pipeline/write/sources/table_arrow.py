"""Arrow IPC files and streams as a table source (a ``datasets.save_to_disk`` folder is one):
memory-mapped afresh for each read, so that only the rows read are touched and the mapping goes
with the block that uses it. See :mod:`.tables` for what every table source shares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ...format.errors import SampleError
from ..rows import RowBlock
from .table_files import Inputs, arrow_files

# (pyarrow, and what reads it, from .tables: it says how to install pyarrow when it is missing)
from .tables import FileNulls, TableSource, Unit, pa, unreadable
from .unchanged import check_unchanged


def _open_ipc(path: Path) -> tuple[Any, Any]:
    """The reader of an IPC file or stream over a fresh memory map of it, and the map."""
    source = pa.memory_map(str(path))  # (pyarrow takes no Path here)
    try:
        return pa.ipc.open_file(source), source
    except (pa.ArrowInvalid, OSError):  # (bytes it cannot take are an OSError at times: a "negative continuation
        source.seek(0)  # token")
    try:
        return pa.ipc.open_stream(source), source
    except (pa.ArrowInvalid, OSError) as exc:
        source.close()  # (the error's traceback holds this frame: kept, say in a notebook, it kept the file open)
        raise unreadable(path, exc, "Arrow IPC") from None


def _nulls_in(path: Path, name: str) -> int:
    """The nulls of column ``name`` in the whole IPC file or stream, from its batches' headers."""
    reader, source = _open_ipc(path)
    with source:
        return sum(batch.column(name).null_count for _, batch in _located_batches(reader, source))


def _located_batches(reader: Any, source: Any) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Every record batch, with its locator (see :class:`Unit`)."""
    if isinstance(reader, pa.ipc.RecordBatchFileReader):
        for number in range(reader.num_record_batches):
            yield number, reader.get_batch(number)
        return
    while True:
        position = source.tell()
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        yield position, batch


def _allocated_so_far() -> int:
    """The bytes Arrow's memory pool has allocated since the process began (pyarrow 16 on: what
    another thread frees meanwhile does not hide an allocation), else those it holds now."""
    pool = pa.default_memory_pool()
    total = getattr(pool, "total_bytes_allocated", None)
    return total() if total is not None else pool.bytes_allocated()


class ArrowSource(TableSource):
    """Arrow IPC files (the random-access file format: ``.arrow``, ``.feather`` v2), IPC streams,
    and folders of them, a ``datasets`` ``save_to_disk`` folder included."""

    kind = "arrow"

    def __init__(self, inputs: Inputs, columns: Sequence[str] | None = None,
                 fill: Mapping[str, Any] | None = None) -> None:
        self.streams: list[bool] = []  # per file: the stream format, whose batches are found by byte offset
        super().__init__(inputs, columns, fill)

    def files(self, inputs: Inputs) -> list[Path]:
        return arrow_files(inputs)

    def schema(self, path: Path) -> pa.Schema:
        return _open_ipc(path)[0].schema

    def open_state(self) -> dict[str, Any]:
        return {"_open": None, "_decoded": None}

    def read(self, start: int, stop: int) -> RowBlock:
        try:
            return super().read(start, stop)
        finally:
            self._open = None  # the map now lives only as long as the block that uses it

    def scan(self, number: int, path: Path) -> Iterator[tuple[Unit, int]]:
        reader, source = _open_ipc(path)
        stream = not isinstance(reader, pa.ipc.RecordBatchFileReader)
        encoded = [field.name for field in reader.schema if pa.types.is_dictionary(field.type)]
        if stream and encoded:
            raise SampleError(f"{path}: an IPC stream with dictionary-encoded columns ({', '.join(encoded)}) cannot "
                              f"be read a batch at a time; write it as an IPC file (pyarrow.ipc.new_file) or Parquet")
        self.streams.append(stream)
        watched = [name for name in self.columns if name not in self.fill]
        first_row, found = 0, FileNulls(path, self.columns, self.fill)
        try:
            for locator, batch in _located_batches(reader, source):
                if batch.num_rows:  # only metadata and null counts are read: the data stays on disk
                    found.add(first_row, batch.select(watched), lambda name: _nulls_in(path, name))
                    columns_bytes = sum(batch.column(name).get_total_buffer_size() for name in self.columns)
                    yield Unit(number, locator, first_row, batch.num_rows), columns_bytes
                first_row += batch.num_rows
                del batch  # (a compressed one is decompressed: not two at once)
            found.refuse()
        except (pa.ArrowException, OSError) as exc:  # cut short, or damaged: pyarrow names no file
            raise unreadable(path, exc, "Arrow IPC") from None

    def read_unit(self, unit: Unit, lo: int, hi: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        if self._open is None or self._open[0] != unit.file:
            self._open = (unit.file, *_open_ipc(self.paths[unit.file]))
            check_unchanged(self.paths[unit.file], self.versions[unit.file])
        if self._decoded is not None and self._decoded[0] == (unit.file, unit.locator):
            yield lo, self._decoded[1].slice(lo, hi - lo)
            return
        _, reader, source = self._open
        allocated = _allocated_so_far()
        try:
            if self.streams[unit.file]:
                source.seek(unit.locator)
                batch = pa.ipc.read_record_batch(pa.ipc.read_message(source), reader.schema)
            else:
                batch = reader.get_batch(unit.locator)
        except (pa.ArrowException, OSError) as exc:  # changed since the scan, or damaged in a compressed buffer
            raise unreadable(self.paths[unit.file], exc, "Arrow IPC") from None
        # a compressed batch (lz4, zstd) is decompressed whole into memory: kept for the reads of the rest of it,
        # each of which decompressed it all again (a batch of 1.2M rows took 44 s and 3.8 GB where 6 s did)
        self._decoded = ((unit.file, unit.locator), batch) if _allocated_so_far() > allocated else None
        yield lo, batch.slice(lo, hi - lo)
