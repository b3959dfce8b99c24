"""Decode the image fields of a unit, in a worker, after its rows are gathered in emission order.

A unit is decoded into one ``uint8`` buffer per field (shared memory in a ShardLoader's worker,
so that the batch crosses to the main process without a copy). An image that cannot be decoded
raises a :class:`~pipeline.format.errors.ShardError` naming its shard, record, key and field; under
``on_error="skip"`` its whole row is replaced by another row of the unit (so that every rank keeps
the same batches), logged and counted in ``stats()`` as a skipped piece and a replaced sample.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ..caller_warning import warn_caller
from ..format.errors import ShardError
from ..format.index import Schema
from ..format.packing import SAMPLE_KEY
from .batching import shared_empty
from .image_decoders import single_threaded
from .images import MISSING_IMAGE, Images
from .material import row_seeds
from .options import SKIP_HINT
from .reader import Columns
from .skip_log import log_skip
from .stats import Count, ReadStats

#: Where the unit's row ``row`` came from: ``(shard URL, byte offset, "record N (key 'k')")``
Provenance = Callable[[int], tuple[str, int | None, str]]
log = logging.getLogger("pipeline.stream")


def check_image_fields(images: Mapping[str, Images], schema: Schema | None,
                       fields: Sequence[str] | None = None) -> dict[str, Images]:
    """The ``images`` option, checked against the fields read (``fields``, and the index's when
    there is one)."""
    if not isinstance(images, Mapping):
        raise TypeError(f"images takes a dict of field names to Images(...), such as images={{'image': Images(224)}}, "
                        f"got {type(images).__name__}")
    for key, spec in images.items():
        if not isinstance(spec, Images):
            raise TypeError(f"images[{key!r}] must be an Images(...), got {type(spec).__name__}")
        if schema is None and len(alternatives(key)) > 1:
            raise ValueError(f"images={{{key!r}: ...}} reads whichever of several fields a sample has, which needs an "
                             f"index of the shards (without one, the fields read are those of the first record): "
                             f"index them first (pipeline index SHARDS)")
        for name in alternatives(key):
            if fields is not None and name not in fields:
                raise ValueError(f"images names field {name!r}, which fields={list(fields)} leaves out: add it to "
                                 f"fields")
            if schema and name not in schema:
                raise ValueError(f"images names field {name!r}, which the index does not have (it has "
                                 f"{sorted(schema)})")
            if schema and schema[name].dtype != "bytes":
                raise ValueError(f"images names field {name!r}, which holds {schema[name].dtype}, not image bytes")
        if schema and key in schema and schema[key].optional:
            warn_caller(f"images names field {key!r}, which some samples lack (the index marks it optional): each "
                        f"of them is an error, or with on_error='skip' replaced by another sample; if the others "
                        f"hold their image in another field (.png where these have .jpg), name both: "
                        f"images={{'jpg;png': ...}} decodes whichever a sample has")
    return dict(images)


def alternatives(key: str) -> list[str]:
    """The fields an ``images`` key names: ``"jpg;png"`` is a sample's ``jpg``, or its ``png``
    where it has no ``jpg`` (as webdataset's ``to_tuple("jpg;png")`` reads them)."""
    return key.split(";")


@dataclass
class ImageDecoding:
    """The image fields of a dataset and how to decode them (picklable: each worker has it)."""

    images: dict[str, Images]
    seed: int
    skip: bool  # on_error="skip"
    stats: ReadStats

    @property
    def decoded_bytes(self) -> int:
        """Bytes of one sample's decoded images."""
        return sum(3 * spec.shape[0] * spec.shape[1] for spec in self.images.values())

    def apply(self, unit: Columns, places: np.ndarray, epoch: int, shared: bool, where: Provenance) -> Columns:
        """``unit`` with each image field decoded; ``places`` (a row's place in the epoch) seed
        the random crops and flips."""
        if get_worker_info() is not None:
            single_threaded(os.getpid())
        with self.stats.timing(Count.DECODE):
            failed: dict[int, str] = {}
            for name, spec in self.images.items():
                values = _first_present(unit, alternatives(name))
                out = shared_empty(spec.batch_shape(len(values)), np.dtype(np.uint8)) if shared else \
                    np.empty(spec.batch_shape(len(values)), np.uint8)
                seeds = row_seeds(self.seed, epoch, places) if spec.random else None
                bad = spec.decode_into(values, out.numpy() if isinstance(out, torch.Tensor) else out, seeds)
                failed.update({row: f"field {name!r}: {reason}" for row, reason in bad.items() if row not in failed})
                unit[name] = out
            if failed:
                self._bad_rows(unit, failed, where)
        return unit

    def stream(self, units: Iterator[tuple[Columns, np.ndarray]], consumer: int, epoch: int,
               shared: bool) -> Iterator[tuple[Columns, np.ndarray]]:
        """Units of shards without an index, with their rows' places (see
        :func:`~.foreign.stream_places`), decoded."""
        for unit, places in units:
            done = int(places[0]) - (consumer << 40)

            def where(row: int, first: int = done, keys: Sequence | None = unit.get(SAMPLE_KEY)) -> tuple[str, None, str]:
                key = f", key {str(keys[row])!r}" if keys is not None else " (fields=[..., '__key__'] names its key)"
                return (f"the shards of consumer {consumer} (no index)", None,
                        f"sample {first + row} of its stream{key} (index the shards, pipeline index, for errors that "
                        f"name the shard and record)")
            yield self.apply(unit, places, epoch, shared, where), places

    def _bad_rows(self, unit: Columns, failed: dict[int, str], where: Provenance) -> None:
        rows = len(next(iter(unit.values())))
        good = [row for row in range(rows) if row not in failed]
        for row, reason in sorted(failed.items()):
            url, offset, record = where(row)
            if not self.skip:
                other = "name each field a sample may hold its image in (images={'jpg;png': ...} decodes whichever " \
                        "it has), or " if reason.endswith(MISSING_IMAGE) else ""
                raise ShardError(url, offset, f"{record}, {reason}; {other}{SKIP_HINT} to train on other samples in "
                                              f"its place")
            if not good:
                raise ShardError(url, offset, f"{record}, {reason}; no image of its unit could be decoded, so "
                                              f"none can stand in for it (a unit can be as small as a batch, or a "
                                              f"rank's whole share of a small epoch): find the images that fail "
                                              f"with pipeline verify --images, and mend or remove them")
            at = "" if offset is None else f" (at byte {offset})"
            log_skip(log, url, f"the image of {record}{at}, its sample replaced by another of its unit,", reason)
            self.stats.skipped(1)
            _copy_row(unit, row, good[row % len(good)])


def _first_present(unit: Columns, names: list[str]) -> list:
    """Each row's value of the first of the fields ``names`` that it has (the fields, if
    several, leave the unit: their decoded image takes the place of all of them)."""
    if len(names) == 1:
        return unit[names[0]]
    columns = [unit.pop(name) for name in names]
    return [next((value for value in row if value is not None), None) for row in zip(*columns)]


def _copy_row(unit: Columns, row: int, source: int) -> None:
    """Row ``row`` of every column (a list, an array or a tensor) becomes a copy of row ``source``."""
    for column in unit.values():
        column[row] = column[source]
