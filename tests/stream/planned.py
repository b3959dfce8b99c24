"""The samples a plan delivers, computed with the very functions the dataset reads by (no shards
read): the ground truth of the plan tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.stream.material import ChunkTable, chunk_table, epoch_material
from pipeline.stream.plan import Leg, PlanConfig, leg_sequences, worker_reads


@dataclass
class Planned:
    """Sources (shard sizes each), cut into chunks, and the samples of each epoch."""

    shard_sizes: list[list[int]]
    counts: list[int]
    chunk: int = 20
    pack: int = 1

    def __post_init__(self) -> None:
        self.chunks: list[ChunkTable] = [chunk_table(sizes, self.pack, self.chunk) for sizes in self.shard_sizes]
        self.shard_starts = [np.concatenate([[0], np.cumsum(sizes)]) for sizes in self.shard_sizes]

    def sample_ids(self, material, positions: np.ndarray) -> np.ndarray:
        """``source * 10**9 + sample number`` of each material position (positions past the end wrap)."""
        wrapped = positions % material.samples
        pieces = np.searchsorted(material.starts, wrapped, side="right") - 1
        sources = material.source[pieces].astype(np.int64)
        out = np.empty(len(positions), np.int64)
        for s in np.unique(sources).tolist():
            mask = sources == s
            chunks = material.chunk[pieces[mask]].astype(np.int64)
            table = self.chunks[s]
            shard = np.searchsorted(table.first_chunk, chunks, side="right") - 1
            row = (chunks - table.first_chunk[shard]) * table.per_chunk + material.lo[pieces[mask]] \
                + wrapped[mask] - material.starts[pieces[mask]]
            out[mask] = s * 10**9 + self.shard_starts[s][shard] + row
        return out

    def batches(self, config: PlanConfig, epoch: int, legs: list[Leg], rank: int, workers: int,
                offsets: list[int] | None = None) -> list[list[int]]:
        """The batches (sample ids) ``rank`` delivers in the last of ``legs``, units taken from the
        workers in DataLoader's round robin."""
        offsets = offsets if offsets is not None else [epoch * n for n in self.counts]
        material = epoch_material(self.chunks, self.counts, offsets, config.seed, epoch, config.shuffle)
        sequences = leg_sequences(sum(self.counts), config, legs)
        reads = [list(worker_reads(sequences, legs, config, epoch, rank, w, workers)) for w in range(workers)]
        ids: list[int] = []
        for i in range(max((len(r) for r in reads), default=0)):
            for worker_units in reads:
                if i < len(worker_units):
                    ids.extend(self.sample_ids(material, worker_units[i][0]).tolist())
        return [ids[k:k + config.batch_size] for k in range(0, len(ids), config.batch_size)]
