"""The epoch plan: which samples each rank delivers, in which batches, and which worker reads them.
Pure functions of (the material, seed, epoch, the legs of the epoch, batch size, window).

The epoch's ``N`` sample positions (its material, :mod:`.material`) are cut into ``W`` equal
rank spans (the ``N mod W`` rest dropped, padded by wrapping around, or kept). Each rank cuts
its span into *units* of whole batches (about the shuffle window, and at least 8 a rank when
the span allows), emits each unit in an order drawn from its position, and so has one sequence:
batch ``k`` of the rank is positions ``[k*B, (k+1)*B)`` of it, whatever the number of workers.
Unit ``u`` is read by worker ``u mod K`` as one message, which makes DataLoader's in-order round
robin over its workers deliver the units in their order: the batches of a rank do not depend on
``K``, and a run resumed on any number of workers continues the very same batches.

A *leg* is a stretch of the epoch on one world size. When a run resumes mid-epoch on another
world size, the samples the ranks had not delivered (each rank's sequence after its batches
done) are laid end to end, rank after rank, and that *pool* is cut again into rank spans of the
new world size, units and sequences, for the next leg: every sample is delivered once in the
epoch, and every rank of every leg yields the same number of batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

import numpy as np

from .material import Draw, rng_for

Remainder = Literal["drop", "pad", "keep"]
#: A rank's span is cut into at least this many units when it is long enough, so that this many
#: workers a rank all have work, whatever the window.
UNITS_PER_RANK = 8


@dataclass(frozen=True)
class Leg:
    """A stretch of an epoch on ``world`` ranks, of which each delivered ``batches`` batches."""

    world: int
    batches: int


@dataclass(frozen=True)
class PlanConfig:
    """What the plan depends on besides the material, the epoch and its legs."""

    seed: int
    batch_size: int
    drop_last: bool
    remainder: Remainder
    shuffle: bool
    window: int  # samples a unit holds at most (the shuffle window), rounded up to whole batches
    short_last_unit: bool = False  # the layout of version 3 and before (see RankSequence.units)


def rank_span(samples: int, world: int, rank: int, remainder: Remainder) -> tuple[int, int]:
    """Positions ``[start, stop)`` of a rank; ``stop`` may pass ``samples`` when padding."""
    if remainder == "keep":
        return rank * samples // world, (rank + 1) * samples // world
    length = samples // world if remainder == "drop" else -(-samples // world)
    return rank * length, (rank + 1) * length


def leg_remainder(samples: int, world: int, config: PlanConfig) -> Remainder:
    """The remainder policy a leg of ``samples`` positions on ``world`` ranks takes: with
    ``drop_last``, ``"pad"`` pads only where its repeats complete a batch; elsewhere each rank's
    short last batch is dropped anyway, and a repeat shuffled into a full batch would stand in
    for a real sample dropped with it (``"drop"`` then gives the same batches, no repeat)."""
    if config.remainder != "pad" or not config.drop_last or samples % world == 0:
        return config.remainder
    padded = batches_of(-(-samples // world), config.batch_size, True)
    return "pad" if padded > batches_of(samples // world, config.batch_size, True) else "drop"


def batches_of(samples: int, batch_size: int, drop_last: bool) -> int:
    return samples // batch_size if drop_last else -(-samples // batch_size)


def unit_size(length: int, config: PlanConfig) -> int:
    """Samples in each unit of a rank sequence of ``length``: whole batches, at most the window."""
    batch = config.batch_size
    return batch * max(1, min(-(-config.window // batch), length // (UNITS_PER_RANK * batch)))


@dataclass(frozen=True)
class RankSequence:
    """What rank ``rank`` emits in leg ``leg``: positions ``[start, start + length)`` of the
    leg's pool (of ``pool`` positions, wrapping around when padded), in units of ``unit``
    samples, each emitted in its own order."""

    leg: int
    rank: int
    start: int
    length: int
    pool: int
    unit: int
    short_last_unit: bool = False

    @property
    def units(self) -> int:
        """The units of the sequence: a rest shorter than a quarter of a unit is part of the last whole
        one, as a unit of its own would be one or two chunks: batches of one shard, one class."""
        units = -(-self.length // self.unit)
        rest = self.length - (units - 1) * self.unit
        return units - 1 if units > 1 and 4 * rest < self.unit and not self.short_last_unit else units

    def unit_range(self, u: int) -> tuple[int, int]:
        """Sequence positions ``[begin, end)`` of unit ``u``."""
        return u * self.unit, self.length if u == self.units - 1 else min((u + 1) * self.unit, self.length)

    def unit_of(self, within: np.ndarray | int) -> np.ndarray | int:
        """The unit of each of the sequence positions ``within``."""
        return np.minimum(within // self.unit, max(self.units - 1, 0))

    def unit_order(self, u: int, config: PlanConfig, epoch: int) -> np.ndarray:
        """Pool positions of unit ``u``'s samples, in emission order: drawn from its place."""
        begin, end = self.unit_range(u)
        order = np.arange(begin, end, dtype=np.int64)
        if config.shuffle:
            rng_for(Draw.UNIT, config.seed, epoch, self.leg, self.rank, u).shuffle(order)
        return (self.start + order) % max(self.pool, 1)


def leg_sequences(samples: int, config: PlanConfig, legs: Sequence[Leg]) -> list[list[RankSequence]]:
    """Every rank's sequence in every leg of an epoch of ``samples`` positions (the last leg the
    current one). A leg's pool is what the ranks of the leg before had not delivered."""
    out: list[list[RankSequence]] = []
    pool = samples
    for j, leg in enumerate(legs):
        ranks = []
        remainder = leg_remainder(pool, leg.world, config)
        for r in range(leg.world):
            start, stop = rank_span(pool, leg.world, r, remainder)
            length = stop - start if pool else 0
            ranks.append(RankSequence(j, r, start, length, pool, unit_size(length, config), config.short_last_unit))
        out.append(ranks)
        pool = sum(s.length - delivered_in(s, leg, config) for s in ranks)
    return out


def delivered_in(sequence: RankSequence, leg: Leg, config: PlanConfig) -> int:
    """Positions of ``sequence`` delivered in ``leg``'s batches."""
    return min(leg.batches * config.batch_size, sequence.length)


def pool_to_previous(positions: np.ndarray, previous: list[RankSequence], leg: Leg,
                     config: PlanConfig) -> tuple[np.ndarray, np.ndarray]:
    """For positions of a leg's pool: the rank of the leg before whose sequence holds each, and
    the position in that sequence (the pool lays the undelivered rest of each rank end to end)."""
    skipped = np.array([delivered_in(s, leg, config) for s in previous], dtype=np.int64)
    rest = np.array([s.length for s in previous], dtype=np.int64) - skipped
    firsts = np.concatenate([[0], np.cumsum(rest)])
    ranks = np.searchsorted(firsts, positions, side="right") - 1
    return ranks, positions - firsts[ranks] + skipped[ranks]


def material_positions(sequences: list[list[RankSequence]], legs: Sequence[Leg], config: PlanConfig, epoch: int,
                       rank: int, units: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The material positions of the samples of ``units`` of ``rank``'s sequence in the last
    leg, in emission order, and for each the *block* that holds it: the unit of the epoch's
    first leg it comes from (a contiguous run of positions, read at once), numbered
    ``rank * 2**32 + unit``."""
    current = sequences[-1][rank]
    positions = np.concatenate([current.unit_order(u, config, epoch) for u in units])
    if len(sequences) == 1:  # the first leg: its pool is the material, its units are the blocks
        sizes = [current.unit_range(u)[1] - current.unit_range(u)[0] for u in units]
        return positions, np.repeat(np.asarray(units, dtype=np.int64) + (rank << 32), sizes)
    blocks = np.zeros(0, np.int64)
    for j in range(len(sequences) - 1, 0, -1):  # back through the legs: pool -> sequence of the leg before
        ranks, within = pool_to_previous(positions, sequences[j - 1], legs[j - 1], config)
        if j == 1:
            blocks = ranks.astype(np.int64) * (1 << 32)
            for r in np.unique(ranks).tolist():
                mask = ranks == r
                blocks[mask] += sequences[0][r].unit_of(within[mask])
        positions = np.empty_like(within)
        for r in np.unique(ranks).tolist():
            mask = ranks == r
            positions[mask] = sequence_positions(sequences[j - 1][r], within[mask], config, epoch)
    return positions, blocks


def sequence_positions(sequence: RankSequence, within: np.ndarray, config: PlanConfig, epoch: int) -> np.ndarray:
    """Pool positions of the samples at sequence positions ``within`` (emitted unit by unit)."""
    out = np.empty(len(within), dtype=np.int64)
    units = sequence.unit_of(within)
    for u in np.unique(units).tolist():
        mask = units == u
        order = sequence.unit_order(u, config, epoch)
        out[mask] = order[within[mask] - u * sequence.unit]
    return out


def block_range(block: int, first_leg: list[RankSequence]) -> tuple[int, int]:
    """Material positions ``[start, stop)`` of a block (a unit of the epoch's first leg)."""
    sequence = first_leg[block >> 32]
    begin, end = sequence.unit_range(block & 0xFFFFFFFF)
    return sequence.start + begin, sequence.start + end


def worker_units(sequence: RankSequence, done_batches: int, config: PlanConfig, worker: int,
                 workers: int) -> tuple[list[int], int]:
    """The units of ``sequence`` that ``worker`` of ``workers`` reads once ``done_batches`` of the
    rank are delivered: every ``workers``-th unit from the first one not wholly delivered; and
    how many samples of its first unit were delivered already (when that unit is this worker's)."""
    first = int(sequence.unit_of(done_batches * config.batch_size))
    skip = done_batches * config.batch_size - first * sequence.unit
    units = list(range(first + worker, sequence.units, workers))
    return units, skip if worker == 0 else 0


def rank_batches(sequence: RankSequence, config: PlanConfig) -> int:
    return batches_of(sequence.length, config.batch_size, config.drop_last)


def worker_reads(sequences: list[list[RankSequence]], legs: Sequence[Leg], config: PlanConfig, epoch: int,
                 rank: int, worker: int, workers: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """What ``worker`` of ``workers`` reads for ``rank`` in the last of ``legs`` (whose batches
    are those the rank delivered so far): for each of its units in order, the material positions
    of its samples in emission order and their blocks (see :func:`material_positions`), less
    what was delivered already and, with ``drop_last``, the rank's short last batch."""
    sequence = sequences[-1][rank]
    units, skip = worker_units(sequence, legs[-1].batches, config, worker, workers)
    stop = rank_batches(sequence, config) * config.batch_size
    for i, u in enumerate(units):
        begin, end = sequence.unit_range(u)
        first, last = begin + (skip if i == 0 else 0), min(end, stop)
        if last > first:
            positions, blocks = material_positions(sequences, legs, config, epoch, rank, [u])
            yield positions[first - begin:last - begin], blocks[first - begin:last - begin]

