"""ShardWriter: stream samples into size-limited shards and an ``index.json``.

Use it when samples come from your own loop::

    with ShardWriter("shards/train", prefix="train", shard_bytes=256 << 20, pack=64) as w:
        for x, y in my_samples():
            w.write({"x": x, "y": y})

Shards are named ``<prefix>-000000.tar``, ``<prefix>-000001.tar``..., each finalised
atomically (and uploaded as soon as it is finished when ``out_dir`` is an ``s3://`` prefix);
the index is written by ``close()`` (the end of the ``with`` block) and only if
no error happened, so a failed build never leaves an index naming a broken shard. The shards it
finished stay, whole (``pipeline index`` makes a set of them); with ``overwrite=True`` they are
all that stays: the old set's index goes first, and, whether the writing ends well or not, its
shards that were not written over go too, so that no folder holds a mix of old and new shards.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..format.errors import FormatError, SampleError
from ..format.index import INDEX_NAME, DatasetIndex, Schema, ShardInfo, merge_schema
from ..format.numbers import is_whole
from ..format.packing import refuse_unpackable
from ..format.tar import END_OF_ARCHIVE, member_bytes
from ..storage.destination import destination, write_error
from .fixed_records import FixedLayout, build_records, fixed_layout
from .output import (
    check_prefix,
    clear_child_sets,
    clear_other_indexes,
    clear_planned_shards,
    deleted_note,
    hold_output,
    prepare_output,
    remove_stale_shards,
    remove_unplanned_shards,
    save_index,
    shard_name,
)
from .progress import BuildProgress
from .refused_samples import Refused, left_out, split_refused
from .rows import RowBlock, check_key, encode_records
from .shard_file import ShardFile
from .source import check_limits
from .sources.pandas_values import is_pandas, pandas_columns, pandas_values


class ShardWriter:
    """Writes samples to shards of at most ``shard_samples`` samples and ``shard_bytes`` bytes.

    ``pack=K`` stores K consecutive samples per record (the last record of a shard may be
    shorter). Keys are generated (``000000000042``) unless given for every sample; a
    repeated key is refused.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        prefix: str = "shard",
        *,
        shard_samples: int | None = None,
        shard_bytes: int | None = 256 << 20,
        pack: int = 1,
        overwrite: bool = False,
        quiet: bool = True,
    ) -> None:
        if not is_whole(pack) or pack < 1:
            auto = " ('auto' is a build's, which sees the samples' shapes before it writes)" if pack == "auto" else ""
            raise ValueError(f"ShardWriter's pack is the samples a record holds, an integer >= 1, got {pack!r}{auto}")
        check_limits(shard_samples, shard_bytes)
        self.destination = destination(out_dir)
        self.prefix = check_prefix(prefix)
        self.shard_samples = shard_samples
        self.shard_bytes = shard_bytes
        self.pack = int(pack)
        self.overwrite = overwrite
        try:
            hold_output(self.destination)
            clear_child_sets(self.destination, overwrite)
            self._old_shards = prepare_output(self.destination, overwrite)
            self._old_shards += clear_other_indexes(self.destination, INDEX_NAME, overwrite)
            clear_planned_shards(self.destination, self.prefix, None, overwrite)
        except BaseException:
            self.destination.close()
            raise
        self._shard: ShardFile | None = None
        self._shards: list[ShardInfo] = []
        self._schema: Schema | None = None
        self._pending: list[RowBlock] = []
        self._pending_rows = 0
        self._next_index = 0
        self._seen_keys: set[str] | None = None
        self._closed = False
        self._failure: OSError | None = None  # a write's error, which stopped the writer
        self.progress = BuildProgress(None, f"writing {self.destination}", quiet)

    # -- public API --------------------------------------------------------------------------

    def write(self, sample: Mapping[str, Any], key: str | None = None) -> None:
        """Add one sample (a mapping of field name to value)."""
        if not isinstance(sample, Mapping):
            raise SampleError(f"a sample must be a mapping of field -> value, got {type(sample).__name__}")
        self._add(RowBlock({name: [value] for name, value in sample.items()},
                           None if key is None else [key]))

    def write_columns(self, columns: Mapping[str, Any], keys: list[str] | None = None) -> None:
        """Add many samples at once: arrays (or lists) of equal length, one per field, or a
        DataFrame's columns; a 1-d array of strings is a field of one string a sample."""
        values = {name: _column_values(value, name) for name, value in pandas_columns(columns, "write_columns").items()}
        self._add(RowBlock(values, None if keys is None else list(keys)))

    def close(self) -> DatasetIndex:
        """Write what is pending, finalise the last shard and write ``index.json``."""
        if self._closed:
            raise RuntimeError("ShardWriter is already closed")
        self._closed = True
        try:
            if self._failure is not None:
                finished = sum(shard.samples for shard in self._shards)
                raise RuntimeError(f"ShardWriter stopped at an error: {self._failure}; the first {finished:,} "
                                   f"samples are in the {len(self._shards)} shards it finished, without an index "
                                   f"('pipeline index {self.destination}' makes a set of them); write the samples "
                                   f"again with overwrite=True for a whole set")
            dropped = self._drain_dropping(final=True)
            self._commit_shard()
            index = DatasetIndex(self._schema or {}, self._shards, self.pack)
            where = save_index(self.destination, index)
            deleted = self._remove_replaced()
        except OSError as exc:
            raise self._stop(exc) from None
        finally:
            self.destination.close()
        self.progress.close(where, note=deleted_note(deleted))
        if dropped:  # (raised once the set is whole: the samples before and after them are in it)
            raise SampleError(f"{self.destination}: {left_out(dropped, self.pack)}; the set is written with the others")
        return index

    def abort(self) -> None:
        """Stop without writing an index; the shard being written is removed."""
        self._closed = True
        try:
            if self._shard is not None:
                self._shard.abort()
                self._shard = None
            self._remove_replaced()
        finally:
            self.destination.close()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()

    # -- internals ---------------------------------------------------------------------------

    def _remove_replaced(self) -> list[str]:
        """With ``overwrite``: delete the old set's shards and a killed writer's (of this library,
        under this prefix) that this one did not write over; return the old set's that it deleted."""
        if not self.overwrite:
            return []
        written = [shard.url for shard in self._shards]
        deleted = remove_stale_shards(self.destination, self._old_shards, written)
        remove_unplanned_shards(self.destination, self.prefix, written)
        return deleted

    def _add(self, block: RowBlock) -> None:
        """Take ``block``; one refused (other fields, a bad or duplicate key) leaves the writer as
        it was, so that the samples before it, and those after it, are written."""
        if self._closed or self._failure is not None:
            raise RuntimeError(f"ShardWriter is closed{'' if self._failure is None else ' by an error: '}"
                               f"{self._failure or ''}")
        pending, rows, written, keyed = len(self._pending), self._pending_rows, self._next_index, self._seen_keys
        added: list[str] = []
        if self.pack > 1:  # (else the record of it would fail to pack at every later write, and at close)
            first = self._next_index + self._pending_rows
            refuse_unpackable(block.columns, lambda row: block.keys[row] if block.keys else f"{first + row:012d}")
        try:
            self._track_keys(block, added)
            self._pending.append(block)
            self._pending_rows += len(block)
            if self._pending_rows >= self.pack:
                self._drain(final=False)
            return
        except FormatError:
            whole = self._next_index == written  # refused before a record was written (its checks come first)
            if whole:  # the block is not taken...
                del self._pending[pending:]
                self._pending_rows = rows
                if keyed is None:
                    self._seen_keys = None
                else:
                    keyed.difference_update(added)
            refused = self._drop_refused()  # ...unless an earlier sample, pending in its record, is what it refused
            if not refused:
                raise
        except OSError as exc:
            raise self._stop(exc) from None
        try:  # a sample refused pending would refuse every later write, and close
            if whole:
                self._add(block)
            else:  # (records of the block were written: the rest of it is pending)
                refused += self._drain_dropping(final=False)
        except FormatError as again:
            raise SampleError(f"{again}; and {left_out(refused, self.pack)}") from None
        raise SampleError(f"{left_out(refused, self.pack)}; the others are taken, this write's too")

    def _drop_refused(self) -> list[Refused]:
        """Leave out the pending samples their records refuse (see :mod:`.refused_samples`)."""
        kept, refused = split_refused(self._pending, self._schema, self._next_index, self.pack)
        self._pending = [RowBlock.concat(kept)] if kept else []
        self._pending_rows = len(kept)
        for sample in refused:
            if self._seen_keys is not None and sample.row.keys:
                self._seen_keys.difference_update(sample.row.keys)
        return refused

    def _drain_dropping(self, final: bool) -> list[Refused]:
        """:meth:`_drain`, leaving out the samples the records refuse; those left out."""
        refused: list[Refused] = []
        while True:
            try:
                self._drain(final)
                return refused
            except FormatError:
                more = self._drop_refused()
                if not more:
                    raise
                refused += more

    def _stop(self, exc: OSError) -> OSError:
        """``exc`` (a full disk, say) naming the shard it was writing; that shard is dropped, or
        its temporary file would hold its room and a descriptor for the life of the process."""
        named = write_error(exc, self._shard.path) if self._shard is not None else exc
        if self._shard is not None:
            self._shard.abort()
            self._shard = None
        self._failure = named
        return named

    def _track_keys(self, block: RowBlock, added: list[str]) -> None:
        """Check the keys of ``block`` against those written and pending, noting in ``added``
        those it adds."""
        given = block.keys is not None
        if self._next_index + self._pending_rows > 0 and given != (self._seen_keys is not None):
            raise SampleError("give a key for every sample or for none (generated keys)")
        if not given:
            return
        if self._seen_keys is None:
            self._seen_keys = set()
        for key in block.keys:  # type: ignore[union-attr]
            check_key(key)
            if key in self._seen_keys:
                raise SampleError(f"duplicate sample key {key!r}")
            self._seen_keys.add(key)
            added.append(key)

    def _room(self) -> int:
        """Samples the current shard can still take under the sample limit."""
        used = self._shard.samples if self._shard is not None else 0
        return (self.shard_samples - used) if self.shard_samples else 1 << 62

    def _drain(self, final: bool) -> None:
        """Encode pending rows into records: whole records only, unless ``final`` or the
        record closes a shard at its sample limit (the only places a short record may be)."""
        if not self._pending:
            return
        block = RowBlock.concat(self._pending).with_numbers_as(self._schema)
        start, n = self._next_index, len(block)
        merged = merge_schema(self._schema, block.schema(start, self._schema), str(self.destination), error=SampleError)
        try:
            while (pos := self._next_index - start) < n:
                room = self._room()
                take = min(room, n - pos)
                if take < room and not final:
                    take -= take % self.pack
                if take == 0:
                    break
                self._write_records(block.slice(pos, pos + take))
                if self._shard is not None and self._room() == 0:
                    self._commit_shard()
        finally:  # (what is written is no longer pending, also where a later record failed; the schema is of the
            pos = self._next_index - start  # samples written: one left pending may yet be refused, and left out)
            if pos == n:
                self._schema = merged
            elif pos:
                self._schema = merge_schema(self._schema, block.slice(0, pos).schema(start, self._schema),
                                            str(self.destination), error=SampleError)
            if pos:
                self._pending = [block.slice(pos, n)] if pos < n else []
                self._pending_rows = n - pos

    def _write_records(self, block: RowBlock) -> None:
        """Write records of ``block`` to the current shard until it is done or the shard is full
        by bytes (``_next_index`` counts the rows written)."""
        layout = fixed_layout(block, self.pack)
        if layout is not None:
            self._write_fixed_records(block, layout)
            return
        for key, parts, rows in encode_records(block, self._next_index, self.pack):
            shard = self._open_shard()
            if (self.shard_bytes and shard.samples
                    and shard.position + member_bytes(sum(map(len, parts))) + len(END_OF_ARCHIVE) > self.shard_bytes):
                self._commit_shard()
                return  # re-cut the rest so that records align with the new shard
            shard.add_record(key, parts, rows)
            self._next_index += rows

    def _write_fixed_records(self, block: RowBlock, layout: FixedLayout) -> None:
        """The full records of ``block`` that fit the current shard, laid out at once."""
        shard = self._open_shard()
        fit = len(block) // self.pack
        if self.shard_bytes:
            room = (self.shard_bytes - len(END_OF_ARCHIVE) - shard.position) // layout.record_bytes
            fit = min(fit, room if shard.samples else max(room, 1))
        if fit <= 0:  # the shard is full (or past its limit, holding one record bigger than it)
            self._commit_shard()
            return
        records, rows = build_records(block.slice(0, fit * self.pack), layout, self._next_index, self.pack)
        shard.add_fixed_records(records, self.pack)
        self._next_index += rows

    def _open_shard(self) -> ShardFile:
        if self._shard is None:
            name = shard_name(self.prefix, len(self._shards))
            self._shard = ShardFile(self.destination.staging / name, name)
        return self._shard

    def _commit_shard(self) -> None:
        if self._shard is None or not self._shard.offsets:
            if self._shard is not None:
                self._shard.abort()
            self._shard = None
            return
        info = self._shard.commit()
        self._shard = None
        self.destination.publish(info.url)
        self._shards.append(info)
        self.progress.update(info.samples, info.bytes)


def _column_values(value: Any, name: str) -> Any:
    """A column as :meth:`ShardWriter.write` takes values one a sample: a pandas one's values as
    NumPy holds them (its gaps refused), a NumPy string array's as ``str`` (``bytes``), an object
    array's (a pandas text column's ``.values``) as the Python values it holds, each written as
    :meth:`ShardWriter.write` writes it."""
    if is_pandas(value):
        value = pandas_values(value, f"write_columns field {name!r}")
    if isinstance(value, np.ndarray) and value.dtype.kind in "USO" and value.ndim == 1:
        return value.tolist()
    if not hasattr(value, "__len__") or isinstance(value, (str, bytes, Mapping)) or getattr(value, "ndim", 1) == 0:
        raise TypeError(f"write_columns field {name!r}: a column holds one value a sample (an array, a list), got "
                        f"{type(value).__name__} {str(value)[:40]}; write one sample with write({{{name!r}: ...}})")
    return value
