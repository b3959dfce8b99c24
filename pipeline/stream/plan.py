"""The epoch plan: which samples each (rank, worker) reads, in which order. Pure functions.

Shards are cut into *chunks* (runs of whole records, small next to the shuffle buffer). For
epoch ``e`` with seed ``s`` the chunks are permuted by ``(s, e)`` and their samples laid end to
end: that is the epoch's global sequence of ``N`` sample positions. The sequence is cut into
``W`` equal rank spans (the ``N mod W`` remainder dropped, or padded by wrapping around to the
start), and each rank span into ``K`` worker spans differing by at most one sample. Every rank
thus yields the same number of batches, and every sample is read exactly once per epoch.

A worker reads its span in *windows* of ``S`` samples (the shuffle buffer) and emits each window
in an order drawn from ``(s, e, span start, window number)``. Because that order depends on
positions only, never on data, a resumed worker recomputes where it stands and re-reads at most
one window. A worker's work is a list of :class:`Segment` s (ranges of a span's emission order):
one whole span normally, the unread rest after a resume, or, when a run resumes with a different
number of workers, pieces of the old workers' spans dealt out to the new workers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Sequence

import numpy as np

Remainder = Literal["drop", "pad", "keep"]


@dataclass(frozen=True)
class ChunkTable:
    """Chunks of a shard set: each shard cut into chunks of ``per_chunk`` samples (its last one
    shorter), numbered shard after shard; shard ``s`` holds chunks ``[first_chunk[s],
    first_chunk[s + 1])``. Kept implicit (one number per shard), because a billion samples make
    millions of chunks. Built from the index; the same on every rank and worker."""

    per_chunk: int
    shard_samples: np.ndarray
    first_chunk: np.ndarray

    def __len__(self) -> int:
        return int(self.first_chunk[-1])

    @property
    def samples(self) -> int:
        return int(self.shard_samples.sum())

    def rows(self) -> np.ndarray:
        """Samples in every chunk, by chunk number (int32: a chunk is small)."""
        rows = np.full(len(self), self.per_chunk, np.int32)
        full = np.flatnonzero(self.first_chunk[1:] > self.first_chunk[:-1])
        last = self.first_chunk[full + 1] - 1
        rows[last] = self.shard_samples[full] - (last - self.first_chunk[full]) * self.per_chunk
        return rows

    def where(self, chunk: int) -> tuple[int, int]:
        """``(shard, first_row)`` of a chunk."""
        shard = int(np.searchsorted(self.first_chunk, chunk, side="right")) - 1
        return shard, (chunk - int(self.first_chunk[shard])) * self.per_chunk


def chunk_table(shard_samples: Sequence[int] | np.ndarray, pack: int, chunk_samples: int) -> ChunkTable:
    """Cut shards of the given sample counts into chunks of about ``chunk_samples`` samples,
    always whole records of ``pack`` samples (so a chunk is one contiguous byte range)."""
    per_chunk = max(pack, (max(chunk_samples, 1) + pack - 1) // pack * pack)
    samples = np.asarray(shard_samples, dtype=np.int64)
    counts = (samples + per_chunk - 1) // per_chunk
    return ChunkTable(per_chunk, samples, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))


def rng_for(*key: int) -> np.random.Generator:
    """A generator seeded by a tuple of non-negative ints (seed, epoch, ...)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([k & 0xFFFFFFFFFFFFFFFF for k in key])))


@dataclass(frozen=True)
class EpochOrder:
    """The chunks of one epoch in read order, with the cumulative sample count before each."""

    order: np.ndarray  # chunk ids
    starts: np.ndarray  # len(order) + 1 positions

    @property
    def samples(self) -> int:
        return int(self.starts[-1])


def epoch_order(chunks: ChunkTable, seed: int, epoch: int, shuffle: bool) -> EpochOrder:
    """Chunk order of an epoch: a permutation drawn from ``(seed, epoch)``, or index order."""
    n = len(chunks)
    order = np.arange(n, dtype=np.int32 if n < 1 << 31 else np.int64)
    if shuffle:
        rng_for(seed, epoch).shuffle(order)
    starts = np.zeros(n + 1, np.int64)
    np.cumsum(chunks.rows()[order], out=starts[1:])
    return EpochOrder(order, starts)


def rank_span(samples: int, world: int, rank: int, remainder: Remainder) -> tuple[int, int]:
    """Global positions ``[start, stop)`` of a rank; ``stop`` may pass ``samples`` when padding."""
    if remainder == "keep":
        return rank * samples // world, (rank + 1) * samples // world
    length = samples // world if remainder == "drop" else -(-samples // world)
    return rank * length, (rank + 1) * length


def worker_spans(start: int, stop: int, workers: int) -> list[tuple[int, int]]:
    """Split a rank span into ``workers`` spans whose lengths differ by at most one."""
    length = stop - start
    return [(start + w * length // workers, start + (w + 1) * length // workers) for w in range(workers)]


@dataclass(frozen=True)
class Segment:
    """Emission positions ``[begin, end)`` of the span ``[span_start, span_stop)``."""

    span_start: int
    span_stop: int
    begin: int
    end: int

    def __len__(self) -> int:
        return self.end - self.begin


def batches_of(samples: int, batch_size: int, drop_last: bool) -> int:
    return samples // batch_size if drop_last else -(-samples // batch_size)


@dataclass(frozen=True)
class WorkerPlan:
    """What one DataLoader worker delivers in an epoch: its segments, cut into batches, sent to
    the main process ``per_message`` batches at a time. ``phase`` is how many batches of the
    worker's current message were delivered before a resume (its first message is shorter)."""

    segments: tuple[Segment, ...]
    phase: int = 0

    @property
    def samples(self) -> int:
        return sum(len(s) for s in self.segments)

    def batches(self, batch_size: int, drop_last: bool) -> int:
        return batches_of(self.samples, batch_size, drop_last)

    def message_sizes(self, batch_size: int, drop_last: bool, per_message: int) -> list[int]:
        """Batches in each message this worker sends."""
        left = self.batches(batch_size, drop_last)
        sizes = []
        size = per_message - self.phase if self.phase else per_message
        while left > 0:
            sizes.append(min(size, left))
            left -= sizes[-1]
            size = per_message
        return sizes


def loader_order(plans: Sequence[WorkerPlan], batch_size: int, drop_last: bool, per_message: int) -> list[int]:
    """Worker of each batch in the order a DataLoader yields them: round robin over the workers
    that still have messages (how ``torch.utils.data.DataLoader`` serves an IterableDataset),
    each message's batches in a row."""
    sizes = [plan.message_sizes(batch_size, drop_last, per_message) for plan in plans]
    order: list[int] = []
    for r in range(max((len(s) for s in sizes), default=0)):
        for w, worker_sizes in enumerate(sizes):
            if r < len(worker_sizes):
                order.extend([w] * worker_sizes[r])
    return order


def split_segments(segments: Sequence[Segment], parts: int) -> list[list[Segment]]:
    """Deal a list of segments out to ``parts`` consumers in contiguous pieces of equal length
    (differing by at most one sample), preserving order."""
    total = sum(len(s) for s in segments)
    cuts = [p * total // parts for p in range(parts + 1)]
    out: list[list[Segment]] = [[] for _ in range(parts)]
    position = 0
    for seg in segments:
        seg_start, seg_end = position, position + len(seg)
        for p in range(parts):
            lo, hi = max(cuts[p], seg_start), min(cuts[p + 1], seg_end)
            if lo < hi:
                out[p].append(Segment(seg.span_start, seg.span_stop,
                                      seg.begin + lo - seg_start, seg.begin + hi - seg_start))
        position = seg_end
    return out


@dataclass(frozen=True)
class PlanConfig:
    """Everything besides the epoch and the number of workers that the plan depends on."""

    seed: int
    world: int
    batch_size: int
    drop_last: bool
    remainder: Remainder
    per_message: int = 1


def fresh_plans(total: int, config: PlanConfig, rank: int, workers: int) -> list[WorkerPlan]:
    """The plan of each worker of ``rank`` at the start of an epoch of ``total`` samples."""
    start, stop = rank_span(total, config.world, rank, config.remainder)
    return [WorkerPlan((Segment(a, b, 0, b - a),)) for a, b in worker_spans(start, stop, workers)]


def _skip(segments: Sequence[Segment], count: int) -> tuple[Segment, ...]:
    """The segments less their first ``count`` emission positions."""
    rest = []
    for seg in segments:
        take = min(count, len(seg))
        count -= take
        if take < len(seg):
            rest.append(Segment(seg.span_start, seg.span_stop, seg.begin + take, seg.end))
    return tuple(rest)


def continue_plans(plans: Sequence[WorkerPlan], config: PlanConfig, batches_done: int,
                   workers: int) -> list[WorkerPlan]:
    """What is left of each worker's plan once the loader has yielded ``batches_done`` batches,
    dealt out to ``workers`` workers: exactly the samples not yet delivered, each once.

    With an unchanged number of workers every worker skips ahead, and the list is rotated so
    that DataLoader worker 0 plays the worker whose batch comes next: a fresh DataLoader starts
    its round robin at worker 0, and the rotation makes it continue the old order exactly
    (``phase`` keeps each worker's messages aligned as they were)."""
    order = loader_order(plans, config.batch_size, config.drop_last, config.per_message)
    done = [0] * len(plans)
    for w in order[:batches_done]:
        done[w] += 1
    if workers == len(plans):
        rest = [WorkerPlan(_skip(plan.segments, n * config.batch_size), (plan.phase + n) % config.per_message)
                for plan, n in zip(plans, done)]
        first = order[batches_done] if batches_done < len(order) else 0
        return rest[first:] + rest[:first]
    left = [seg for plan, n in zip(plans, done) for seg in _skip(plan.segments, n * config.batch_size)]
    return [WorkerPlan(tuple(segs)) for segs in split_segments(left, workers)]


def epoch_plans(total: int, config: PlanConfig, rank: int, workers: int,
                legs: Sequence[tuple[int, int, int]] = ()) -> list[WorkerPlan]:
    """Each worker's plan for this epoch. ``legs`` lists, for each earlier stretch of the epoch
    (before each resume), its workers, the batches its loader yielded and its batches per
    message."""
    plans = fresh_plans(total, config, rank, legs[0][0] if legs else workers)
    for i, (_, batches, per_message) in enumerate(legs):
        next_workers = legs[i + 1][0] if i + 1 < len(legs) else workers
        plans = continue_plans(plans, replace(config, per_message=per_message), batches, next_workers)
    return plans


def window_permutation(seed: int, epoch: int, span_start: int, window: int, size: int,
                       shuffle: bool) -> np.ndarray:
    """Emission order of one window of a span: drawn from its position, not from its data."""
    if not shuffle:
        return np.arange(size)
    return rng_for(seed, epoch, span_start, window).permutation(size)


def locate(order: EpochOrder, chunks: ChunkTable, start: int, stop: int) -> list[tuple[int, int, int]]:
    """``(shard, first_row, stop_row)`` pieces that hold global positions ``[start, stop)``,
    positions past the epoch's end wrapping around to its start (padding)."""
    total = order.samples
    pieces: list[tuple[int, int, int]] = []
    while start < stop:
        lap_start = start % total
        lap_stop = min(stop - start + lap_start, total)
        first = int(np.searchsorted(order.starts, lap_start, side="right")) - 1
        last = int(np.searchsorted(order.starts, lap_stop, side="left"))
        for j in range(first, last):
            chunk = int(order.order[j])
            lo = max(lap_start, int(order.starts[j])) - int(order.starts[j])
            hi = min(lap_stop, int(order.starts[j + 1])) - int(order.starts[j])
            shard, base = chunks.where(chunk)
            pieces.append((shard, base + lo, base + hi))
        start += lap_stop - lap_start
    return pieces
