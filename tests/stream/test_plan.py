"""The epoch plan as pure functions, computed with the functions the dataset reads by: exactly
once, equal batch counts, the same batches for any number of workers, resume, elastic world
sizes and mixes, at any scale."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pipeline.stream.material import chunk_table, epoch_material, mix_counts, stream_pieces
from pipeline.stream.plan import Leg, PlanConfig, leg_sequences, rank_batches
from tests.stream.planned import Planned


def config(batch: int = 16, remainder: str = "pad", drop_last: bool = False, window: int = 100) -> PlanConfig:
    return PlanConfig(7, batch, drop_last, remainder, True, window)  # type: ignore[arg-type]


def one_source(seed: int, shards: int = 7) -> Planned:
    sizes = np.random.default_rng(seed).integers(1, 400, shards).tolist()
    return Planned([sizes], [sum(sizes)])


def check_exactly_once(seen: Counter, total: int, world: int, remainder: str) -> None:
    ids = set(range(total))
    if remainder == "drop":
        assert set(seen) <= ids and sum(seen.values()) == total // world * world and max(seen.values()) == 1
    elif remainder == "pad":
        assert set(seen) == ids and sum(seen.values()) == -(-total // world) * world
        assert sum(v - 1 for v in seen.values()) < world
    else:
        assert set(seen) == ids and set(seen.values()) == {1}


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("remainder", ["drop", "pad", "keep"])
def test_every_sample_once_equal_batches_and_the_same_batches_for_any_workers(world: int, remainder: str) -> None:
    planned = one_source(world)
    cfg = config(remainder=remainder)
    legs = [Leg(world, 0)]
    seen: Counter = Counter()
    counts = set()
    for rank in range(world):
        batches = planned.batches(cfg, 0, legs, rank, workers=1)
        for workers in (2, 3):
            assert planned.batches(cfg, 0, legs, rank, workers) == batches
        counts.add(len(batches))
        seen.update(i for batch in batches for i in batch)
    check_exactly_once(seen, planned.counts[0], world, remainder)
    assert len(counts) == 1 or remainder == "keep"


def test_drop_last_drops_the_ranks_one_short_batch_only() -> None:
    planned = one_source(3)
    cfg = config(drop_last=True)
    batches = planned.batches(cfg, 0, [Leg(2, 0)], 0, workers=3)
    assert all(len(b) == cfg.batch_size for b in batches)
    sequence = leg_sequences(planned.counts[0], cfg, [Leg(2, 0)])[0][0]
    assert len(batches) == sequence.length // cfg.batch_size == rank_batches(sequence, cfg)


@pytest.mark.parametrize("total, world, batch", [(3001, 2, 10), (2999, 2, 10), (1000, 3, 7), (998, 3, 111),
                                                  (1001, 4, 250), (500, 1, 16)])
def test_drop_last_pads_only_where_the_repeats_complete_a_batch(total: int, world: int, batch: int) -> None:
    """With drop_last, a padding repeat that falls into a full batch stands in for a real sample
    dropped with the short one: the default remainder pads only where that cannot happen."""
    planned = Planned([[total // 3, total // 3, total - 2 * (total // 3)]], [total])
    cfg = config(batch=batch, drop_last=True, window=60)
    per_rank = [planned.batches(cfg, 0, [Leg(world, 0)], r, workers=2) for r in range(world)]
    assert {len(b) for b in per_rank} == {max(total // world // batch, -(-total // world) // batch)}
    seen = Counter(i for batches in per_rank for batch in batches for i in batch)
    if len(seen) < total:  # real samples dropped: none repeated
        assert max(seen.values()) == 1
    else:
        assert sum(v - 1 for v in seen.values()) < world


def sixty_four_rank_sources(mixed: bool) -> Planned:
    """200 shards of 500-3000 samples; mixed with two small sources (20 and 2 shards) by 0.6 / 0.3 / 0.1."""
    rng = np.random.default_rng(0)
    sizes = [rng.integers(500, 3000, n).tolist() for n in ((200, 20, 2) if mixed else (200,))]
    totals = [sum(s) for s in sizes]
    counts = mix_counts(totals, [0.6, 0.3, 0.1], [None] * 3, None) if mixed else totals
    return Planned(sizes, counts, chunk=200)


@pytest.mark.parametrize("mixed", [False, True])
def test_sixty_four_ranks_times_eight_workers_then_forty_eight(mixed: bool) -> None:
    planned = sixty_four_rank_sources(mixed)
    cfg = config(batch=32, window=2000)
    planned_ids = Counter(i for batch in planned.batches(cfg, 0, [Leg(1, 0)], 0, workers=1) for i in batch)
    assert sum(planned_ids.values()) == sum(planned.counts)
    first = [planned.batches(cfg, 0, [Leg(64, 0)], r, workers=8) for r in range(64)]
    assert len({len(b) for b in first}) == 1
    seen = Counter(i for rank in first for batch in rank for i in batch)
    assert not planned_ids - seen and sum((seen - planned_ids).values()) < 64  # once each, and the padding
    done = len(first[0]) // 3
    rest = [planned.batches(cfg, 0, [Leg(64, done), Leg(48, 0)], r, workers=8) for r in range(48)]
    assert len({len(b) for b in rest}) == 1
    seen = Counter(i for rank in first for batch in rank[:done] for i in batch)
    seen.update(i for rank in rest for batch in rank for i in batch)
    assert not planned_ids - seen and sum((seen - planned_ids).values()) < 64 + 48


@pytest.mark.parametrize("old, new", [(3, 2), (2, 3), (4, 1), (1, 4), (3, 3)])
@pytest.mark.parametrize("remainder", ["pad", "drop", "keep"])
def test_an_elastic_resume_delivers_the_rest_once_in_equal_batches(old: int, new: int, remainder: str) -> None:
    planned = one_source(old * 10 + new, shards=9)
    total = planned.counts[0]
    cfg = config(remainder=remainder)
    before = [planned.batches(cfg, 0, [Leg(old, 0)], r, workers=2) for r in range(old)]
    done = min(len(b) for b in before) // 2
    after = [planned.batches(cfg, 0, [Leg(old, done), Leg(new, 0)], r, workers=3) for r in range(new)]
    if remainder != "keep":
        assert len({len(b) for b in after}) == 1
    seen = Counter(i for rank in before for batch in rank[:done] for i in batch)
    seen.update(i for rank in after for batch in rank for i in batch)
    if remainder == "keep":
        assert seen == Counter(range(total))
    elif remainder == "drop":
        assert max(seen.values()) == 1 and total - len(seen) < old + new
    else:
        assert set(seen) == set(range(total)) and sum(v - 1 for v in seen.values()) < old + new


def test_legs_after_legs_and_a_resume_within_a_leg_on_other_workers() -> None:
    planned = one_source(11, shards=12)
    total = planned.counts[0]
    cfg = config(remainder="keep")
    legs: list[Leg] = []
    seen: Counter = Counter()
    for world, take in ((3, 4), (2, 5), (4, None)):
        current = legs + [Leg(world, 0)]
        per_rank = [planned.batches(cfg, 0, current, r, workers=2) for r in range(world)]
        take = min(len(b) for b in per_rank) if take is None else take
        for rank, batches in enumerate(per_rank):
            resumed = planned.batches(cfg, 0, legs + [Leg(world, 2)], rank, workers=3)
            assert resumed == batches[2:]  # within a leg: the same batches on another number of workers
            seen.update(i for batch in batches[:take] for i in batch)
        legs.append(Leg(world, take))
    remaining = [planned.batches(cfg, 0, legs + [Leg(1, 0)], 0, workers=1)]
    seen.update(i for rank in remaining for batch in rank for i in batch)
    assert seen == Counter(range(total))


def test_a_new_epoch_reorders_and_the_same_epoch_repeats() -> None:
    planned = one_source(5)
    cfg = config()
    a, b, c = (planned.batches(cfg, e, [Leg(1, 0)], 0, 2) for e in (0, 0, 1))
    assert a == b and a != c and sorted(map(sorted, a)) != sorted(map(sorted, c))


def test_mix_counts_are_exact_shares_fixed_counts_and_sizes() -> None:
    assert mix_counts([50_000, 5_000, 500], [0.5, 0.3, 0.2], [None] * 3, None) == [27_750, 16_650, 11_100]
    assert mix_counts([100, 100], [1.0, 2.0], [None, None], 1000) == [333, 667]
    assert mix_counts([100, 100, 40], [None, None, None], [None, None, 10], None) == [115, 115, 10]
    with pytest.raises(ValueError, match="add up to 300, more than the epoch's 200"):
        mix_counts([100, 100], [1.0, None], [None, 300], 200)


def test_a_small_source_repeats_with_a_new_order_and_a_large_one_moves_on() -> None:
    chunks = chunk_table([30, 20], 1, 5)  # 50 samples, 10 chunks

    def ids(chunk: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[int]:
        out = []
        for k, a, b in zip(chunk.tolist(), lo.tolist(), hi.tolist()):
            shard, base = chunks.where(k)
            out.extend((0, 30)[shard] + base + r for r in range(a, b))
        return out

    passes = ids(*stream_pieces(chunks, 3, 0, 0, 150, True))
    assert [sorted(passes[i:i + 50]) for i in (0, 50, 100)] == [list(range(50))] * 3  # each pass every sample once
    assert passes[:50] != passes[50:100]  # in a new order
    taken = [ids(*stream_pieces(chunks, 3, 0, e * 20, 20, True)) for e in range(5)]  # 20 a epoch of 50
    assert sorted(taken[0] + taken[1] + taken[2][:10]) == list(range(50))  # all before any twice


def test_a_mixed_epoch_takes_each_sources_count_interleaved() -> None:
    planned = Planned([[30_000, 20_000], [5_000], [300, 200]], mix_counts([50_000, 5_000, 500], [0.5, 0.3, 0.2],
                                                                        [None] * 3, None), chunk=50)
    cfg = config(batch=256, window=4096)
    material = epoch_material(planned.chunks, planned.counts, [0, 0, 0], cfg.seed, 0, True)
    assert np.bincount(material.source, weights=material.hi - material.lo).tolist() == planned.counts
    batches = [b for r in range(2) for b in planned.batches(cfg, 0, [Leg(2, 0)], r, workers=2)]
    per_source = Counter(i // 10**9 for batch in batches for i in batch)
    assert abs(per_source[0] - planned.counts[0]) < 2 and per_source[2] >= planned.counts[2]  # pad: < 2 extra
    shares = [sum(1 for i in batch if i // 10**9 == 2) / len(batch) for batch in batches[:-2]]
    assert abs(np.mean(shares) - 0.2) < 0.02 and np.std(shares) < 2 * np.sqrt(0.2 * 0.8 / 256)


def test_the_plan_cost_benchmark_runs_for_one_source_and_a_mix(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_index.py"
    result = subprocess.run([sys.executable, str(script), "--quick", "--tmp", str(tmp_path),
                             "--out", str(tmp_path / "bench-results")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / "bench-results" / "bench_index.json").read_text())["tables"]
    assert [(r["kind"], r["samples"]) for r in rows] == [("table", 10**5), ("mix", 10**5), ("table", 10**6),
                                                        ("mix", 10**6)]
    assert all(r["window_shards"] > 0 and r["pieces"] >= r["chunks"] // 2 for r in rows)


@pytest.mark.parametrize("length, unit, units", [(980, 96, 10), (1000, 96, 11), (96, 96, 1), (50, 96, 1),
                                                 (0, 96, 0)])
def test_a_ranks_rest_shorter_than_a_quarter_unit_joins_the_last_unit(length: int, unit: int, units: int) -> None:
    """A unit of its own, the rest would be one or two chunks: the rank's last batches of one
    shard, one class. Joined to the last whole unit (at most 1.25 units), it mixes as much."""
    cfg = config(window=unit)
    sequence = leg_sequences(length * 8, cfg, [Leg(1, 0)])[0][0]
    sequence = replace(sequence, length=length, unit=unit)
    assert sequence.units == units
    ranges = [sequence.unit_range(u) for u in range(units)]
    assert [begin for begin, _ in ranges] == [u * unit for u in range(units)] and (not units or ranges[-1][1] == length)
    assert all(end - begin >= unit // 4 for begin, end in ranges if length >= unit)
    assert sequence.unit_of(np.arange(length)).tolist() == [next(u for u, (b, e) in enumerate(ranges) if b <= p < e)
                                                            for p in range(length)]
    assert replace(sequence, short_last_unit=True).units == -(-length // unit)  # as version 3 laid it out
