"""What an epoch reads, in which order: its *material*. Pure functions.

Each source (a shard set with an index) is cut into *chunks*: runs of whole records, small next
to the shuffle window, so that a chunk is one contiguous byte range and a window holds many of
them. A source is read as an endless stream of *passes*, each pass every chunk once in an order
drawn from ``(seed, source, pass)``. Epoch ``e`` takes the next ``n_s`` samples of the stream of
each source ``s`` (the source's share of the epoch): a source smaller than its share is read
several times over, each pass in a new order; a larger one is subsampled, and moves on through
its stream from epoch to epoch, so that every sample is seen once before any is seen twice.

The material of an epoch is these pieces of chunks, of all sources, laid end to end: ``N``
sample positions that the plan (:mod:`.plan`) deals out to ranks and workers. The pieces of each
source are spread evenly over the epoch (each at a random place in its stretch, drawn from
``(seed, epoch)``), so that every window of the plan holds about its share of every source: a
batch then holds a source's share give or take what drawing its samples at random gives. One source read once an epoch is the plain case: its material is its
chunks in the order of pass ``e``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Iterator, Sequence

import numpy as np


class Draw(IntEnum):
    """What a random draw is for: the first word of its seed, so that no two kinds of draw share
    a stream (a SeedSequence pads a key with zeros: ``(seed, epoch)`` would draw what ``(seed,
    source=epoch, pass=0)`` draws)."""

    PASS = 1  # the chunk order of a pass over a source
    SPREAD = 2  # where a mix's pieces go in an epoch
    UNIT = 3  # the emission order of a unit
    WINDOW = 4  # the emission order of a window of a stream without an index
    SHARDS = 5  # the shard order of a stream without an index
    AUGMENT = 6  # the random crops and flips of decoded images
    TRANSFORM_RANDOM = 7  # the global generators of a batch's transforms: Python's,
    TRANSFORM_NUMPY = 8  # NumPy's
    TRANSFORM_TORCH = 9  # and torch's


def rng_for(draw: Draw, *key: int) -> np.random.Generator:
    """A generator for one ``draw``, seeded by non-negative ints (seed, epoch, ...)."""
    words = [int(draw), *(k & 0xFFFFFFFFFFFFFFFF for k in key)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


def row_seeds(seed: int, epoch: int, places: np.ndarray, draw: Draw = Draw.AUGMENT) -> np.ndarray:
    """One ``uint64`` per row for ``draw``, from the dataset's seed, the epoch and each row's
    place in it (the same row, the same seed, however the epoch's reads are split)."""
    base = rng_for(draw, seed, epoch).integers(0, 1 << 63, dtype=np.uint64)
    return places.astype(np.uint64) ^ base


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


@dataclass(frozen=True)
class Material:
    """The pieces an epoch reads, in read order: piece ``j`` is rows ``[lo[j], hi[j])`` of chunk
    ``chunk[j]`` of source ``source[j]``, and sample positions ``[starts[j], starts[j + 1])``."""

    source: np.ndarray
    chunk: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    starts: np.ndarray

    @property
    def samples(self) -> int:
        return int(self.starts[-1])

    def __len__(self) -> int:
        return len(self.chunk)


def pass_order(chunks: ChunkTable, seed: int, source: int, number: int, shuffle: bool) -> np.ndarray:
    """The chunks of a source in the order of its pass ``number``."""
    n = len(chunks)
    order = np.arange(n, dtype=np.int32 if n < 1 << 31 else np.int64)
    if shuffle:
        rng_for(Draw.PASS, seed, source, number).shuffle(order)
    return order


def stream_pieces(chunks: ChunkTable, seed: int, source: int, start: int, count: int, shuffle: bool,
                  held: Sequence[HeldPass] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(chunk, lo, hi)`` of the pieces that hold samples ``[start, start + count)`` of a source's
    stream of passes; a ``held`` pass goes on in the order of its own chunks (its pieces given in
    pieces of ``chunks`` all the same)."""
    total = chunks.samples
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    position, stop = start, start + count
    rows_of: dict[int, np.ndarray] = {}  # of each cut (a small source repeated gives thousands of passes of one)
    while position < stop and total:
        number, within = divmod(position, total)
        cut = next((h.chunks for h in held if h.number == number), chunks)
        rows = rows_of.get(id(cut))
        if rows is None:
            rows = rows_of[id(cut)] = cut.rows()
        order = pass_order(cut, seed, source, number, shuffle)
        last = min(stop - number * total, total)  # where this pass's part ends, within the pass
        if within == 0 and last == total:  # a whole pass: every chunk, whole
            piece = (order, np.zeros(len(order), np.int32), rows[order])
        else:
            ends = np.cumsum(rows[order])
            first_piece = int(np.searchsorted(ends, within, side="right"))
            last_piece = int(np.searchsorted(ends, last, side="left"))
            taken = order[first_piece:last_piece + 1]
            begins = ends[first_piece:last_piece + 1] - rows[taken]
            lo = np.maximum(within - begins, 0)
            hi = np.minimum(last - begins, rows[taken])
            piece = (taken, lo.astype(np.int32), hi.astype(np.int32))
        parts.append(piece if cut is chunks else rechunked(*piece, cut, chunks)[:3])
        position = number * total + last
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32)
    return tuple(np.concatenate(column) for column in zip(*parts))  # type: ignore[return-value]


@dataclass(frozen=True)
class HeldPass:
    """A source's pass ``number``, under way when its chunks were cut anew (a checkpoint resumed
    at an epoch boundary with another ``shuffle_buffer``, ``chunks_per_buffer`` or world size, or
    the end of an epoch resumed in its middle on chunks of its own): it goes on in the order of
    the ``chunks`` it began with, so that the rest of it is exactly the samples it had not given
    yet (in the order of the new chunks, its samples read so far would be mixed with the rest:
    some again, others never)."""

    number: int
    chunks: ChunkTable


def rechunked(chunk: np.ndarray, lo: np.ndarray, hi: np.ndarray, cut: ChunkTable,
              chunks: ChunkTable) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pieces ``(chunk, lo, hi)`` of the chunks ``cut`` as the same rows, in the same order, in
    pieces of the chunks ``chunks`` (of the same shards): what every reader of an epoch's
    material counts in; and for each, the piece of ``cut`` it comes from."""
    shard = np.searchsorted(cut.first_chunk, chunk, side="right") - 1
    first = (chunk - cut.first_chunk[shard]) * cut.per_chunk + lo  # rows of the shard
    stop = first - lo + hi
    size = chunks.per_chunk
    spans = np.where(stop > first, (stop - 1) // size - first // size + 1, 0)
    which = np.repeat(np.arange(len(chunk)), spans)
    within = first[which] // size + np.arange(len(which)) - np.repeat(np.cumsum(spans) - spans, spans)
    new_lo = np.maximum(first[which] - within * size, 0)
    new_hi = np.minimum(stop[which] - within * size, size)
    return ((chunks.first_chunk[shard[which]] + within).astype(np.int64), new_lo.astype(np.int32),
            new_hi.astype(np.int32), which)


def epoch_material(sources: Sequence[ChunkTable], counts: Sequence[int], offsets: Sequence[int], seed: int,
                   epoch: int, shuffle: bool, held: Sequence[Sequence[HeldPass]] = ()) -> Material:
    """The material of an epoch: ``counts[s]`` samples of each source's stream from
    ``offsets[s]`` on, the sources' pieces interleaved evenly (of one source: the order of its
    pass); ``held[s]``, passes of source ``s`` that go on in the order of other chunks."""
    held = list(held) or [()] * len(sources)
    columns = [stream_pieces(chunks, seed, s, offset, count, shuffle, held[s])
               for s, (chunks, count, offset) in enumerate(zip(sources, counts, offsets))]
    source = np.concatenate([np.full(len(c[0]), s, np.int16) for s, c in enumerate(columns)])
    chunk, lo, hi = (np.concatenate([c[i] for c in columns]) for i in range(3))
    if len(sources) > 1:  # spread each source's pieces evenly over the epoch, each at a random place in its stretch
        rng = rng_for(Draw.SPREAD, seed, epoch)
        keys = np.concatenate([(np.arange(len(c[0])) + (rng.random(len(c[0])) if shuffle else 0.5)) / max(len(c[0]), 1)
                               for c in columns])
        order = np.argsort(keys, kind="stable")
        source, chunk, lo, hi = source[order], chunk[order], lo[order], hi[order]
    return _laid_end_to_end(source, chunk, lo, hi)


def in_chunks(material: Material, cuts: Sequence[ChunkTable], chunks: Sequence[ChunkTable]) -> Material:
    """``material`` laid out on the chunks ``cuts`` (an epoch resumed in its middle keeps the
    chunks it began on), as the same samples in the same order in pieces of ``chunks``, the
    sources' chunks now, which readers count in."""
    if all(cut is now for cut, now in zip(cuts, chunks)):
        return material
    parts = []
    for s in range(len(chunks)):
        mine = np.flatnonzero(material.source == s)
        piece = material.chunk[mine], material.lo[mine], material.hi[mine]
        chunk, lo, hi, which = (*piece, None) if cuts[s] is chunks[s] else rechunked(*piece, cuts[s], chunks[s])
        parts.append((mine if which is None else mine[which], np.full(len(chunk), s, np.int16), chunk, lo, hi))
    where, source, chunk, lo, hi = (np.concatenate([p[i] for p in parts]) for i in range(5))
    order = np.argsort(where, kind="stable")
    source, chunk, lo, hi = source[order], chunk[order], lo[order], hi[order]
    return _laid_end_to_end(source, chunk, lo, hi)


def _laid_end_to_end(source: np.ndarray, chunk: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Material:
    starts = np.zeros(len(chunk) + 1, np.int64)
    np.cumsum(hi - lo, out=starts[1:])
    return Material(source, chunk, lo, hi, starts)


def locate(material: Material, sources: Sequence[ChunkTable], start: int,
           stop: int) -> list[tuple[int, int, int, int]]:
    """``(source, shard, first_row, stop_row)`` pieces that hold sample positions ``[start, stop)``,
    positions past the epoch's end wrapping around to its start (padding)."""
    pieces: list[tuple[int, int, int, int]] = []
    for lap_start, lap_stop in laps(start, stop, material.samples):
        first = int(np.searchsorted(material.starts, lap_start, side="right")) - 1
        last = int(np.searchsorted(material.starts, lap_stop, side="left"))
        for j in range(first, last):
            lo = max(lap_start, int(material.starts[j])) - int(material.starts[j]) + int(material.lo[j])
            hi = min(lap_stop, int(material.starts[j + 1])) - int(material.starts[j]) + int(material.lo[j])
            source = int(material.source[j])
            shard, base = sources[source].where(int(material.chunk[j]))
            pieces.append((source, shard, base + lo, base + hi))
    return pieces


def laps(start: int, stop: int, total: int) -> Iterator[tuple[int, int]]:
    """Positions ``[start, stop)`` of an epoch of ``total`` as runs within it: past its end,
    positions wrap around to its start (padding)."""
    while start < stop and total:
        lap_start = start % total
        lap_stop = min(stop - start + lap_start, total)
        yield lap_start, lap_stop
        start += lap_stop - lap_start


def source_counts(material: Material, positions: np.ndarray, sources: int) -> np.ndarray:
    """How many of the sample ``positions`` (of the epoch, wrapping) come from each source."""
    pieces = np.searchsorted(material.starts, positions % max(material.samples, 1), side="right") - 1
    return np.bincount(material.source[pieces].astype(np.int64), minlength=sources)


def mix_counts(sizes: Sequence[int], weights: Sequence[float | None], samples: Sequence[int | None],
               epoch_samples: int | None) -> list[int]:
    """Samples each source gives an epoch: its ``samples`` when given; the others share what is
    left of ``epoch_samples`` (default: the sum of the sources' sizes) in proportion to their
    ``weights`` (default: their sizes), rounded so that the counts add up exactly."""
    fixed = sum(n for n in samples if n is not None)
    total = sum(sizes) if epoch_samples is None else epoch_samples
    shared = [s for s, n in enumerate(samples) if n is None]
    rest = total - fixed
    if shared and rest < 0:
        raise ValueError(f"the sources' samples= add up to {fixed}, more than the epoch's {total}")
    share = [float(sizes[s] if weights[s] is None else weights[s]) for s in shared]
    if shared and sum(share) <= 0 and rest:
        alone = f"give epoch_samples={fixed} for an epoch of the samples= alone, or " if fixed else "give "
        raise ValueError(f"the sources without samples= have weights (else sizes) adding up to 0, and {rest} of the "
                         f"epoch's {total} samples are left for them: {alone}one of them a weight above 0")
    if shared and rest and not math.isfinite(rest * sum(share)):
        largest = max(share)  # weights near the float limit: as shares of the largest (others as they were)
        share = [w / largest for w in share]
    exact = [rest * w / sum(share) if rest else 0.0 for w in share]
    counts = [int(x) for x in exact]
    for i in np.argsort([c - x for c, x in zip(counts, exact)], kind="stable")[:rest - sum(counts)]:  # largest remainders
        counts[int(i)] += 1
    out = [n if n is not None else 0 for n in samples]
    for s, n in zip(shared, counts):
        out[s] = n
    return out
