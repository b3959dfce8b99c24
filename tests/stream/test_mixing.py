"""Mixing shard sets by weight, with real DataLoader workers: exact shares per epoch, repeats and
subsampling across epochs, resume over several epochs on any number of workers."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline import ShardWriter, make_loader, write_shards
from pipeline.stream.material import mix_counts
from tests.stream.mixes import OFFSET, SIZES, WEIGHTS, mix_folder, per_source, source_of, source_shards

pytestmark = pytest.mark.filterwarnings("ignore:.*suggested max number of worker")
BATCH = 256
#: What each epoch takes of each source: half of the 55,500 samples from the large one, ...
COUNTS = dict(zip(SIZES, mix_counts(list(SIZES.values()), list(WEIGHTS.values()), [None] * 3, None)))


@pytest.fixture(scope="module")
def mix(tmp_path_factory) -> dict[str, str]:
    return mix_folder(tmp_path_factory.mktemp("mix"))


def mixed_loader(mix: dict[str, str], workers: int, weights: dict | None = None, **options):
    return make_loader(mix, num_workers=workers, batch_size=BATCH, seed=3, weights=weights or WEIGHTS,
                       **{"shuffle_buffer": 2048, **options})


def epoch_batches(loader) -> list[list[int]]:
    return [batch["i"].tolist() for batch in loader]


def flat(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


def test_every_epoch_takes_each_sources_share_and_sources_move_on(mix: dict[str, str]) -> None:
    assert COUNTS == {"large": 27750, "medium": 16650, "small": 11100}
    loader = mixed_loader(mix, workers=2)
    epochs = []
    for _ in range(2):
        assert len(loader) == -(-sum(COUNTS.values()) // BATCH)
        batches = epoch_batches(loader)
        assert len(batches) == -(-sum(COUNTS.values()) // BATCH)
        epochs.append(Counter(flat(batches)))
        assert per_source(epochs[-1].elements()) == COUNTS
    large = [Counter({i: n for i, n in epoch.items() if i < OFFSET["medium"]}) for epoch in epochs]
    assert set(large[0].values()) == {1}  # subsampled without repeats within the epoch
    both = large[0] + large[1]  # the second epoch moves on: every sample once before any twice
    assert set(both) == set(range(SIZES["large"])) and sum(n == 2 for n in both.values()) == 55500 - 50000
    small = Counter({i: n for i, n in epochs[0].items() if i >= OFFSET["small"]})
    assert len(small) == 500 and sorted(Counter(small.values()).items()) == [(22, 400), (23, 100)]  # 11,100 = 22.2 passes


def test_batches_mix_every_source_and_progress_counts_per_source(mix: dict[str, str]) -> None:
    loader = mixed_loader(mix, workers=2)
    seen: list[int] = []
    for k, batch in enumerate(loader):
        ids = batch["i"].tolist()
        assert set(source_of(ids)) == set(SIZES)  # a batch of 256 holds every source, even the 20% one
        seen += ids
        if k == 60:
            break
    assert loader.progress() == per_source(seen)
    shares = np.array([per_source(seen[k:k + BATCH])["small"] for k in range(0, len(seen), BATCH)]) / BATCH
    assert abs(shares.mean() - 0.2) < 0.02 and shares.std() < 2 * np.sqrt(0.2 * 0.8 / BATCH)


def run_from(mix: dict[str, str], workers: int, state, stop: int | None, epochs: int = 3):
    """The batches a fresh loader on ``workers`` yields from ``state`` until ``stop`` batches (then
    its state too) or the end of epoch ``epochs - 1``."""
    loader = mixed_loader(mix, workers)
    if state is not None:
        loader.load_state_dict(state)
    out: list[list[int]] = []
    while loader.epoch < epochs:
        for batch in loader:
            out.append(batch["i"].tolist())
            if len(out) == stop:
                return out, loader.state_dict()
    return out, None


def test_resume_at_random_places_over_three_epochs_on_any_workers(mix: dict[str, str]) -> None:
    reference, _ = run_from(mix, 2, None, None)
    assert len(reference) == 3 * 217
    rng = np.random.default_rng(0)
    stops = sorted(rng.choice(np.arange(1, len(reference)), 4, replace=False).tolist()) + [len(reference)]
    state, got, done = None, [], 0
    for workers, stop in zip([2, 0, 3, 1, 2], stops):  # the same workers first, then others
        batches, state = run_from(mix, workers, state, stop - done)
        got += batches
        done = len(got)
    assert got == reference


def test_weights_change_at_an_epoch_boundary_not_in_the_middle(mix: dict[str, str]) -> None:
    loader = mixed_loader(mix, workers=0)
    first = flat(epoch_batches(loader))
    boundary = loader.state_dict()
    for _ in loader:
        break
    middle = loader.state_dict()
    other = {"large": 0.4, "medium": 0.4, "small": 0.2}
    with pytest.raises(ValueError, match="weights and samples can change only at an epoch boundary"):
        mixed_loader(mix, 0, weights=other).load_state_dict(middle)
    changed = mixed_loader(mix, 0, weights=other)
    changed.load_state_dict(boundary)
    second = flat(epoch_batches(changed))
    assert per_source(second) == {"large": 22200, "medium": 22200, "small": 11100}
    large_first = {i for i in first if i < OFFSET["medium"]}
    large_second = {i for i in second if i < OFFSET["medium"]}  # moved on from where epoch 0 stopped
    assert len(large_second) == 22200 and not large_first & large_second


@pytest.mark.parametrize("change", [{"shuffle_buffer": 4096}, {"chunks_per_buffer": 7}])
def test_a_pass_under_way_goes_on_exactly_when_the_chunks_change_at_an_epoch_boundary(mix: dict[str, str],
                                                                                        change: dict) -> None:
    """A source's pass under way at a boundary where the chunks are cut anew (another
    shuffle_buffer or chunks_per_buffer) goes on in its own order: every sample of the source once
    before any twice, also through a checkpoint taken in the middle of the next epoch."""
    loader = mixed_loader(mix, workers=0)
    first = flat(epoch_batches(loader))  # 27,750 of the large source's 50,000: its pass goes on
    changed = mixed_loader(mix, 0, **change)
    changed.load_state_dict(loader.state_dict())
    assert changed.dataset.sources.chunks[0].per_chunk != loader.dataset.sources.chunks[0].per_chunk
    whole = mixed_loader(mix, 2, **change)
    whole.load_state_dict(loader.state_dict())
    second = epoch_batches(whole)
    head = []
    for batch in changed:
        head.append(batch["i"].tolist())
        if len(head) == 100:
            break
    rest = mixed_loader(mix, 2, **change)
    rest.load_state_dict(changed.state_dict())
    assert head + epoch_batches(rest) == second
    large = Counter(i for i in first + flat(second) if i < OFFSET["medium"])  # 55,500: the pass, then 5,500 of the next
    assert set(large) == set(range(SIZES["large"])) and sum(n == 2 for n in large.values()) == 55500 - 50000


def test_absolute_samples_per_epoch_and_clear_errors(mix: dict[str, str], tmp_path: Path) -> None:
    loader = mixed_loader(mix, 2, weights={"large": 3, "medium": 1}, samples={"small": 1000}, epoch_samples=9000)
    assert per_source(flat(epoch_batches(loader))) == {"large": 6000, "medium": 2000, "small": 1000}
    with pytest.raises(ValueError, match=r"weights names \['web'\], which are not sources"):
        mixed_loader(mix, 0, weights={**WEIGHTS, "web": 1})
    with pytest.raises(ValueError, match=r"sources \['small'\] have neither a weight nor samples="):
        mixed_loader(mix, 0, weights={"large": 1, "medium": 1})


def test_counts_given_as_numpy_integers_and_a_source_switched_off_beside_them(mix: dict[str, str]) -> None:
    """samples= as NumPy integers (shares computed with NumPy) passed every check, then the plan's
    seeds overflowed in the first epoch, and the state was no JSON; a source of weight 0 beside
    samples= for the others was refused, however consistent."""
    counts = np.array([1000, 3000])
    loader = mixed_loader(mix, 0, weights={"medium": 0}, samples={"small": counts[0], "large": counts[1]},
                          epoch_samples=np.int64(4000))
    assert per_source(flat(epoch_batches(loader))) == {"large": 3000, "medium": 0, "small": 1000}
    json.dumps(loader.state_dict())
    with pytest.raises(ValueError, match=r"samples are left for them: give epoch_samples=4000 for an epoch of the "
                                         r"samples= alone, or one of them a weight above 0"):
        mixed_loader(mix, 0, weights={"medium": 0}, samples={"small": 1000, "large": 3000})  # (epoch: the sizes' sum)
    with pytest.raises(ValueError, match=r"are left for them: give one of them a weight above 0$"):
        mixed_loader(mix, 0, weights={"large": 0, "medium": 0, "small": 0})


def test_sources_must_agree_on_their_fields(mix: dict[str, str], tmp_path: Path) -> None:
    extra = source_shards(tmp_path, "tagged", 300, {"tag": np.arange(300, dtype=np.int16)})
    sources = {"large": mix["large"], "tagged": str(extra)}
    with pytest.raises(ValueError, match=r"sources 'large' and 'tagged' have different fields \(\['tag'\] are in one "
                                         r"only\); choose the fields every source has with fields="):
        make_loader(sources, num_workers=0, weights={"large": 1, "tagged": 1})
    loader = make_loader(sources, num_workers=0, weights={"large": 1, "tagged": 1}, fields=["i"], batch_size=500)
    assert set(next(iter(loader))) == {"i"}
    other = source_shards(tmp_path, "wide", 300, {"x": np.zeros((300, 2), np.float32)})
    with pytest.raises(ValueError, match=r"field 'x' is float32\[2\] in source 'wide' and float32\[\] in source "
                                         r"'large': the sources of a mix must agree$"):
        make_loader({"large": mix["large"], "wide": str(other)}, num_workers=0)
    doubles = source_shards(tmp_path, "doubles", 300, {"x": np.zeros(300, np.float64)})  # (pandas' default float)
    with pytest.raises(ValueError, match=re.escape("field 'x' is float64[] in source 'doubles' and float32[] in source "
                                                   "'large': the sources of a mix must agree (build one of them again "
                                                   "with dtypes={'x': 'float32'}, or --dtype x=float32 on the command "
                                                   "line)")):
        make_loader({"large": mix["large"], "doubles": str(doubles)}, num_workers=0)
    text, raw = (source_shards(tmp_path, name, 300, {"x": values}) for name, values in  # (the advice was a
                 (("text", np.array(["a"] * 300)), ("raw", np.array([b"a"] * 300))))  # cast no build makes)
    with pytest.raises(ValueError, match=r"field 'x' is bytes\[\] in source 'raw' and str\[\] in source 'text': the "
                                         r"sources of a mix must agree$"):
        make_loader({"text": str(text), "raw": str(raw)}, num_workers=0)


def test_python_numbers_mix_with_numpy_scalars_of_their_batch_type(tmp_path: Path) -> None:
    """A ShardWriter's (or indexed WebDataset shards') ints, floats and bools make the batches
    NumPy's int64, float64 and bool scalars make, yet a mix of them was refused, with no way out."""
    n = 60
    write_shards(tmp_path / "arrays", {"y": np.arange(n), "w": np.arange(n) / 4, "b": np.arange(n) % 2 == 0},
                 quiet=True)
    with ShardWriter(tmp_path / "written", quiet=True) as sink:
        for i in range(n):
            sink.write({"y": 100 + i, "w": 100 + i / 4, "b": i % 2 == 1})
    for names in (("arrays", "written"), ("written", "arrays")):
        batches = list(make_loader({name: tmp_path / name for name in names}, num_workers=0, batch_size=8))
        assert {(key, value.dtype) for key, value in batches[0].items()} == \
            {("y", torch.int64), ("w", torch.float64), ("b", torch.bool)}
        values = {key: torch.cat([batch[key] for batch in batches]) for key in ("y", "w", "b")}
        assert sorted(values["y"].tolist()) == [*range(n), *range(100, 100 + n)]
        assert values["w"].sum().item() == pytest.approx(2 * sum(range(n)) / 4 + 100 * n)
        assert values["b"].sum().item() == n


def test_an_empty_source_is_left_out_by_weight_0_wherever_it_stands_and_refused_a_share(mix: dict[str, str],
                                                                                        tmp_path: Path) -> None:
    empty = str(source_shards(tmp_path, "none", 0))
    alone = epoch_batches(make_loader({"small": mix["small"]}, num_workers=0, batch_size=BATCH, seed=3))
    for sources in ({"none": empty, "small": mix["small"]}, {"small": mix["small"], "none": empty}):
        loader = make_loader(sources, num_workers=0, batch_size=BATCH, seed=3, weights={"none": 0, "small": 1})
        batches = epoch_batches(loader)
        assert sorted(flat(batches)) == sorted(flat(alone)) and len(batches) == len(alone)
        with pytest.raises(ValueError, match=re.escape("sources ['none'] hold no samples: a mix cannot take a share "
                                                       "of them (give them weight 0, or leave them out)")):
            make_loader(sources, num_workers=0, weights={"none": 1, "small": 1})
    with ShardWriter(tmp_path / "blank", quiet=True):  # no sample, so no field either (an empty table's)
        pass
    for fields in (None, ["i"]):
        loader = make_loader({"small": mix["small"], "blank": tmp_path / "blank"}, num_workers=0, batch_size=BATCH,
                             seed=3, weights={"blank": 0, "small": 1}, fields=fields)
        assert sorted(flat(epoch_batches(loader))) == sorted(flat(alone))


def test_the_mixing_benchmark_runs(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_mixing.py"
    result = subprocess.run([sys.executable, str(script), "--quick", "--tmp", str(tmp_path), "--out",
                             str(tmp_path / "results")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    quality = json.loads((tmp_path / "results" / "bench_mixing.json").read_text())["quality"]
    assert [row["source"] for row in quality] == ["large", "medium", "small"]
    assert all(abs(row["mean"] - row["weight"]) < 0.02 for row in quality)


def test_progress_counts_the_whole_jobs_samples_also_after_the_world_shrinks(mix: dict[str, str]) -> None:
    def ranks(world: int, state, batches: int):
        loaders, seen = [], []
        for rank in range(world):
            loader = make_loader(mix, num_workers=0, batch_size=BATCH, seed=3, weights=WEIGHTS, rank=rank,
                                 world_size=world)
            if state is not None:
                loader.load_state_dict(state)
            for k, batch in enumerate(loader, start=1):
                seen += batch["i"].tolist()
                if k == batches:
                    break
            loaders.append(loader)
        return loaders, seen

    four, first = ranks(4, None, 3)
    assert [loader.progress() for loader in four] == [per_source(first)] * 4
    two, second = ranks(2, four[0].state_dict(), 5)
    assert [loader.progress() for loader in two] == [per_source(first + second)] * 2


def test_a_state_loaded_at_a_boundary_reaches_persistent_workers(mix: dict[str, str]) -> None:
    tilted = {"large": 0.9, "medium": 0.05, "small": 0.05}
    saved = mixed_loader(mix, 0, weights=tilted)
    epoch_batches(saved)
    state = saved.state_dict()  # epoch 1, with the large source's stream far along
    fresh = mixed_loader(mix, 2)
    fresh.load_state_dict(state)
    expected = epoch_batches(fresh)
    warm = mixed_loader(mix, 2)  # its workers persist after an epoch of their own
    epoch_batches(warm)
    warm.load_state_dict(state)
    assert epoch_batches(warm) == expected


def test_an_epoch_resumed_mid_way_with_other_chunks_keeps_its_own(mix: dict[str, str]) -> None:
    """Other chunks (another chunks_per_buffer here; another world size, or local shards read
    over the network, alike) cut the epoch's sources otherwise: resumed in its middle, the epoch
    goes on in the chunks it began on, the very batches of the run never stopped; the next epoch
    takes the new chunks."""
    whole = mixed_loader(mix, 0)
    expected = epoch_batches(whole)
    loader = mixed_loader(mix, 0)
    done = [batch["i"].tolist() for _, batch in zip(range(7), loader)]
    resumed = mixed_loader(mix, 2, chunks_per_buffer=7)
    resumed.load_state_dict(loader.state_dict())
    assert done + epoch_batches(resumed) == expected
    fresh = mixed_loader(mix, 0, chunks_per_buffer=7)
    fresh.set_epoch(1)
    assert resumed.state_dict()["chunk_samples"] == fresh.state_dict()["chunk_samples"] != \
        loader.state_dict()["chunk_samples"]
    # the large source's pass under way at the epoch's end goes on in the chunks it began on: every
    # sample once before any twice (in the new chunks, 11,000 came never and 13,700 twice)
    large = Counter(i for i in flat(expected) + flat(epoch_batches(resumed)) if i < OFFSET["medium"])
    assert set(large) == set(range(SIZES["large"])) and sum(n == 2 for n in large.values()) == 55500 - 50000


def test_other_data_under_a_name_is_refused_mid_epoch(mix: dict[str, str]) -> None:
    loader = mixed_loader(mix, 0)
    for _ in loader:
        break
    state = loader.state_dict()
    swapped = {"large": mix["medium"], "medium": mix["large"], "small": mix["small"]}
    with pytest.raises(ValueError, match=r"source\(s\) \['large', 'medium'\] hold other data than when the "
                                         r"checkpoint was taken"):
        mixed_loader(swapped, 0).load_state_dict(state)


def test_weights_are_shares_whatever_their_scale(mix: dict[str, str]) -> None:
    def counts(scale: float) -> list[int]:
        loader = make_loader(mix, num_workers=0, weights={n: w * scale for n, w in WEIGHTS.items()})
        return loader.state_dict()["mix"]["counts"]

    assert counts(1e307) == counts(1e-300) == counts(1.0) == [27_750, 16_650, 11_100]


def test_a_small_source_drawn_many_times_reads_with_few_files_open(tmp_path: Path) -> None:
    """Every piece of a local shard was mapped on its own, and Python's mmap holds a descriptor
    a mapping: a unit with thousands of pieces of a small source (here 4,000 samples of a set of
    100, in one unit) ran out of them ("Too many open files" at 1,024, here 256). One mapping a
    shard for each unit holds a few."""
    import pipeline

    pipeline.write_shards(tmp_path / "big", {"i": np.arange(20_000), "x": np.zeros((20_000, 4), np.float32)},
                          quiet=True)
    pipeline.write_shards(tmp_path / "small", {"i": np.arange(100) + 10**6, "x": np.ones((100, 4), np.float32)},
                          quiet=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # 256, or room for 64 more where this process already holds more (a long session's test process)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(256, max(map(int, os.listdir("/proc/self/fd"))) + 64), hard))
    try:
        loader = make_loader({"big": str(tmp_path / "big"), "small": str(tmp_path / "small")},
                             samples={"big": 20_000, "small": 4_000}, num_workers=0, batch_size=256, seed=0)
        ids = np.concatenate([batch["i"].numpy() for batch in loader])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert sorted(ids[ids < 10**6].tolist()) == list(range(20_000))
    assert Counter(ids[ids >= 10**6].tolist()) == {10**6 + n: 40 for n in range(100)}


def test_a_small_source_drawn_many_times_reads_each_piece_once_a_block_and_counts_each_damaged_draw(
        tmp_path: Path, monkeypatch) -> None:
    """Each draw of a small source's sample was a read of its own (a 10-sample set at half the
    weight: 50x slower than the rest of the epoch); a repeat is now the same rows again, except
    where its read lost a damaged record: that is read, counted and stood in for at each draw."""
    import pipeline.stream.units as units

    write_shards(tmp_path / "big", {"i": np.arange(4000), "x": np.zeros((4000, 16), np.float32)}, quiet=True)
    x = np.arange(10, dtype=np.float32)[:, None].repeat(16, 1) + 0.5
    write_shards(tmp_path / "small", {"i": 10**6 + np.arange(10), "x": x}, pack=1, quiet=True)
    shard = next((tmp_path / "small").glob("*.tar"))
    data = bytearray(shard.read_bytes())
    data[data.index(x[3].tobytes()) + 5] ^= 0x08  # sample 3 fails its checksum
    shard.write_bytes(bytes(data))
    reads = Counter()
    read_rows = units.read_rows
    monkeypatch.setattr(units, "read_rows", lambda url, *args, **kwargs: (reads.update([Path(url).parent.name]),
                                                                          read_rows(url, *args, **kwargs))[1])
    loader = make_loader({"big": tmp_path / "big", "small": tmp_path / "small"}, samples={"big": 4000, "small": 2000},
                         num_workers=0, batch_size=250, on_error="skip", seed=1)
    ids = np.concatenate([batch["i"].numpy() for batch in loader])
    drawn = Counter(ids[ids >= 10**6].tolist())
    assert len(ids) == 6000 and 10**6 + 3 not in drawn
    assert loader.stats()["skipped_pieces"] == loader.stats()["replaced_samples"] == 200  # each of its 200 draws
    assert reads["small"] < 200 + 10 * 20  # the damaged one's draws, and each sample once a block


def bump(sample: dict) -> dict:
    sample["x"] += 1  # an augmentation in place
    return sample


def test_each_draw_of_a_repeated_sample_is_its_own_to_change_in_place(tmp_path: Path) -> None:
    """Repeats of a piece read once shared its rows: a field of varied shapes is a list of views of
    them, so an in-place transform added 1 to a sample 2 to 4 times."""
    for name, n, offset in (("big", 400, 0), ("small", 5, 10**6)):
        with ShardWriter(tmp_path / name, quiet=True) as sink:
            for i in range(n):
                sink.write({"i": offset + i, "x": np.zeros(3 + i % 2, np.float32)})
    loader = make_loader({"big": tmp_path / "big", "small": tmp_path / "small"}, samples={"big": 400, "small": 200},
                         num_workers=0, batch_size=50, seed=1, sample_transform=bump)
    bumped = Counter(float(x.max()) for batch in loader for x in batch["x"])
    assert bumped == {1.0: 600}


def test_a_small_source_drawn_many_times_is_cut_as_a_source_of_the_samples_it_gives(tmp_path: Path) -> None:
    """A source of 100 samples drawn 200 times an epoch was cut by its own size: into chunks of
    one sample, each a piece of the plan to place and read, which made the epoch 7 times slower
    than one of a single source as large. It is cut as a source of the samples it gives an epoch."""
    write_shards(tmp_path / "big", {"i": np.arange(20_000), "x": np.zeros((20_000, 4), np.float32)}, quiet=True)
    write_shards(tmp_path / "small", {"i": 10**6 + np.arange(100), "x": np.ones((100, 4), np.float32)}, quiet=True)
    loader = make_loader({"big": tmp_path / "big", "small": tmp_path / "small"}, samples={"big": 20_000, "small": 20_000},
                         num_workers=0, batch_size=256, seed=0)
    chunks = loader.state_dict()["chunk_samples"]
    assert chunks[0] == chunks[1] > 1
    ids = np.concatenate([batch["i"].numpy() for batch in loader])
    assert sorted(ids[ids < 10**6].tolist()) == list(range(20_000))
    assert Counter(ids[ids >= 10**6].tolist()) == {10**6 + n: 200 for n in range(100)}


def test_a_unit_makes_each_shards_url_and_index_entry_once_however_many_pieces_it_reads(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """A mix of sets of one sample a record reads thousands of pieces of one record from a few
    shards, and each piece formatted its shard's name twice and made its index entry (offsets,
    checksums) anew: as much as reading and checking the record. A unit now makes each once;
    the next unit anew (entries kept longer would fill the memory of a set of many shards)."""
    import pipeline.stream.units as units
    from pipeline.format.shard_table import ShardTable
    from pipeline.storage.indexes import IndexedShards
    from pipeline.stream.units import UnitReader

    for name, first in (("a", 0), ("b", 10**6)):
        write_shards(tmp_path / name, {"i": first + np.arange(600), "x": np.ones((600, 4), np.float32)}, pack=1,
                     shard_samples=200, quiet=True)
    unit, urls, entries, pieces = [0, False], Counter(), Counter(), Counter()
    read, item, url, read_rows = UnitReader.read, ShardTable.item, IndexedShards.url, units.read_rows

    def counted(counts: Counter, key: str) -> None:
        if unit[1]:  # (the loader's own look-ups, outside a unit's reads, are not the pieces')
            counts[unit[0], key] += 1

    def read_unit(self, *args):
        unit[0], unit[1] = unit[0] + 1, True
        try:
            return read(self, *args)
        finally:
            unit[1] = False

    def url_of(self, i: int) -> str:
        counted(urls, f"{self.base} {i}")
        return url(self, i)

    def entry(self, i: int):
        counted(entries, f"{id(self)} {i}")
        return item(self, i)

    monkeypatch.setattr(UnitReader, "read", read_unit)
    monkeypatch.setattr(IndexedShards, "url", url_of)
    monkeypatch.setattr(ShardTable, "item", entry)
    monkeypatch.setattr(units, "read_rows", lambda url, *args, **kwargs: (counted(pieces, url),
                                                                          read_rows(url, *args, **kwargs))[1])
    loader = make_loader({"a": tmp_path / "a", "b": tmp_path / "b"}, num_workers=0, batch_size=100, seed=2,
                         shuffle_buffer=600, chunks_per_buffer=120)
    ids = np.concatenate([batch["i"].numpy() for batch in loader])
    assert sorted(ids.tolist()) == list(range(600)) + list(10**6 + np.arange(600))
    assert unit[0] > 1 and sum(pieces.values()) > 4 * len(pieces)  # several units, many pieces of each shard in each
    assert set(urls.values()) == set(entries.values()) == {1}  # a shard's once a unit
    assert len(urls) == len(entries) == len(pieces)


def test_many_small_sources_are_cut_as_one_set_of_their_samples_and_every_unit_holds_each(tmp_path: Path) -> None:
    """Each source was cut by its own size into chunks for a unit of its own: a mix of 20 sets of
    500 samples put 64 chunks of each in every unit, a sample a chunk (a mix of 200 such sets read
    17 times slower than one set of their samples). The sources are cut for the mix's unit, as one
    set of 10,000 samples is; each unit still holds some of every source."""
    write_shards(tmp_path / "one", {"i": np.arange(10_000)}, pack=1, quiet=True)
    for s in range(20):
        write_shards(tmp_path / f"s{s}", {"i": s * 500 + np.arange(500)}, pack=1, quiet=True)
    one = make_loader(tmp_path / "one", num_workers=0, batch_size=250, seed=0)
    mix = make_loader({f"s{s}": tmp_path / f"s{s}" for s in range(20)}, num_workers=0, batch_size=250, seed=0)
    assert mix.state_dict()["chunk_samples"] == one.state_dict()["chunk_samples"] * 20 == [19] * 20
    batches = [batch["i"].numpy() for batch in mix]
    assert sorted(np.concatenate(batches).tolist()) == list(range(10_000))
    units = [np.concatenate(batches[u:u + 5]) for u in range(0, 40, 5)]  # 1,250 samples: an eighth of the epoch
    assert all(len(set((unit // 500).tolist())) == 20 for unit in units)


def test_a_mix_of_more_sources_than_chunks_per_buffer_cuts_each_to_at_least_half_a_sets_chunk(tmp_path: Path) -> None:
    """Cut to its share of a unit, each of 40 sources mixed on 8 chunks a buffer was read in
    chunks of a fortieth of a unit: units of 40 chunks, five times one set's. A source's chunk
    is at least half of one set's: a unit holds at most twice one set's chunks."""
    for s in range(40):
        write_shards(tmp_path / f"s{s}", {"i": s * 1000 + np.arange(1000)}, pack=1, quiet=True)
    mix = make_loader({f"s{s}": tmp_path / f"s{s}" for s in range(40)}, num_workers=0, batch_size=250, seed=0,
                      chunks_per_buffer=8, shuffle_buffer=5000)
    assert mix.state_dict()["chunk_samples"] == [5000 // 16] * 40  # (not 5000 // 40)
    assert sorted(np.concatenate([batch["i"].numpy() for batch in mix]).tolist()) == list(range(40_000))
