"""Shard sets for the streaming tests: uneven shard sizes, every sample numbered by ``i``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import pipeline


class CutSource(pipeline.ArraySource):
    """Arrays cut into shards at the given row bounds (to make uneven shards on purpose)."""

    def __init__(self, arrays: dict, bounds: list[int]) -> None:
        super().__init__(arrays)
        self.bounds = bounds

    def shard_bounds(self, shard_samples, shard_bytes, pack) -> list[int]:
        return self.bounds


def uneven_shards(folder: Path, sizes: list[int], pack: int = 1, seed: int = 0) -> Path:
    """Shards of the given sizes; field ``i`` numbers the samples 0..N-1, ``x`` is 2*i as float32."""
    total = sum(sizes)
    i = np.arange(total, dtype=np.int64)
    arrays = {"i": i, "x": np.stack([2 * i, -i], axis=1).astype(np.float32)}
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    pipeline.build_shards(CutSource(arrays, bounds), folder, "part", pack=pack, quiet=True)
    return folder


def random_sizes(count: int, low: int, high: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(low, high, count).tolist()


def text_shards(folder: Path, samples: int = 4000) -> Path:
    """Samples numbered by ``i``, each with a ``name`` of 1,800 characters: a unit of 1,024 is a
    message of 1.8 MB, larger than the pipe from the workers holds."""
    names = np.array([f"{i:06d}" * 300 for i in range(samples)])
    pipeline.write_shards(folder, {"i": np.arange(samples), "name": names}, quiet=True)
    return folder
