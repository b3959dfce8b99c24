"""How many samples of each source an epoch has delivered so far, over all ranks and all legs:
from the plan alone, so the same on every rank, without communication.

Wholly delivered units of the epoch's first leg are stretches of the material, counted piece by
piece; the units of later legs, and a unit delivered in part, are followed sample by sample
(:func:`~pipeline.stream.plan.material_positions`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .material import Material, laps, source_counts
from .plan import Leg, PlanConfig, RankSequence, delivered_in, material_positions, rank_batches


def delivered_per_source(material: Material, sources: int, sequences: list[list[RankSequence]],
                         legs: Sequence[Leg], config: PlanConfig, epoch: int) -> np.ndarray:
    """Samples of each of ``sources`` delivered by every rank of every one of ``legs``."""
    counts = np.zeros(sources, np.int64)
    for j, leg in enumerate(legs):
        for sequence in sequences[j]:
            # (a rank's short last batch dropped is not delivered, though the ranks' counts of batches agree)
            delivered = min(delivered_in(sequence, leg, config), rank_batches(sequence, config) * config.batch_size)
            touched = int(sequence.unit_of(delivered - 1)) + 1 if delivered else 0
            first = 0
            if j == 0:  # the whole units: one stretch of the material
                first = touched if delivered == sequence.length else int(sequence.unit_of(delivered))
                whole = sequence.unit_range(first - 1)[1] if first else 0
                counts += stretch_counts(material, sequence.start, sequence.start + whole, sources)
            for u in range(first, touched):
                positions, _ = material_positions(sequences[:j + 1], legs[:j + 1], config, epoch, sequence.rank, [u])
                counts += source_counts(material, positions[:delivered - u * sequence.unit], sources)
    return counts


def stretch_counts(material: Material, start: int, stop: int, sources: int) -> np.ndarray:
    """Samples of each source at material positions ``[start, stop)`` (past the end: wrapping)."""
    counts = np.zeros(sources, np.int64)
    sizes = material.hi.astype(np.int64) - material.lo
    for lap_start, lap_stop in laps(start, stop, material.samples):
        first = int(np.searchsorted(material.starts, lap_start, side="right")) - 1
        last = int(np.searchsorted(material.starts, lap_stop, side="left"))  # pieces [first, last)
        counts += np.bincount(material.source[first:last], weights=sizes[first:last],
                              minlength=sources).astype(np.int64)
        counts[material.source[first]] -= lap_start - material.starts[first]
        counts[material.source[last - 1]] -= material.starts[last] - lap_stop
    return counts
