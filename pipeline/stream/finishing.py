"""What a worker delivers of a unit it gathered: the unit's columns as tensors (the loader cuts
the batches), or, where the user's transforms may make a batch anything, the finished batches,
each batch's transforms run with the seeds of its place in the epoch (:mod:`.transform_seeds`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from .batching import FinishedBatches, batch_transformed, listed, per_sample, picked, split_message, to_torch
from .reader import Columns
from .stats import Count, ReadStats
from .stopped_transforms import stopped_between_calls
from .transform_seeds import BatchSeed, seeded_batches


@dataclass(frozen=True)
class Finishing:
    """The options that finish a batch; ``varied``: the fields batches hold as lists (see
    :func:`.batching.listed`)."""

    batch_size: int
    sample_transform: Callable[[dict[str, Any]], dict[str, Any]] | None
    batch_transform: Callable[[dict[str, Any]], Any] | None
    varied: frozenset[str]
    as_tuple: Sequence[str] | None
    read_stats: ReadStats

    @property
    def plain(self) -> bool:
        """Whether a worker's messages are a unit's columns as gathered (no transform made them)."""
        return self.sample_transform is None and self.batch_transform is None

    def unit_message(self, unit: Columns, seeds: list[BatchSeed] | None) -> Any:
        """What a ShardLoader's worker sends of a unit: its columns as one message, or its
        finished batches."""
        if self.plain:
            out = to_torch(unit)
            return tuple(out[name] for name in self.as_tuple) if self.as_tuple is not None else out
        return FinishedBatches(self.batches(unit, seeds, in_worker=True))

    def batches(self, unit: Columns, seeds: list[BatchSeed] | None, in_worker: bool) -> Iterator[Any]:
        """The unit's batches as delivered (``seeds``: see :func:`.transform_seeds.seeded_batches`);
        ``in_worker``: in a ShardLoader's worker, whose transforms are watched for a stop."""
        return seeded_batches(split_message(unit, self.batch_size), seeds, lambda batch: self._finish(batch, in_worker),
                              lambda: self.read_stats.timing(Count.TRANSFORM))

    def _finish(self, batch: Columns, in_worker: bool) -> Any:
        watched = stopped_between_calls if in_worker else lambda function: function
        if self.sample_transform is not None:
            out = to_torch(per_sample(batch, watched(self.sample_transform), self.varied))
        else:
            out = listed(to_torch(batch), self.varied)
        if self.batch_transform is not None:
            out = batch_transformed(watched(self.batch_transform), out)
        return out if self.as_tuple is None else picked(out, self.as_tuple)
