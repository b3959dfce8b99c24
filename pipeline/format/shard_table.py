"""The per-shard table and the per-record offsets and checksums of a shard set, in a binary
file beside the index.

Why binary: a billion samples in a million shards would make an ``index.json`` of gigabytes
that takes minutes and tens of gigabytes of Python objects to parse. Here the numbers are
fixed-width arrays that a reader maps (local) or fetches by range (remote) and touches only
where it reads: opening costs the per-shard table (56 bytes a shard), and each worker reads
just the offsets and checksums of the shards in its spans.

Layout of ``index.bin`` (little-endian, every section 8-byte aligned)::

    header   64 bytes: magic b"PIPESHRD", version u32, offset width u32 (4 or 8),
             shards u64, records u64, zero padding
    samples  int64[shards]
    records  int64[shards]
    bytes    int64[shards]
    sha256   uint8[shards, 32]
    offsets  uint32 or uint64[records]   (shard after shard, in index order)
    checksum uint32[records]             (of each record's member data, see record_checksum)

Offsets are 4 bytes when every shard is under 4 GiB, which halves the file for large sets.
The checksums let a reader catch a flipped bit in a record it reads, without reading the
whole shard for its sha256: a corrupt record is an error (or a counted skip), never a wrong
sample.
"""

from __future__ import annotations

import copy
import hashlib
import os
import struct
from collections import OrderedDict
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterable, Protocol, Sequence

import numpy as np
import xxhash

from ..fork_safe import ForkSafeLock
from .errors import IndexFormatError, ShardError
from .shard_names import LazySequence, ShardNames

if TYPE_CHECKING:
    from .records import Record

MAGIC = b"PIPESHRD"
TABLE_VERSION = 1
HEADER = struct.Struct("<8sIIQQ")
HEADER_BYTES = 64
PER_SHARD_BYTES = 3 * 8 + 32
_WRITE_RECORDS = 1 << 22  # record columns written 4M at a time: bounded memory for any size
CHECKSUM_DTYPE = np.dtype("<u4")


@dataclass
class ShardInfo:
    """One shard as the index describes it. ``offsets[i]`` is the byte where record ``i``
    starts, ``checksum[i]`` the checksum of its member data (see :func:`record_checksum`)."""

    url: str
    samples: int
    records: int
    bytes: int
    sha256: str
    offsets: Sequence[int] = field(default_factory=list)
    checksum: Sequence[int] = field(default_factory=list)


def record_checksum(members: Iterable[bytes | memoryview]) -> int:
    """The checksum of a record: the low 32 bits of XXH3-64 of its members' data, one after the
    other. XXH3 runs at several GB/s, so checking every record read costs a few percent."""
    parts = list(members)
    if len(parts) == 1:
        return xxhash.xxh3_64_intdigest(parts[0]) & 0xFFFFFFFF
    state = xxhash.xxh3_64()
    for data in parts:
        state.update(data)
    return state.intdigest() & 0xFFFFFFFF


def check_record_offset(record: Record, shard: ShardInfo, number: int, url: str) -> None:
    """Refuse record ``number`` when it does not start where the index says."""
    if record.offset != int(shard.offsets[number]):
        raise ShardError(url, record.offset, f"record starts at byte {record.offset}, "
                         f"the index says {int(shard.offsets[number])}")


def check_record_checksum(record: Record, shard: ShardInfo, number: int, url: str) -> None:
    """Refuse record ``number`` when its member data is not what the index checksummed."""
    found = record_checksum(record.members.values())
    if found != int(shard.checksum[number]):
        raise ShardError(url, record.offset, f"record {record.key!r} is corrupt: checksum {found:08x}, "
                         f"the index says {int(shard.checksum[number]):08x}")


class RecordColumn(Protocol):
    """One number per record (an offset, a checksum), by global record number: the records of
    all shards, in index order."""

    def read(self, start: int, stop: int) -> np.ndarray: ...


@dataclass(frozen=True)
class ArrayColumn:
    """A record column held in an array."""

    array: np.ndarray

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.array[start:stop]


class RangeColumn:
    """A record column read on demand, a block at a time, the last few blocks kept.

    A reader thus reads only the offsets and checksums of the shards it reads (a ranged request per block
    when remote, a ``pread`` when local), never the whole section of a billion-sample set.
    Local files are read rather than mapped: a mapping would put every page it touches, and
    the page cache's large folios around it, in the process's resident set.

    A worker's reader threads share a column. A block is fetched outside the column's lock, so
    that one thread waiting on a slow request holds up only the threads that need that same block:
    they wait for its fetch rather than make their own. The lock is made anew in a forked child,
    which also ignores the fetches the parent had under way (no thread of its own will finish them)."""

    KEEP_BLOCKS = 64

    def __init__(self, read_range: Callable[[int, int], bytes], base: int, dtype: np.dtype, count: int,
                 block_bytes: int = 1 << 16) -> None:
        self._read_range = read_range
        self._base = base
        self._dtype = np.dtype(dtype)
        self._count = count
        self._per_block = max(block_bytes // self._dtype.itemsize, 1)
        self._blocks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._fetches: dict[int, tuple[int, Future[np.ndarray]]] = {}  # block -> (process fetching it, its result)
        self._lock = ForkSafeLock()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_blocks": OrderedDict(), "_fetches": {}}

    def _block(self, number: int) -> np.ndarray:
        while True:
            with self._lock:
                block = self._blocks.get(number)
                if block is not None:
                    self._blocks.move_to_end(number)
                    return block
                fetch = self._fetches.get(number)
                mine = fetch is None or fetch[0] != os.getpid()
                if mine:
                    fetch = self._fetches[number] = (os.getpid(), Future())
            if mine:
                return self._fetch(number, fetch[1])
            try:
                return fetch[1].result()
            except CancelledError:  # its fetch was interrupted: this thread fetches it
                continue
            except Exception as exc:  # a copy: one error raised in several threads would carry all their stacks
                raise copy.copy(exc) from None

    def _fetch(self, number: int, result: Future[np.ndarray]) -> np.ndarray:
        """Block ``number``, fetched for ``result``. Whatever happens, the fetch is taken off those
        under way and ``result`` settled: its waiters would wait for it for ever."""
        block = None
        try:
            first = number * self._per_block
            last = min(first + self._per_block, self._count)
            size = self._dtype.itemsize
            block = np.frombuffer(self._read_range(self._base + first * size, self._base + last * size), self._dtype)
            return block
        except Exception as exc:
            result.set_exception(exc)  # its waiters raise it too; the next read tries again
            raise
        finally:
            with self._lock:
                if self._fetches.get(number, (0, None))[1] is result:
                    del self._fetches[number]
                if block is not None:
                    self._blocks[number] = block
                    while len(self._blocks) > self.KEEP_BLOCKS:
                        self._blocks.popitem(last=False)
            if block is not None:
                result.set_result(block)
            elif not result.done():
                result.cancel()  # interrupted (KeyboardInterrupt): a waiter fetches it itself

    def read(self, start: int, stop: int) -> np.ndarray:
        pieces = []
        for number in range(start // self._per_block, -(-stop // self._per_block)):
            first = number * self._per_block
            block = self._block(number)
            pieces.append(block[max(start - first, 0):stop - first])
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces) if pieces else np.zeros(0, self._dtype)


@dataclass(frozen=True)
class ConcatColumn:
    """A record column of several tables, one after the other (a merged index)."""

    stores: tuple[RecordColumn, ...]
    ends: np.ndarray  # cumulative record counts, one per store
    dtype: type | np.dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        pieces = []
        begin = 0
        for store, end in zip(self.stores, self.ends.tolist()):
            if start < end and stop > begin:
                pieces.append(np.asarray(store.read(max(start, begin) - begin, min(stop, end) - begin), self.dtype))
            begin = end
        return np.concatenate(pieces) if pieces else np.zeros(0, self.dtype)


class ShardTable(LazySequence[ShardInfo]):
    """Every shard of a set as columns: names, samples, records, bytes, sha256, and where its
    record offsets and checksums live. Indexing yields a :class:`ShardInfo` built on demand."""

    def __init__(self, names: ShardNames, samples: np.ndarray, records: np.ndarray, nbytes: np.ndarray,
                 sha256: np.ndarray, offsets: RecordColumn, checksum: RecordColumn) -> None:
        self.names = names
        self.samples = np.asarray(samples, np.int64)
        self.records = np.asarray(records, np.int64)
        self.nbytes = np.asarray(nbytes, np.int64)
        self.sha256 = np.asarray(sha256, np.uint8).reshape(-1, 32)
        self.offsets = offsets
        self.checksum = checksum
        self.first_record = np.concatenate([[0], np.cumsum(self.records)]).astype(np.int64)
        if not len(names) == len(self.samples) == len(self.records) == len(self.nbytes) == len(self.sha256):
            raise IndexFormatError(f"shard table columns differ in length ({len(names)} names, "
                                   f"{len(self.samples)} sample counts)")

    @classmethod
    def from_infos(cls, infos: Iterable[ShardInfo]) -> "ShardTable":
        infos = list(infos)
        for info in infos:
            if not len(info.offsets) == len(info.checksum) == info.records:
                raise IndexFormatError(f"shard {info.url}: {len(info.offsets)} offsets and {len(info.checksum)} "
                                       f"checksums for {info.records} records")
        total = sum(info.records for info in infos)
        offsets = np.fromiter((o for info in infos for o in info.offsets), np.uint64, total)
        checksum = np.fromiter((c for info in infos for c in info.checksum), CHECKSUM_DTYPE, total)
        sha = np.frombuffer(b"".join(bytes.fromhex(info.sha256) for info in infos), np.uint8)
        return cls(ShardNames.of(info.url for info in infos), [i.samples for i in infos],
                   [i.records for i in infos], [i.bytes for i in infos], sha, ArrayColumn(offsets), ArrayColumn(checksum))

    @classmethod
    def concat(cls, tables: Sequence["ShardTable"]) -> "ShardTable":
        ends = np.cumsum([t.total_records for t in tables]).astype(np.int64)

        def column(name: str) -> np.ndarray:
            return np.concatenate([getattr(t, name) for t in tables]) if tables else np.zeros(0, np.int64)
        sha = np.concatenate([t.sha256 for t in tables]) if tables else np.zeros((0, 32), np.uint8)
        return cls(ShardNames.concat(t.names for t in tables), column("samples"), column("records"),
                   column("nbytes"), sha, ConcatColumn(tuple(t.offsets for t in tables), ends, np.uint64),
                   ConcatColumn(tuple(t.checksum for t in tables), ends, CHECKSUM_DTYPE))

    def renamed(self, change: Callable[[str], str]) -> "ShardTable":
        """The same shards under names changed by ``change`` (applied to their folder part)."""
        return ShardTable(self.names.renamed(change), self.samples, self.records, self.nbytes,
                          self.sha256, self.offsets, self.checksum)

    def take(self, positions: Sequence[int]) -> "ShardTable":
        """A table of the chosen shards (their record columns read into memory)."""
        return ShardTable.from_infos(self[i] for i in positions)

    def _records_of(self, column: RecordColumn, i: int) -> np.ndarray:
        return column.read(int(self.first_record[i]), int(self.first_record[i + 1]))

    @property
    def total_records(self) -> int:
        return int(self.first_record[-1])

    def __len__(self) -> int:
        return len(self.samples)

    def item(self, i: int) -> ShardInfo:
        return ShardInfo(self.names[i], int(self.samples[i]), int(self.records[i]), int(self.nbytes[i]),
                         self.sha256[i].tobytes().hex(), self._records_of(self.offsets, i),
                         self._records_of(self.checksum, i))


def offset_width(table: ShardTable) -> int:
    """4-byte offsets when every shard is under 4 GiB, else 8."""
    return 4 if not len(table) or int(table.nbytes.max()) < 1 << 32 else 8


def write_table(out: BinaryIO, table: ShardTable) -> tuple[int, str]:
    """Write ``table`` in the binary layout; return its size and sha256."""
    sha = hashlib.sha256()
    size = 0

    def put(data: np.ndarray, dtype: np.dtype | str) -> None:
        nonlocal size
        raw = memoryview(np.ascontiguousarray(data, dtype).reshape(-1).view(np.uint8))
        out.write(raw)
        sha.update(raw)
        size += len(raw)

    width = offset_width(table)
    header = HEADER.pack(MAGIC, TABLE_VERSION, width, len(table), table.total_records).ljust(HEADER_BYTES, b"\0")
    put(np.frombuffer(header, np.uint8), np.uint8)
    for column in (table.samples, table.records, table.nbytes):
        put(column, "<i8")
    put(table.sha256, np.uint8)
    for records, dtype in ((table.offsets, "<u4" if width == 4 else "<u8"), (table.checksum, CHECKSUM_DTYPE)):
        for start in range(0, table.total_records, _WRITE_RECORDS):
            put(records.read(start, min(start + _WRITE_RECORDS, table.total_records)), dtype)
    return size, sha.hexdigest()


@dataclass(frozen=True)
class TableLayout:
    """What the header of a table file says, checked against what the index expects."""

    width: int
    shards: int
    records: int

    @property
    def offsets_start(self) -> int:
        return HEADER_BYTES + self.shards * PER_SHARD_BYTES

    @property
    def checksum_start(self) -> int:
        return self.offsets_start + self.records * self.width

    @property
    def size(self) -> int:
        return self.checksum_start + self.records * CHECKSUM_DTYPE.itemsize

    @property
    def dtype(self) -> np.dtype:
        return np.dtype("<u4" if self.width == 4 else "<u8")

    @classmethod
    def parse(cls, header: bytes | memoryview, where: str, shards: int, size: int) -> "TableLayout":
        if len(header) < HEADER_BYTES:
            raise IndexFormatError(f"{where}: shard table is truncated ({len(header)} bytes)")
        magic, version, width, count, records = HEADER.unpack_from(header)
        if magic != MAGIC:
            raise IndexFormatError(f"{where}: not a shard table (bad magic at byte 0)")
        if version != TABLE_VERSION or width not in (4, 8):
            raise IndexFormatError(f"{where}: shard table version {version} / offset width {width} not supported")
        layout = cls(width, count, records)
        if count != shards:
            raise IndexFormatError(f"{where}: holds {count} shards, the index names {shards}")
        if layout.size != size:
            raise IndexFormatError(f"{where}: is {size} bytes, its header implies {layout.size}")
        return layout


def _columns(table: bytes, layout: TableLayout, where: str, names: ShardNames,
             offsets: RecordColumn, checksum: RecordColumn) -> ShardTable:
    n = layout.shards
    ints = np.frombuffer(table, "<i8", 3 * n, HEADER_BYTES).reshape(3, n)
    sha = np.frombuffer(table, np.uint8, 32 * n, HEADER_BYTES + 24 * n)
    result = ShardTable(names, ints[0], ints[1], ints[2], sha, offsets, checksum)
    if result.total_records != layout.records:
        raise IndexFormatError(f"{where}: per-shard records add up to {result.total_records}, "
                               f"the header says {layout.records}")
    if (result.samples < 0).any() or (result.records < 0).any() or (result.nbytes < 0).any():
        raise IndexFormatError(f"{where}: negative counts in the shard table")
    return result


def read_table(read_range: Callable[[int, int], bytes], size: int, where: str, names: ShardNames,
               block_bytes: int = 1 << 16) -> ShardTable:
    """A table read by ranges (``pread`` locally, ranged requests remotely): the per-shard part
    now, record offsets and checksums a block of ``block_bytes`` at a time when asked."""
    layout = TableLayout.parse(read_range(0, HEADER_BYTES) if size >= HEADER_BYTES else b"",
                               where, len(names), size)
    n = layout.records
    if layout.size - layout.offsets_start <= block_bytes:  # small: all of it in one read
        head = read_range(0, layout.size)
        offsets: RecordColumn = ArrayColumn(np.frombuffer(head, layout.dtype, n, layout.offsets_start))
        checksum: RecordColumn = ArrayColumn(np.frombuffer(head, CHECKSUM_DTYPE, n, layout.checksum_start))
    else:
        head = read_range(0, layout.offsets_start)
        offsets = RangeColumn(read_range, layout.offsets_start, layout.dtype, n, block_bytes)
        checksum = RangeColumn(read_range, layout.checksum_start, CHECKSUM_DTYPE, n, block_bytes)
    return _columns(head, layout, where, names, offsets, checksum)
