"""Shard sets for the mixing tests: sources of very different sizes, each sample numbered by ``i``
with the source's own offset (``source * 10**6 + n``), so that a batch says where each sample came from."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

import pipeline

#: 50k, 5k and 500 samples, mixed 0.5 / 0.3 / 0.2: the large source is subsampled, the small one repeated.
SIZES = {"large": 50_000, "medium": 5_000, "small": 500}
WEIGHTS = {"large": 0.5, "medium": 0.3, "small": 0.2}
OFFSET = {name: k * 10**6 for k, name in enumerate(SIZES)}


def source_shards(folder: Path, name: str, samples: int, extra: dict | None = None) -> Path:
    """A source of ``samples`` samples in shards of uneven sizes: ``i`` numbers them, ``x`` is ``2*i``."""
    i = OFFSET.get(name, 0) + np.arange(samples, dtype=np.int64)
    arrays = {"i": i, "x": (2 * i).astype(np.float32), **(extra or {})}
    pipeline.write_shards(folder / name, arrays, prefix=name, pack=8, shard_samples=max(samples // 5 + 3, 16),
                          quiet=True)
    return folder / name


def mix_folder(folder: Path) -> dict[str, str]:
    return {name: str(source_shards(folder, name, n)) for name, n in SIZES.items()}


def source_of(ids) -> list[str]:
    names = list(SIZES)
    return [names[int(i) // 10**6] for i in ids]


def per_source(ids) -> dict[str, int]:
    counts = Counter(source_of(ids))
    return {name: counts.get(name, 0) for name in SIZES}
