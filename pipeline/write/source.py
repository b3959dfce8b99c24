"""What a planned build reads from: a :class:`Source` of rows, and how rows are cut into shards.

A source knows its length and can read any range of rows as a :class:`RowBlock`. Because
the shard boundaries are planned before anything is written, shard ``k`` holds the same
samples whether the build runs in one process, in a pool, or as parts on several machines.
"""

from __future__ import annotations

import bisect
import copy
import pickle
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..format.errors import SampleError
from ..format.index import DatasetIndex
from ..format.numbers import is_whole
from ..format.tar import BLOCK, END_OF_ARCHIVE, member_bytes
from .rows import RowBlock, encode_records

#: Default shard size: large enough that per-shard costs (open, fsync, an HTTP request)
#: vanish, small enough for many shards per consumer.
DEFAULT_SHARD_BYTES = 256 << 20
#: The smallest shard limit: a record's header and a block of data, and the end of the archive.
MIN_SHARD_BYTES = 4096
#: What ``pack="auto"`` aims at: records large enough that the tar header (512 bytes) and the
#: per-record costs of reading vanish, small enough to shuffle records of many shards at once.
AUTO_RECORD_BYTES = 64 << 10
#: ... but a set of fewer than 32 MiB still gets this many records: a loader mixes whole records,
#: up to 64 chunks to a shuffle window of at most an eighth of the set, so that in a set of a few
#: records of 64 KiB a batch would come from one or two of them (one class, of data sorted by class).
AUTO_MIN_RECORDS = 512


class Source(ABC):
    """A sequence of rows that a build cuts into shards.

    Subclasses implement ``__len__`` and ``read``; sources whose rows vary in size override
    ``shard_bounds``, and in-memory sources override ``window`` so that a task sent to another
    process carries only its own rows.
    """

    description: str = "source"
    #: whether every row has the same fields of the same shapes (arrays), so that rows pack
    fixed_shape: bool = False
    #: what the index records about the samples besides their fields (JSON values): an image
    #: folder's ``{"classes": [...]}``, whose positions its labels are
    metadata: dict[str, Any] | None = None

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def read(self, start: int, stop: int) -> RowBlock:
        """Rows ``[start, stop)`` as a block."""

    def shard_bounds(self, shard_samples: int | None, shard_bytes: int | None, pack: int) -> list[int]:
        """Row numbers where shards start, plus ``len(self)`` at the end (fixed-size rows)."""
        if len(self) == 0:
            return [0]
        return uniform_bounds(len(self), samples_per_shard_for(self, shard_samples, shard_bytes, pack))

    def window(self, start: int, stop: int) -> "Source":
        """Rows ``[start, stop)`` renumbered from 0, cheap to send to a worker process."""
        return SourceWindow(self, start, stop)

    def approx_row_bytes(self) -> int:
        """About how many bytes one row holds, to size the chunks a build reads at once.
        Sources that know better (arrays, files) override this guess."""
        return 64 << 10

    def place(self, row: int) -> tuple[str, str] | None:
        """Where row ``row`` is read from, for an error, where the source knows better than its
        number in the input: ``(the file, "row 7 (counting from 0 in the file)")``. ``None`` here."""
        return None

    def why_shapes_vary(self, field: str) -> str:
        """What of this source may make ``field``'s shape vary, for the build's warning that it
        does; nothing here."""
        return ""

    def identity(self, digest: Any, start: int, stop: int) -> None:
        """Feed ``digest`` (a hashlib object) what names the source's rows ``[start, stop)``, for
        a resumed build to see which finished shards still hold the rows it plans: here nothing
        (rows known by position only: a resume assumes them unchanged); a source of files,
        their names and labels."""
        return None


def require_folder(folder: Path) -> None:
    """Raise, naming ``folder``, unless it is a folder; a file given for it (a sample's, a batch
    file) is told to be replaced by the folder that holds it."""
    if not folder.is_dir():
        hint = " (it is a file: pass the folder that holds it)" if folder.is_file() else ""
        raise FileNotFoundError(f"{folder}: no such folder{hint}")


def span_identity(digest: Any, starts: Sequence[int], name_of: Callable[[int], Any], start: int, stop: int) -> None:
    """:meth:`Source.identity` of a source whose rows come in spans (files, batches): the name
    (``name_of(i)``) and the rows of each span that rows ``[start, stop)`` touch (``starts``:
    each span's first row, then the end), so that a span removed or added before them shifts
    what they are."""
    first = bisect.bisect_right(starts, start) - 1
    last = bisect.bisect_left(starts, stop)
    digest.update(repr([(name_of(i), starts[i], starts[i + 1]) for i in range(max(first, 0), last)]).encode())


def resolve_pack(pack: int | str, source: Source) -> int:
    """Samples per record: ``pack`` itself, or for ``"auto"`` as many fixed-shape samples as
    fill about :data:`AUTO_RECORD_BYTES`, but no more than give the set :data:`AUTO_MIN_RECORDS`
    records (1 for larger samples, and for samples whose shapes may differ, which cannot share
    a record)."""
    check_pack(pack)
    if pack != "auto":
        return int(pack)  # (a NumPy integer too: the index stores it)
    return auto_pack(source) if source.fixed_shape else 1


def check_pack(pack: int | str) -> None:
    """``"auto"`` or a whole number >= 1, Python's or NumPy's."""
    if pack != "auto" and (not is_whole(pack) or pack < 1):
        raise ValueError(f"pack must be 'auto' or an integer >= 1, got {pack!r}")


def auto_pack(source: Source) -> int:
    """What ``pack="auto"`` gives samples of ``source``'s size whose shapes are fixed."""
    if len(source) == 0:
        return 1
    by_size = AUTO_RECORD_BYTES // max(source.read(0, 1).data_bytes(), 1)
    return max(min(by_size, len(source) // AUTO_MIN_RECORDS), 1)


def advise_pack(options: Mapping[str, Any], built: Sequence[tuple[Source, DatasetIndex]]) -> None:
    """After a converter's build (one set, or each split's): where ``pack="auto"`` left small
    samples one a record only because their shapes might have differed (files, ragged columns)
    and every field kept one shape, say the pack to build with instead (a record costs a tar
    header and a checksum to write and to read, whatever its size). One pack for all splits: a
    command takes one."""
    if options.get("pack", "auto") != "auto" or options.get("quiet"):
        return
    built = [(source, index) for source, index in built if index.samples]
    for source, index in built:
        if source.fixed_shape or any(
                spec.varies or spec.optional or spec.dtype == "bfloat16" for spec in index.fields.values()):
            return
    better = max((auto_pack(source) for source, _ in built), default=1)
    if better > 1:
        print(f"note: each sample is a record of its own (pack=1), as 'auto' makes them when samples may differ in "
              f"shape, but every field kept one shape: records of {better} samples would take less room and stream "
              f"faster; build again with --pack {better} --overwrite (pack={better} in Python)", file=sys.stderr)


def uniform_bounds(rows: int, samples_per_shard: int) -> list[int]:
    """Bounds for shards of equal sample counts (the last one shorter)."""
    bounds = list(range(0, rows, samples_per_shard)) + [rows]
    return bounds if rows else [0]


def check_limits(shard_samples: int | None, shard_bytes: int | None, workers: int = 1) -> None:
    """Refuse limits that would make no shards or no workers (``None`` means no limit), and
    limits that are no whole numbers (``"1MB"``, ``2.5``), before they reach a comparison or a
    slice that would fail with Python's words, not these."""
    for name, value, least, what in (("shard_samples", shard_samples, 1, ""),
                                     ("shard_bytes", shard_bytes, MIN_SHARD_BYTES, " (a tar header and a record)"),
                                     ("workers", workers, 1, " (1 writes in this process)")):
        if value is None and name != "workers":  # (no limit; a number of workers there must be)
            continue
        if not is_whole(value) or value < least:
            hint = "; pass shard_bytes=None for no size limit" if name == "shard_bytes" else ""
            raise ValueError(f"{name} must be a whole number >= {least}{what}, got {value!r}{hint}")


def read_rows(source: Source, start: int, stop: int, first: int, why: str) -> RowBlock:
    """Rows ``[start, stop)`` of ``source`` (samples ``first`` on of the set, ``why`` they are
    read), which must give that many: the plan counted on them, and a read that gave fewer (or
    more) would leave rows out of the set (or add others) unsaid."""
    block = source.read(start, stop)
    if len(block) != stop - start:
        raise SampleError(f"{source.description}: asked for {stop - start} rows (samples {first} to "
                          f"{first + stop - start - 1}, {why}), read() gave {len(block)}: a Source's "
                          f"read(start, stop) returns stop - start rows, and __len__ counts every row it can read")
    return block


def samples_per_shard_for(source: Source, shard_samples: int | None, shard_bytes: int | None,
                          pack: int) -> int:
    """Samples per shard for a source of fixed-size rows: encode one record to learn its size."""
    if not shard_bytes:
        return shard_samples or max(len(source), 1)
    sample = read_rows(source, 0, min(pack, len(source)), 0, "read first, to size the shards")
    _, parts, rows = next(encode_records(sample, 0, pack))
    records = max((shard_bytes - len(END_OF_ARCHIVE)) // member_bytes(sum(map(len, parts))), 1)
    per_shard = records * rows
    return min(per_shard, shard_samples) if shard_samples else per_shard


def greedy_bounds(sample_bytes: Sequence[int], fields: int, shard_samples: int | None,
                  shard_bytes: int | None, pack: int) -> list[int]:
    """Bounds for rows of varying sizes (files): fill each shard up to the limits, record by record.

    A record's size is estimated from its samples' byte sizes plus msgpack and tar overhead,
    so shards may differ slightly from ``shard_bytes``, never by more than one record.
    """
    bounds = [0]
    n = len(sample_bytes)
    used_bytes = used_rows = 0
    start = 0
    while start < n:
        stop = min(start + pack, n)
        if shard_samples:
            stop = min(stop, start + shard_samples - used_rows)
        record = member_bytes(sum(sample_bytes[start:stop]) + 64 * fields * (stop - start)) + BLOCK
        if used_rows and shard_bytes and used_bytes + record + len(END_OF_ARCHIVE) > shard_bytes:
            bounds.append(start)
            used_bytes = used_rows = 0
            continue
        used_bytes += record
        used_rows += stop - start
        start = stop
        if shard_samples and used_rows == shard_samples and start < n:
            bounds.append(start)
            used_bytes = used_rows = 0
    bounds.append(n)
    return bounds if n else [0]


class SourceWindow(Source):
    """Rows ``[start, stop)`` of another source, renumbered from 0: what one task receives."""

    def __init__(self, source: Source, start: int, stop: int) -> None:
        self.source, self.start, self.stop = source, start, stop
        self.description = source.description
        self.fixed_shape = source.fixed_shape

    def __len__(self) -> int:
        return self.stop - self.start

    def read(self, start: int, stop: int) -> RowBlock:
        return self.source.read(self.start + start, self.start + stop)

    def identity(self, digest: Any, start: int, stop: int) -> None:
        self.source.identity(digest, self.start + start, self.start + stop)

    def place(self, row: int) -> tuple[str, str] | None:
        return self.source.place(self.start + row)

    def approx_row_bytes(self) -> int:
        return self.source.approx_row_bytes()


class FileRowsSource(Source):
    """A source whose rows come from files of known sizes (``self.sizes``, bytes per row):
    shards are planned from the sizes, without reading a file."""

    sizes: list[int]
    fields: Sequence[str]
    #: the attributes that hold one entry per row (every one ``read`` uses): a window keeps its
    #: own rows of each. Only a class that names them itself gets such windows: a subclass may
    #: add a list of its own, so it inherits the plain window (the whole source) until it says.
    row_lists: tuple[str, ...] | None = None

    def window(self, start: int, stop: int) -> Source:
        """Rows ``[start, stop)``: a copy whose per-row lists hold those rows only, so that a task
        sent to a build worker carries its own files, not the list of a million others."""
        if self.row_lists is None or "row_lists" not in type(self).__dict__:
            return super().window(start, stop)
        window = copy.copy(self)
        for name in self.row_lists:
            setattr(window, name, getattr(self, name)[start:stop])
        return window

    def approx_row_bytes(self) -> int:
        return max(sum(self.sizes) // max(len(self), 1), 1)

    def identity(self, digest: Any, start: int, stop: int) -> None:
        """The rows' keys (or IDs) and labels, what the per-row lists hold but the files' paths
        and sizes (a file mended in place, or the folder given by another path, is the same
        row): a file added, removed or renamed before them, or a label changed, changes it."""
        for name in self.row_lists or ():
            if name not in ("paths", "sizes"):
                digest.update(pickle.dumps(getattr(self, name)[start:stop], protocol=4))

    def shard_bounds(self, shard_samples: int | None, shard_bytes: int | None, pack: int) -> list[int]:
        return greedy_bounds(self.sizes, len(self.fields), shard_samples, shard_bytes, pack)
