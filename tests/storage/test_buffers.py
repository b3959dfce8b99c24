"""The buffers remote ranges are read into: never lent twice while anything made from them lives,
reused once nothing does, and no more memory held than the reader needed at once."""

from __future__ import annotations

import gc
from collections import deque

import numpy as np
import pytest
import torch

from pipeline.format.codec import decode_record, encode_sample
from pipeline.storage.buffers import GRAIN, RECENT, BufferPool, pooled_concatenate, pooled_stack, process_pool


def address(view: memoryview) -> int:
    return np.frombuffer(view, np.uint8).ctypes.data


def test_a_buffer_is_lent_again_only_when_nothing_made_from_it_lives() -> None:
    pool = BufferPool()
    encoded = encode_sample({"x": np.arange(1000, dtype=np.float32)})
    first = pool.take(len(encoded))
    first[:] = encoded
    decoded = decode_record(first[:])  # arrays decoded zero-copy: views of the buffer
    assert np.shares_memory(decoded["x"], np.frombuffer(first, np.uint8))
    where = address(first)
    del first
    gc.collect()
    second = pool.take(len(encoded))  # the first buffer is still in use by the array
    assert address(second) != where
    second[:] = b"\xff" * len(encoded)
    assert np.array_equal(decoded["x"], np.arange(1000, dtype=np.float32))
    again = address(second)
    held = pool.held_bytes
    del decoded, second
    assert address(pool.take(len(encoded))) in (where, again)  # one of the two, no new one
    assert pool.held_bytes == held


def test_slices_and_arrays_of_a_view_keep_its_buffer() -> None:
    pool = BufferPool()
    view = pool.take(100_000)
    where = address(view)
    kept = [view[10:20], np.frombuffer(view[100:200], np.uint8)[5:9]]  # a slice of an array of a slice
    del view
    others = []  # lent meanwhile, and kept: when the first comes back, it is the only one idle
    for _ in range(2):
        others.append(pool.take(100_000))
        assert address(others[-1]) != where
        kept.pop()
    assert address(pool.take(100_000)) == where


def test_a_steady_reader_allocates_nothing_after_the_first_unit() -> None:
    """Units of 40 ranges of a few sizes: from the second on, every range lands in a buffer of
    the first unit's, and the pool holds what one unit needs, not what all of them read."""
    pool = BufferPool()
    sizes = np.random.default_rng(0).integers(480 << 10, 530 << 10, size=(6, 40))
    made = []
    for unit in sizes:
        views = [pool.take(int(size)) for size in unit]
        assert len({address(view) for view in views}) == len(views)
        made.append(pool.allocations)
        del views
    assert made == [40] * 6
    assert pool.held_bytes == pool.peak_lent <= 40 * (530 << 10) * 9 // 8 + 40 * GRAIN


def test_units_of_one_size_and_a_smaller_last_one_keep_both_buffers() -> None:
    """An epoch's blocks of one size, one at a time, then a last one too small for their buffer:
    both buffers stay, so later epochs make none (the large one went each time the small one
    came back, and every block of the next epoch made its buffer anew)."""
    pool = BufferPool()
    made = []
    for _ in range(4):
        for size in [1300 << 10] * 5 + [600 << 10]:
            view = pool.take(size)
            del view
        made.append(pool.allocations)
    assert made == [2, 2, 2, 2]


def test_the_buffer_a_unit_is_joined_in_stays_beside_ranges_of_many_sizes() -> None:
    """Each unit: ranges of many sizes lent at once, its rows joined into one large buffer, the
    ranges let go, then the join. Every unit joins in the buffer the first one made, and the
    ranges soon find buffers of earlier units."""
    pool, rng = BufferPool(), np.random.default_rng(2)
    joins_made, made = 0, []
    for _ in range(30):
        ranges = [pool.take(int(size)) for size in rng.integers(50 << 10, 1200 << 10, 30)]
        before = pool.allocations
        join = pool.take(30 << 20)
        joins_made += pool.allocations - before
        del ranges, join
        made.append(pool.allocations)
    assert joins_made == 1
    assert made[-1] - made[9] < 30  # of the 600 ranges after the first 300: nearly all in buffers made before


def test_ranges_of_any_sizes_and_lifetimes_get_their_own_bytes_and_bounded_memory() -> None:
    """Random sizes, each range kept for a random while: a range lent is never another's while
    it lives (each keeps the bytes written into it), and the pool never holds more than twice
    the most lent at once."""
    pool, rng = BufferPool(), np.random.default_rng(1)
    alive: list[tuple[memoryview, int]] = []
    for n in range(400):
        size = int(rng.choice([1 << 10, 100 << 10, 1 << 20, 4 << 20]) * rng.uniform(0.5, 1))
        view = pool.take(size)
        view[:] = bytes([n % 251]) * size
        alive.append((view, n % 251))
        del view
        rng.shuffle(alive)
        del alive[:rng.integers(0, 3)]  # none, one or two let go: about one a round, 10 alive
        assert all(view[0] == fill and view[-1] == fill for view, fill in alive)
        assert pool.held_bytes <= 2 * pool.peak_lent
    assert pool.allocations < 100  # of 400 ranges


def test_a_bursts_surplus_goes_while_a_steady_reader_goes_on() -> None:
    """After a burst of 20 buffers lent at once, a reader that keeps 10 lent (one given back,
    one taken, round after round) is left with about the 10 it takes turns with, not the 20: it
    takes the buffer back last, so the surplus ages out."""
    pool, size = BufferPool(), 1 << 20
    burst = [pool.take(size) for _ in range(20)]
    del burst
    held = deque(pool.take(size) for _ in range(10))
    for _ in range(3 * RECENT):
        held.popleft()
        held.append(pool.take(size))
    assert pool.allocations == 20  # none made after the burst
    assert pool.held_bytes <= 12 * (size + size // 8 + GRAIN)  # the 10 lent and one or two idle


def test_joined_rows_are_numpys_and_outlive_later_joins() -> None:
    parts = [np.arange(30_000, dtype=np.float32).reshape(-1, 3), np.ones((20_000, 3), np.float32)]  # 600 KB
    joined = pooled_concatenate(parts)
    assert joined.dtype == np.float32 and np.array_equal(joined, np.concatenate(parts))
    assert process_pool().held_bytes >= joined.nbytes  # in pooled memory
    for _ in range(5):  # later joins of the same size get other memory while this one lives
        other = pooled_concatenate([np.full((50_000, 3), -1, np.float32)])
        assert not np.shares_memory(other, joined)
    assert np.array_equal(joined, np.concatenate(parts))
    mixed = pooled_concatenate([np.arange(40_000, dtype=np.int32), np.arange(40_000, dtype=np.float64)])
    assert mixed.dtype == np.float64  # promoted, as np.concatenate does
    assert pooled_concatenate([np.array(["a"], object), np.array([None], object)]).tolist() == ["a", None]
    rows = [np.full(40_000, i, np.int16) for i in range(4)]
    assert np.array_equal(pooled_stack(rows), np.stack(rows)) and pooled_stack(rows).dtype == np.int16
    assert pooled_stack([np.int64(1), np.float64(2.5)]).tolist() == [1.0, 2.5]
    assert pooled_stack([np.str_(""), np.str_("")]).tolist() == ["", ""]
    for unequal in ([np.arange(3), np.arange(4)], [np.arange(3), None]):
        with pytest.raises(ValueError):  # as np.stack raises
            pooled_stack(unequal)


def test_arrays_made_with_buffer_keep_the_buffer_lent() -> None:
    """``np.ndarray(buffer=...)`` links an array to the object behind a memoryview, past the
    view: the pool's watch must be on that object."""
    pool = BufferPool()
    view = pool.take(200_000)
    where = address(view)
    kept = [np.ndarray((10,), np.uint8, buffer=view[500:510]), np.frombuffer(view.obj, np.uint8)[7:9],
            torch.from_numpy(np.frombuffer(view, np.uint8).reshape(2, -1))]
    del view
    others = []  # lent meanwhile, and kept: when the first comes back, it is the only one idle
    while kept:
        others.append(pool.take(200_000))
        assert address(others[-1]) != where
        kept.pop()
    assert address(pool.take(200_000)) == where


def test_a_burst_is_given_back_once_it_is_over_and_trim_gives_back_the_rest() -> None:
    pool = BufferPool()
    burst = [pool.take(1 << 20) for _ in range(100)]  # 100 MB at once
    del burst
    for _ in range(300):  # then a steady 1 MB at a time, for longer than the pool remembers
        view = pool.take(1 << 20)
        del view
    assert pool.held_bytes < 4 << 20
    pool.trim()
    assert pool.held_bytes == 0
