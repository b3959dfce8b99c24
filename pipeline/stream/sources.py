"""The indexed shard sets a dataset reads: one, or several mixed by weight.

A mix is part of the epoch plan, not a wrapper around several loaders: each epoch takes from
every source its share (:func:`~pipeline.stream.material.mix_counts`), from where that source's
stream of passes stood (see :mod:`.material`), and the plan deals the pieces of all sources out
as it deals the chunks of one. So a mixed epoch keeps every promise of a plain one: exactly the
planned samples once each, equal batch counts on every rank, the same order for the same seed
and epoch, ``len()``, resume, and windows that mix sources as they mix shards.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from ..format.index import FieldSpec, Schema
from ..format.numbers import is_whole
from ..format.packing import SAMPLE_KEY
from ..storage.indexes import IndexedShards
from ..storage.retry import RetryPolicy
from .material import ChunkTable, HeldPass, Material, chunk_table, epoch_material, in_chunks, mix_counts
from .shards import ForeignShards, Location, resolve_shards
from .stats import ReadStats

#: What a dataset reads: one location, or a mix's, by name.
Sources = Location | Mapping[str, Location]


@dataclass
class SourceSet:
    """Indexed sources by name (one, named ``""``, when not mixed), the samples each gives an
    epoch, and where each source's stream stood at the start of epoch ``base_epoch``."""

    names: list[str]
    shards: list[IndexedShards]
    counts: list[int]
    chunks: list[ChunkTable] = field(default_factory=list)
    base_epoch: int = 0
    base_offsets: list[int] = field(default_factory=list)
    held: list[tuple[HeldPass, ...]] = field(default_factory=list)
    _fingerprints: list[str] = field(default_factory=list, repr=False)
    resumed: tuple[int, list[ChunkTable]] | None = None  # an epoch resumed in its middle, and its chunks
    _material: tuple[tuple, Material] | None = field(default=None, repr=False)

    @property
    def mixed(self) -> bool:
        return len(self.names) > 1 or self.names != [""]

    @property
    def samples(self) -> int:
        """Samples in an epoch (of all sources)."""
        return sum(self.counts)

    @property
    def sample_bytes(self) -> int:
        """Average bytes of a sample in the shards of all sources."""
        indexes = [shards.index for shards in self.shards]
        return max(sum(i.bytes for i in indexes) // max(sum(i.samples for i in indexes), 1), 1)

    def offsets(self, epoch: int) -> list[int]:
        """Where each source's stream stands at the start of ``epoch``."""
        base = self.base_offsets or [0] * len(self.names)
        return [o + (epoch - self.base_epoch) * n for o, n in zip(base, self.counts)]

    def material(self, seed: int, epoch: int, shuffle: bool) -> Material:
        """The epoch's material; the last one is kept (the main process asks again for progress)."""
        key = (seed, epoch, shuffle, tuple(self.offsets(epoch)), tuple(self.counts))  # (hold_passes forgets it)
        if self._material is None or self._material[0] != key:
            cuts = self.cuts(epoch)
            laid = epoch_material(cuts, self.counts, self.offsets(epoch), seed, epoch, shuffle, self.held)
            self._material = (key, in_chunks(laid, cuts, self.chunks))
        return self._material[1]

    def cuts(self, epoch: int) -> list[ChunkTable]:
        """The chunks each source's passes begun in ``epoch`` are cut into: the sources' chunks,
        but those an epoch resumed in its middle began on (another world size, or other
        ``chunks_per_buffer``, cuts others: its samples stay where they were)."""
        return self.resumed[1] if self.resumed is not None and self.resumed[0] == epoch else self.chunks

    def resume_cut(self, epoch: int, sizes: Sequence[int] | None) -> None:
        """Keep the chunks of ``sizes`` samples for ``epoch``, resumed in its middle (None: no epoch)."""
        self._material = None
        same = sizes is None or [c.per_chunk for c in self.chunks] == list(sizes)
        self.resumed = None if same else (epoch, [chunks if chunks.per_chunk == size else self._cut(s, size)
                                                  for s, (chunks, size) in enumerate(zip(self.chunks, sizes))])  # type: ignore[arg-type]

    def hold_passes(self, epoch: int, offsets: Sequence[int], began_with: Sequence[int]) -> None:
        """Where each source's stream stood at the start of ``epoch`` (a checkpoint's), and the
        chunk size its pass then under way began with: one cut anew since (at an epoch boundary,
        another ``shuffle_buffer`` or ``chunks_per_buffer``) goes on in its own order (see
        :class:`~.material.HeldPass`)."""
        self.base_epoch, self.base_offsets, self._material = epoch, list(offsets), None
        self.held = []
        for s, (cut, offset, size) in enumerate(zip(self.cuts(epoch), offsets, began_with)):
            held: list[HeldPass] = []
            if cut.samples:  # (a source without samples has no passes)
                number, within = divmod(offset, cut.samples)
                if within and size != cut.per_chunk:
                    held.append(HeldPass(number, self._cut(s, size)))
                # a pass an epoch resumed on chunks of its own leaves under way goes on in them
                following, rest = divmod(offset + self.counts[s], cut.samples)
                if cut is not self.chunks[s] and rest and all(h.number != following for h in held):
                    held.append(HeldPass(following, cut))
            self.held.append(tuple(held))

    def _cut(self, source: int, per_chunk: int) -> ChunkTable:
        index = self.shards[source].index
        return chunk_table(index.shards.samples, index.pack, per_chunk)

    def pass_chunks(self, epoch: int) -> list[int]:
        """The chunk size each source's pass under way at the start of ``epoch`` began with."""
        sizes = self.epoch_chunks(epoch)
        for s, (held, offset) in enumerate(zip(self.held, self.offsets(epoch))):
            number = offset // self.chunks[s].samples if self.chunks[s].samples else 0
            sizes[s] = next((h.chunks.per_chunk for h in held if h.number == number), sizes[s])
        return sizes

    def epoch_chunks(self, epoch: int) -> list[int]:
        """The chunk size of each source's passes begun in ``epoch``."""
        return [chunks.per_chunk for chunks in self.cuts(epoch)]

    def cut(self, window: int, chunks_per_window: int, world: int) -> None:
        """Cut the sources into chunks so that a rank's unit mixes about ``chunks_per_window`` of
        them, as it would the chunks of one set of all their samples. A unit holds ``window``
        samples, or an eighth of a rank's span of a smaller epoch (see :func:`~.plan.unit_size`;
        chunks cut for one rank would leave the units of ``W`` ranks ``W`` times fewer of them).

        A chunk is ``unit / chunks_per_window`` samples, or a source's share of a unit where that
        is smaller, so that every unit holds some of every source; but no smaller than half a
        chunk, so that a unit holds at most twice the chunks of one set however many sources are
        mixed (200 sources each in every unit read a tenth of a set's chunk at a time: 3 times
        slower). Cut by its own size instead, each source put ``chunks_per_window`` chunks in
        every unit: a mix of 200 sets of 500 samples was read a sample a piece, 17 times slower
        than one set of their samples. A source read several times over in an epoch is cut by
        its samples of the epoch, not its size. Independent of the workers; an epoch resumed in
        its middle on another world size keeps the chunks it began on (:meth:`resume_cut`)."""
        self.chunks, self._material = [], None
        epoch = sum(self.counts)
        unit = max(min(window, epoch // (8 * world)), 1)
        chunk = unit / chunks_per_window
        for s, count in enumerate(self.counts):
            share = unit * count / epoch if count else unit  # (a source not read: any cut will do)
            self.chunks.append(self._cut(s, max(int(min(chunk, max(share, chunk / 2))), 1)))

    def schema(self, fields: Sequence[str] | None) -> Schema:
        """The fields read (``fields``, or all), the same in every source: a field a source lacks,
        or holds with another type, is an error naming the sources and the field. ``"__key__"``,
        the samples' keys, is a field of every source."""
        stored = None if fields is None else [f for f in fields if f != SAMPLE_KEY]
        # the first source with fields: an empty set has none to agree with
        reference = next((i for i, shards in enumerate(self.shards) if shards.index.fields), 0)
        first, first_name = self.shards[reference].index.fields, self.names[reference]
        for name, shards in zip(self.names, self.shards):
            have = shards.index.fields
            missing = sorted(set(stored or ()) - set(have))
            if missing and have:  # an empty set has no fields to check against
                either = [part for field in missing if ";" in field for part in field.split(";")]
                hint = f"; fields lists each field read, the several an images key names too: {either}" if either \
                    else ""
                raise ValueError(f"fields {missing} are not in the index{f' of source {name!r}' if name else ''} "
                                 f"(it has {sorted(have)}){hint}")
            if stored is None and have and set(have) != set(first):
                raise ValueError(f"sources {first_name!r} and {name!r} have different fields "
                                 f"({sorted(set(have) ^ set(first))} are in one only); choose the fields "
                                 f"every source has with fields=")
            for f in have if stored is None else stored:
                if f in first and f in have and _batch_type(have[f]) != _batch_type(first[f]):
                    raise ValueError(f"field {f!r} is {have[f].dtype}{list(have[f].shape or [])} in source "
                                     f"{name!r} and {first[f].dtype}{list(first[f].shape or [])} in source "
                                     f"{first_name!r}: the sources of a mix must agree{_dtype_fix(f, have[f], first[f])}")
        schema = {f: first[f] for f in (first if stored is None else stored) if f in first}
        for f, spec in schema.items():  # optional if any source's samples may lack it
            if any(f in s.index.fields and s.index.fields[f].optional for s in self.shards):
                schema[f] = replace(spec, optional=True)
        if fields is not None and SAMPLE_KEY in fields:
            schema[SAMPLE_KEY] = FieldSpec("str", None)
        return schema

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_material": None}  # workers lay out their own: no copy of it in every pickle

    def fingerprints(self) -> list[str]:
        """A digest of each source's shard table (the shards' sample counts and sha256): what a
        checkpoint checks, so that a state taken mid-epoch never continues on other data."""
        if len(self._fingerprints) != len(self.shards):
            self._fingerprints = [_digest(shards) for shards in self.shards]
        return self._fingerprints

    def state(self, epoch: int) -> dict:
        """What a checkpoint records of the mix: the sources, their counts and their streams'
        positions at the start of ``epoch``, with the chunk size each one's pass under way began
        with."""
        return {"names": self.names, "counts": self.counts, "offsets": self.offsets(epoch),
                "pass_chunks": self.pass_chunks(epoch)}


def mixed_sources(shards: Mapping[str, IndexedShards], weights: Mapping[str, float] | None,
                  samples: Mapping[str, int] | None, epoch_samples: int | None) -> SourceSet:
    """The sources of a mix and the samples each gives an epoch (see :func:`mix_counts`)."""
    names = list(shards)
    for option, given, value_name in (("weights", weights, "weight"), ("samples", samples, "samples")):
        if given is not None and not isinstance(given, Mapping):
            raise TypeError(f"{option}= takes a mapping {{source name: {value_name}}} (the sources are {names}), "
                            f"got {given!r}")
        unknown = sorted(set(given or {}) - set(names), key=str)
        if unknown:
            raise ValueError(f"{option} names {unknown}, which are not sources (the sources are {names})")
    for name, value in (weights or {}).items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
            raise ValueError(f"the weight of source {name!r} must be a finite number >= 0, got {value!r}")
    for name, value in (samples or {}).items():
        if not is_whole(value) or value < 0:
            raise ValueError(f"samples= of source {name!r} must be a whole number >= 0, got {value!r}")
    if epoch_samples is not None and (not is_whole(epoch_samples) or epoch_samples < 1):
        raise ValueError(f"epoch_samples= must be a whole number >= 1 (the samples of an epoch of the mix), got "
                         f"{epoch_samples!r}")
    if epoch_samples is not None and samples and set(samples) == set(names) and sum(samples.values()) != epoch_samples:
        raise ValueError(f"samples= gives every source its count, {sum(samples.values())} in all, and epoch_samples= "
                         f"says {epoch_samples}: give one or the other")
    samples = None if samples is None else {name: int(value) for name, value in samples.items()}  # (NumPy's
    epoch_samples = None if epoch_samples is None else int(epoch_samples)  # integers overflow in the plan's seeds)
    _refuse_other_classes(shards)
    sizes = [shards[n].index.samples for n in names]
    if weights is not None:
        missing = [n for n in names if n not in weights and n not in (samples or {})]
        if missing:
            raise ValueError(f"sources {missing} have neither a weight nor samples=: give each source one "
                             f"(or no weights at all, for shares in proportion to the sources' sizes)")
    counts = mix_counts(sizes, [None if weights is None else weights.get(n) for n in names],
                        [(samples or {}).get(n) for n in names], epoch_samples)
    empty = [n for n, size, count in zip(names, sizes, counts) if count and not size]
    if empty:
        raise ValueError(f"sources {empty} hold no samples: a mix cannot take a share of them (give them weight 0, "
                         f"or leave them out)")
    return SourceSet(names, [shards[n] for n in names], counts)


def _refuse_other_classes(shards: Mapping[str, IndexedShards]) -> None:
    """Sources whose builds numbered their classes differently (``metadata["classes"]``: a list,
    or ``{column: list}`` for several columns of class names) give a label two meanings in a mix:
    an error naming the first such label. (One list may go on where the other ends: the labels
    both have still agree.)"""
    listed = [(name, _class_lists(s.index.metadata.get("classes"))) for name, s in shards.items()]
    for n, (name, lists) in enumerate(listed):
        for first, first_lists in listed[:n]:  # every pair: [a, b] agrees with [a, b, c] and [a, b, d], not they
            for column in first_lists.keys() & lists.keys():
                first_classes, classes = first_lists[column], lists[column]
                label = next((i for i, (a, b) in enumerate(zip(first_classes, classes)) if a != b), None)
                if label is not None:
                    field = f"field {column!r}: " if column else ""
                    raise ValueError(
                        f"sources {first!r} and {name!r} number their classes differently: {field}label {label} "
                        f"is {first_classes[label]!r} in {first!r} and {classes[label]!r} in {name!r} ({first!r}: "
                        f"{first_classes}, {name!r}: {classes}); build them with one class list "
                        f"(classes=[...] of build_imagefolder, build_sample_files or build_joblib; --classes a,b,c "
                        f"of pipeline build imagefolder, files or joblib; a datasets ClassLabel column: "
                        f"Dataset.align_labels_with_mapping before saving)")


def _class_lists(classes: Any) -> dict[str, list]:
    """``metadata["classes"]`` as ``{column: names}`` (``""`` for the one list of a build)."""
    if isinstance(classes, list):
        return {"": classes}
    if isinstance(classes, dict):
        return {column: names for column, names in classes.items() if isinstance(names, list)}
    return {}


def _digest(shards: IndexedShards) -> str:
    table = shards.index.shards
    digest = hashlib.sha256(np.ascontiguousarray(table.samples, np.int64).tobytes())
    digest.update(np.ascontiguousarray(table.sha256).tobytes())
    return digest.hexdigest()[:16]


def single_source(shards: IndexedShards) -> SourceSet:
    return SourceSet([""], [shards], [shards.index.samples])


def _check_location(location: Any, what: str, mix: bool = True) -> None:
    """Refuse what names no shards, saying what does (else a ``None`` failed as "not iterable")."""
    if isinstance(location, (str, os.PathLike)) or hasattr(location, "__iter__") and not isinstance(
            location, (Mapping, bytes)):  # (a list, a glob's generator, an array of paths: their items are checked)
        return
    mixes = ", or a mapping {name: index} of sources to mix" if mix else ""
    shown = repr(location) if len(repr(location)) <= 60 else repr(location)[:57] + "..."
    raise TypeError(f"{what} is an index (a folder, index.json or its URL), a brace pattern or a list of shard "
                    f"paths{mixes}; got {type(location).__name__} {shown}")


def open_sources(source: Sources, weights: Mapping[str, float] | None, samples: Mapping[str, int] | None,
                 epoch_samples: int | None, world_size: int, allow_uneven: bool, policy: RetryPolicy,
                 stats: ReadStats) -> tuple[IndexedShards | ForeignShards, SourceSet | None]:
    """The shards a dataset reads first, and the indexed sources of its plan (``None`` for shards
    without an index, which only a single source may be, and under DDP only when ranks may differ)."""
    if isinstance(source, Mapping):
        if not source:
            raise ValueError("an empty mapping mixes no source: give {name: index} for each source to mix")
        for name in source:
            if not isinstance(name, str) or not name or "/" in name:
                raise ValueError(f"a mix names its sources by non-empty strings without '/' (a sample's key is "
                                 f"'name/key', and progress() counts by name), got {name!r}")
            _check_location(source[name], f"source {name!r} of the mix", mix=False)
        opened = {name: resolve_shards(location, policy, stats) for name, location in source.items()}
        foreign = [name for name, shards in opened.items() if not isinstance(shards, IndexedShards)]
        if foreign:
            raise ValueError(f"sources {foreign} have no index: a mix is planned from indexes; index them "
                             f"in place first (pipeline index SHARDS...)")
        sources = mixed_sources(opened, weights, samples, epoch_samples)  # type: ignore[arg-type]
        return sources.shards[0], sources
    if weights or samples or epoch_samples:
        raise ValueError("weights=, samples= and epoch_samples= mix several sources: give them as a "
                         "mapping {name: index}")
    _check_location(source, "the source")
    shards = resolve_shards(source, policy, stats)
    if isinstance(shards, ForeignShards):
        if world_size > 1 and not allow_uneven:
            raise ValueError(
                f"{len(shards.urls)} shards without an index, under DDP (world size {world_size}): "
                f"ranks would get different numbers of samples, and DDP hangs when one runs out before the "
                f"others. Index them in place first (pipeline index SHARDS...: exact epochs, equal batches "
                f"on every rank), or pass allow_uneven=True if your loop copes with ranks that differ "
                f"(DDP join(), say)")
        return shards, None
    return shards, single_source(shards)


#: The arrays a batch makes of a field of Python numbers (a ``.cls`` of WebDataset shards indexed
#: in place, a ShardWriter's ints): what a field of NumPy scalars of that type makes too.
_NUMBERS_AS_ARRAYS = {"int": "int64", "float": "float64", "bool": "bool"}


def _batch_type(spec: FieldSpec) -> tuple[str, tuple[int | None, ...] | None]:
    """A field's type as its batches have it: Python ints mix with NumPy's int64 scalars."""
    if spec.shape is None and spec.dtype in _NUMBERS_AS_ARRAYS:
        return _NUMBERS_AS_ARRAYS[spec.dtype], ()
    return spec.dtype, spec.shape


def _dtype_fix(name: str, one: FieldSpec, other: FieldSpec) -> str:
    """How to make two sources' field ``name`` agree, where only its dtype differs: a cast at build
    time, which arrays take (a field of Python values, ``str`` beside ``bytes``, takes none)."""
    if one.shape != other.shape or one.shape is None:
        return ""
    return (f" (build one of them again with dtypes={{{name!r}: {str(other.dtype)!r}}}, or --dtype "
            f"{name}={other.dtype} on the command line)")
