"""The epoch plan as pure functions: exactly once, equal counts, resume, at any scale."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pipeline.stream.plan import (
    PlanConfig,
    WorkerPlan,
    chunk_table,
    continue_plans,
    epoch_order,
    epoch_plans,
    loader_order,
    locate,
    window_permutation,
)


def delivered(chunks, order, plans: list[WorkerPlan], config: PlanConfig, window: int,
              epoch: int, shard_starts: np.ndarray) -> list[list[int]]:
    """Global sample numbers each worker emits, in emission order (what the dataset computes)."""
    out = []
    for plan in plans:
        samples: list[int] = []
        for seg in plan.segments:
            for w in range(seg.begin // window, -(-seg.end // window)):
                lo, hi = w * window, min((w + 1) * window, seg.span_stop - seg.span_start)
                rows = [int(shard_starts[s]) + r for s, a, b in
                        locate(order, chunks, seg.span_start + lo, seg.span_start + hi) for r in range(a, b)]
                perm = window_permutation(config.seed, epoch, seg.span_start, w, hi - lo, True)
                samples.extend(rows[j] for j in perm[max(seg.begin, lo) - lo:min(seg.end, hi) - lo])
        if config.drop_last:
            samples = samples[:len(samples) // config.batch_size * config.batch_size]
        out.append(samples)
    return out


def setup(sizes: list[int], pack: int, chunk: int, epoch: int = 0, seed: int = 7):
    chunks = chunk_table(sizes, pack, chunk)
    order = epoch_order(chunks, seed, epoch, shuffle=True)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return chunks, order, starts


@pytest.mark.parametrize("world, workers", [(1, 1), (1, 3), (2, 2), (3, 2), (5, 3)])
@pytest.mark.parametrize("remainder", ["drop", "pad", "keep"])
def test_every_sample_once_and_equal_batches_per_rank(world: int, workers: int, remainder: str) -> None:
    sizes = np.random.default_rng(world * 10 + workers).integers(1, 400, 7).tolist()
    pack, batch = 8, 16
    chunks, order, starts = setup(sizes, pack, chunk=40)
    config = PlanConfig(7, world, batch, False, remainder)  # type: ignore[arg-type]
    total = sum(sizes)
    seen: Counter = Counter()
    per_rank = []
    for rank in range(world):
        plans = epoch_plans(total, config, rank, workers)
        per_rank.append(sum(p.batches(batch, False) for p in plans))
        for samples in delivered(chunks, order, plans, config, 100, 0, starts):
            seen.update(samples)
    assert set(seen) <= set(range(total))
    if remainder == "drop":
        assert sum(seen.values()) == total // world * world and max(seen.values()) == 1
    elif remainder == "pad":
        assert set(seen) == set(range(total)) and sum(seen.values()) == -(-total // world) * world
        assert sum(v - 1 for v in seen.values()) < world
    else:
        assert sum(seen.values()) == total and set(seen.values()) == {1}
    if remainder != "keep":
        assert len(set(per_rank)) == 1


def test_sixty_four_ranks_times_eight_workers() -> None:
    sizes = np.random.default_rng(0).integers(500, 3000, 300).tolist()
    total = sum(sizes)
    config = PlanConfig(1, 64, 32, False, "pad")
    padded = -(-total // 64) * 64
    coverage = np.zeros(padded, dtype=np.int64)
    batches = set()
    for rank in range(64):
        plans = epoch_plans(total, config, rank, 8)
        batches.add(sum(p.batches(32, False) for p in plans))
        for plan in plans:
            for seg in plan.segments:  # spans are contiguous global positions
                coverage[seg.span_start + seg.begin:seg.span_start + seg.end] += 1
    assert len(batches) == 1 and (coverage == 1).all()
    per_sample = coverage[:total].copy()
    per_sample[:padded - total] += coverage[total:]  # positions past the end wrap to the start
    assert per_sample.sum() == padded and set(per_sample[padded - total:]) == {1}


def test_a_new_epoch_reorders_and_the_same_epoch_repeats() -> None:
    sizes = [300, 200, 250]
    chunks = chunk_table(sizes, 1, 50)
    a, b, c = (epoch_order(chunks, 3, e, True).order for e in (0, 0, 1))
    assert (a == b).all() and not (a == c).all()
    assert not (window_permutation(3, 0, 0, 0, 100, True) == window_permutation(3, 1, 0, 0, 100, True)).all()


def test_loader_order_is_round_robin_over_messages() -> None:
    plans = [WorkerPlan(()), WorkerPlan(())]
    assert loader_order(plans, 4, False, 2) == []
    from pipeline.stream.plan import Segment

    plans = [WorkerPlan((Segment(0, 20, 0, 20),)), WorkerPlan((Segment(20, 32, 0, 12),))]
    # worker 0: 5 batches in messages of 2,2,1; worker 1: 3 batches in messages 2,1
    assert loader_order(plans, 4, False, 2) == [0, 0, 1, 1, 0, 0, 1, 0]


@pytest.mark.parametrize("old_workers, new_workers", [(2, 2), (3, 3), (2, 3), (3, 1), (1, 4)])
@pytest.mark.parametrize("per_message", [1, 3])
def test_continuing_covers_exactly_the_undelivered_samples(old_workers: int, new_workers: int,
                                                            per_message: int) -> None:
    sizes = [130, 71, 250, 9]
    total = sum(sizes)
    chunks, order, starts = setup(sizes, 1, 20)
    config = PlanConfig(7, 1, 8, False, "pad", per_message)
    plans = epoch_plans(total, config, 0, old_workers)
    per_worker = delivered(chunks, order, plans, config, 64, 0, starts)
    batches = [[w[i:i + 8] for i in range(0, len(w), 8)] for w in per_worker]
    sequence = [batches[w].pop(0) for w in loader_order(plans, 8, False, per_message)]
    for done in (0, 1, 5, 17, len(sequence)):
        rest_plans = continue_plans(plans, config, done, new_workers)
        rest = delivered(chunks, order, rest_plans, config, 64, 0, starts)
        got = sorted(s for b in sequence[:done] for s in b) + sorted(s for w in rest for s in w)
        assert sorted(got) == list(range(total))
        if new_workers == old_workers:  # the same order, batch for batch
            rest_batches = [[w[i:i + 8] for i in range(0, len(w), 8)] for w in rest]
            resumed = [rest_batches[w].pop(0) for w in loader_order(rest_plans, 8, False, per_message)]
            assert resumed == sequence[done:]
