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

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

Remainder = Literal["drop", "pad", "keep"]


@dataclass(frozen=True)
class ChunkTable:
    """Chunks of a shard set: chunk ``i`` is rows ``[first_row[i], first_row[i] + rows[i])`` of
    shard ``shard[i]``. Built from the index; the same on every rank and worker."""

    shard: np.ndarray
    first_row: np.ndarray
    rows: np.ndarray

    @property
    def samples(self) -> int:
        return int(self.rows.sum())


def chunk_table(shard_samples: Sequence[int], pack: int, chunk_samples: int) -> ChunkTable:
    """Cut shards of the given sample counts into chunks of about ``chunk_samples`` samples,
    always whole records of ``pack`` samples (so a chunk is one contiguous byte range)."""
    per_chunk = max(pack, (max(chunk_samples, 1) + pack - 1) // pack * pack)
    samples = np.asarray(shard_samples, dtype=np.int64)
    counts = (samples + per_chunk - 1) // per_chunk
    shard = np.repeat(np.arange(len(samples), dtype=np.int64), counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(counts) else np.zeros(0, np.int64)
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)
    first_row = within * per_chunk
    rows = np.minimum(per_chunk, samples[shard] - first_row) if len(shard) else np.zeros(0, np.int64)
    return ChunkTable(shard, first_row, rows)


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
    n = len(chunks.rows)
    order = rng_for(seed, epoch).permutation(n) if shuffle else np.arange(n)
    starts = np.concatenate([[0], np.cumsum(chunks.rows[order])]).astype(np.int64)
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


def loader_order(batch_counts: Sequence[int]) -> list[int]:
    """Worker of each batch in the order a DataLoader yields them: round robin over the workers
    that still have batches (how ``torch.utils.data.DataLoader`` serves an IterableDataset)."""
    order = []
    for r in range(max(batch_counts, default=0)):
        order.extend(w for w, count in enumerate(batch_counts) if count > r)
    return order


def batches_done_per_worker(batch_counts: Sequence[int], batches_done: int) -> list[int]:
    """How many batches each worker had produced when the loader had yielded ``batches_done``."""
    done = [0] * len(batch_counts)
    for w in loader_order(batch_counts)[:batches_done]:
        done[w] += 1
    return done


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


def fresh_segments(total: int, config: PlanConfig, rank: int, workers: int) -> list[list[Segment]]:
    """The segments of each worker of ``rank`` at the start of an epoch of ``total`` samples."""
    start, stop = rank_span(total, config.world, rank, config.remainder)
    return [[Segment(a, b, 0, b - a)] for a, b in worker_spans(start, stop, workers)]


def _skip(segments: Sequence[Segment], count: int) -> list[Segment]:
    """The segments less their first ``count`` emission positions."""
    rest = []
    for seg in segments:
        take = min(count, len(seg))
        count -= take
        if take < len(seg):
            rest.append(Segment(seg.span_start, seg.span_stop, seg.begin + take, seg.end))
    return rest


def continue_segments(segments: list[list[Segment]], batch_size: int, drop_last: bool,
                      batches_done: int, workers: int) -> list[list[Segment]]:
    """What is left of each worker's segments once the loader has yielded ``batches_done``
    batches, dealt out to ``workers`` workers: exactly the samples not yet delivered, each once.
    With an unchanged number of workers every worker simply skips ahead."""
    done = batches_done_per_worker(batch_counts(segments, batch_size, drop_last), batches_done)
    rest = [_skip(segs, n * batch_size) for segs, n in zip(segments, done)]
    if workers == len(segments):
        return rest
    return split_segments([s for segs in rest for s in segs], workers)


def epoch_segments(total: int, config: PlanConfig, rank: int, workers: int,
                   legs: Sequence[tuple[int, int]] = ()) -> list[list[Segment]]:
    """Each worker's segments for this epoch. ``legs`` lists, for each earlier stretch of the
    epoch (before each resume), the workers it ran with and the batches its loader yielded."""
    segments = fresh_segments(total, config, rank, legs[0][0] if legs else workers)
    for i, (_, batches) in enumerate(legs):
        next_workers = legs[i + 1][0] if i + 1 < len(legs) else workers
        segments = continue_segments(segments, config.batch_size, config.drop_last, batches, next_workers)
    return segments


def batch_counts(segments: list[list[Segment]], batch_size: int, drop_last: bool) -> list[int]:
    """Batches each worker yields from its segments."""
    return [batches_of(sum(len(s) for s in segs), batch_size, drop_last) for segs in segments]


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
            base = int(chunks.first_row[chunk])
            pieces.append((int(chunks.shard[chunk]), base + lo, base + hi))
        start += lap_stop - lap_start
    return pieces
