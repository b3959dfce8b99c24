"""ShardDataset and ShardLoader with real DataLoader worker processes."""

from __future__ import annotations

import functools
import gc
import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds

import pipeline
from pipeline import ShardDataset, ShardError, make_loader
from tests.stream.shardsets import random_sizes, uneven_shards

pytestmark = pytest.mark.filterwarnings("ignore:.*suggested max number of worker")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """7 shards of random sizes (5037 samples), packed 16 to a record."""
    return uneven_shards(tmp_path_factory.mktemp("uneven"), random_sizes(7, 200, 1500, seed=4), pack=16)


def epoch_ids(loader) -> list[np.ndarray]:
    return [batch["i"].numpy().copy() for batch in loader]


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_every_sample_exactly_once_per_epoch_with_workers(shards: Path, workers: int) -> None:
    total = pipeline.load_index(shards).samples
    loader = make_loader(shards, num_workers=workers, batch_size=64, shuffle_buffer=500)
    for _ in range(2):
        batches = epoch_ids(loader)
        ids = np.concatenate(batches)
        assert sorted(ids.tolist()) == list(range(total))
        assert len(batches) == len(loader)
        assert sum(len(b) < 64 for b in batches) <= max(workers, 1)  # one short batch per worker at most


def test_fewer_shards_than_consumers_still_exact(tmp_path: Path) -> None:
    folder = uneven_shards(tmp_path / "two", [700, 13])
    loader = make_loader(folder, num_workers=3, batch_size=32, shuffle_buffer=100)
    ids = np.concatenate(epoch_ids(loader))
    assert sorted(ids.tolist()) == list(range(713))


def test_batches_hold_the_stored_values(shards: Path) -> None:
    for batch in make_loader(shards, num_workers=2, batch_size=50):
        assert batch["x"].dtype == torch.float32 and batch["i"].dtype == torch.int64
        assert torch.equal(batch["x"][:, 0], 2 * batch["i"].float())
        assert torch.equal(batch["x"][:, 1], -batch["i"].float())


def test_same_seed_and_epoch_repeat_and_a_new_epoch_reorders(shards: Path) -> None:
    first = epoch_ids(make_loader(shards, num_workers=2, batch_size=64, seed=3))
    again = epoch_ids(make_loader(shards, num_workers=2, batch_size=64, seed=3))
    assert all((a == b).all() for a, b in zip(first, again)) and len(first) == len(again)
    loader = make_loader(shards, num_workers=2, batch_size=64, seed=3)
    loader.set_epoch(1)
    assert not (np.concatenate(epoch_ids(loader))[:500] == np.concatenate(first)[:500]).all()
    other_seed = epoch_ids(make_loader(shards, num_workers=2, batch_size=64, seed=4))
    assert not (np.concatenate(other_seed)[:500] == np.concatenate(first)[:500]).all()


def run_until(shards: Path, workers: int, stop: int | None, state=None, epochs: int = 2):
    """Batches of ``epochs`` epochs; with ``stop``, also the state after that many batches."""
    loader = make_loader(shards, num_workers=workers, batch_size=48, seed=9, shuffle_buffer=400)
    if state is not None:
        loader.load_state_dict(state)
    out = []
    while loader.epoch < epochs:
        for batch in loader:
            out.append(batch["i"].numpy().copy())
            if stop is not None and len(out) == stop:
                return out, loader.state_dict()
    return out, None


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [1, 17, 105, 106, 130])
def test_resume_yields_exactly_the_batches_an_uninterrupted_run_yields(shards: Path, workers: int, stop: int) -> None:
    reference, _ = run_until(shards, workers, None)
    head, state = run_until(shards, workers, stop)
    tail, _ = run_until(shards, workers, None, state=state)
    assert len(head) + len(tail) == len(reference)
    assert all((a == b).all() for a, b in zip(head + tail, reference))


@pytest.mark.parametrize("before, after", [(2, 3), (3, 1), (0, 2)])
def test_resume_on_other_workers_yields_the_very_same_batches(shards: Path, before: int, after: int) -> None:
    reference, _ = run_until(shards, 1, None)  # a rank's batches do not depend on its workers
    head, state = run_until(shards, before, 23)
    tail, _ = run_until(shards, after, None, state=state)
    assert len(head) + len(tail) == len(reference)
    assert all((a == b).all() for a, b in zip(head + tail, reference))


@pytest.mark.parametrize("workers", [0, 2])
def test_after_a_resumed_epoch_set_epoch_replays_the_whole_epoch(shards: Path, workers: int) -> None:
    total = pipeline.load_index(shards).samples
    _, state = run_until(shards, workers, 5, epochs=1)
    loader = make_loader(shards, num_workers=workers, batch_size=48, seed=9, shuffle_buffer=400)
    loader.load_state_dict(state)
    rest = [batch["i"].numpy().copy() for batch in loader]
    loader.set_epoch(0)
    full = len(loader)
    again = np.concatenate([batch["i"].numpy() for batch in loader])
    assert len(rest) == full - 5 and sorted(again.tolist()) == list(range(total))


def test_resume_refuses_a_changed_plan_mid_epoch(shards: Path) -> None:
    _, state = run_until(shards, 0, 5)
    loader = make_loader(shards, num_workers=0, batch_size=32, seed=9)
    with pytest.raises(ValueError, match="batch_size=48, this loader has batch_size=32"):
        loader.load_state_dict(state)


def test_prefetcher_state_excludes_the_batch_fetched_ahead(shards: Path) -> None:
    reference, _ = run_until(shards, 2, None, epochs=1)
    loader = make_loader(shards, num_workers=2, batch_size=48, seed=9, shuffle_buffer=400)
    prefetcher = pipeline.DevicePrefetcher(loader, "cpu")
    head = []
    for batch in prefetcher:
        head.append(batch["i"].numpy().copy())
        if len(head) == 10:
            state = prefetcher.state_dict()
            assert prefetcher.progress() == {"": 480} != loader.progress()  # (the loader counts the 11th, held)
            break
    tail, _ = run_until(shards, 2, None, state=state, epochs=1)
    assert all((a == b).all() for a, b in zip(head + tail, reference)) and len(head + tail) == len(reference)
    assert 0 <= prefetcher.stats()["input_bound"] <= 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA takes the device")
def test_a_prefetcher_asked_for_cuda_without_it_says_so_before_the_loop(shards: Path) -> None:
    with pytest.raises(ValueError, match=r"^DevicePrefetcher\(device='cuda'\): CUDA is not available on this machine "
                                         r"\(torch .*\); leave device out to use the GPU where there is one, else the "
                                         r"CPU$"):
        pipeline.DevicePrefetcher(make_loader(shards, num_workers=0, batch_size=48), "cuda")


def test_remainder_drop_last_fields_and_tuples(shards: Path) -> None:
    total = pipeline.load_index(shards).samples
    dataset = ShardDataset(shards, batch_size=100, drop_last=True, fields=["i"], as_tuple=["i"])
    batches = list(dataset)
    assert all(isinstance(b, tuple) and len(b) == 1 and len(b[0]) == 100 for b in batches)
    assert len(batches) == total // 100 == len(dataset)
    two_ranks = [ShardDataset(shards, batch_size=100, remainder="pad", rank=r, world_size=2) for r in (0, 1)]
    counts = [sum(len(b["i"]) for b in ds) for ds in two_ranks]
    assert counts == [math.ceil(total / 2)] * 2
    with pytest.raises(ValueError, match=r"fields \['nope'\] are not in the index"):
        ShardDataset(shards, fields=["nope"])


@pytest.mark.parametrize("workers", [0, 2])
def test_tuples_are_batches_with_and_without_workers(shards: Path, workers: int) -> None:
    loader = make_loader(shards, num_workers=workers, batch_size=100, as_tuple=["i", "x"])
    batches = list(loader)
    assert all(type(b) is tuple and len(b) == 2 and len(b[0]) == len(b[1]) <= 100 for b in batches)
    ids = np.concatenate([b[0].numpy() for b in batches])
    assert np.array_equal(np.sort(ids), np.arange(pipeline.load_index(shards).samples))
    assert all(torch.equal(x[:, 0], 2 * i.float()) for i, x in batches)


@pytest.mark.parametrize("workers", [0, 2])
def test_sample_and_batch_transforms_run_in_the_workers(shards: Path, workers: int) -> None:
    loader = make_loader(shards, num_workers=workers, batch_size=10,
                         sample_transform=lambda s: {"i": s["i"], "double": s["i"] * 2},
                         batch_transform=lambda b: (b["i"], b["double"]))
    batches = list(loader)
    assert {type(batch) for batch in batches} == {tuple}  # as the transform made it, with workers or without
    assert all(torch.equal(double, 2 * i) for i, double in batches)
    assert sorted(torch.cat([i for i, _ in batches]).tolist()) == list(range(pipeline.load_index(shards).samples))


def class_sorted_shards(folder: Path, classes: int = 10, per_class: int = 3000) -> Path:
    """One shard per class, as when data arrive sorted by label."""
    with pipeline.ShardWriter(folder, "sorted", shard_samples=per_class, pack=32) as writer:
        labels = np.repeat(np.arange(classes), per_class)
        writer.write_columns({"label": labels, "i": np.arange(len(labels))})
    return folder


def mixing(batches: list[np.ndarray], classes: int = 10) -> tuple[float, float]:
    """Mean distinct classes per batch, mean label entropy per batch (bits)."""
    distinct, entropy = [], []
    for labels in batches:
        p = np.bincount(labels, minlength=classes) / len(labels)
        distinct.append((p > 0).sum())
        entropy.append(-(p[p > 0] * np.log2(p[p > 0])).sum())
    return float(np.mean(distinct)), float(np.mean(entropy))


@pytest.mark.parametrize("chunks, ranks", [(None, 1), (32, 1), (None, 8)])  # 32: what remote shards get by default
def test_shuffle_mixes_across_class_sorted_shards(tmp_path: Path, chunks: int | None, ranks: int) -> None:
    """A full random permutation gives about 10 classes and 3.28 bits per batch of 256; reading
    the sorted shards in order gives 1 class and 0 bits. We require at least 9 classes and 3.0
    bits on average: a batch that mixes most shards, which shard-level shuffling alone (one
    class per batch) or a small buffer over one shard at a time cannot reach; on one rank of 8
    too, whose span is an eighth of the epoch (8 times the samples: the same span)."""
    folder = class_sorted_shards(tmp_path / "sorted", per_class=3000 * ranks)
    loader = make_loader(folder, num_workers=2, batch_size=256, seed=1, chunks_per_buffer=chunks, rank=0,
                         world_size=ranks)
    batches = [b["label"].numpy() for b in loader]  # the last ones too
    distinct, entropy = mixing(batches)
    reference = mixing([np.random.default_rng(0).permutation(np.repeat(np.arange(10), 3000))[i:i + 256]
                        for i in range(0, 29_000, 256)])
    assert reference[0] > 9.9 and reference[1] > 3.2
    assert distinct >= 9.0 and entropy >= 3.0, (distinct, entropy)
    fewest = min(len(np.unique(batch)) for batch in batches)  # the last batches too: no unit of one chunk or two
    assert fewest >= 7, fewest


def webdataset_shards(folder: Path, count: int, per_shard: int) -> list[str]:
    folder.mkdir()
    urls = []
    for s in range(count):
        path = folder / f"wds-{s:03d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for j in range(per_shard):
                i = s * per_shard + j
                sink.write({"__key__": f"k{i:05d}", "npy": np.full(3, i, np.float32), "cls": i})
        urls.append(str(path))
    return urls


def test_foreign_webdataset_shards_stream_without_an_index(tmp_path: Path) -> None:
    urls = webdataset_shards(tmp_path / "wds", count=4, per_shard=50)
    loader = make_loader(urls, num_workers=2, batch_size=16)
    seen = []
    for batch in loader:
        assert torch.equal(batch["npy"][:, 0], batch["cls"].float())
        seen.extend(batch["cls"].tolist())
    assert sorted(seen) == list(range(200))
    pattern = str(tmp_path / "wds" / "wds-{000..003}.tar")
    assert sorted(int(c) for b in ShardDataset(pattern, batch_size=7) for c in b["cls"]) == list(range(200))


def test_foreign_shards_stream_the_fields_of_the_first_record_of_the_first_shard_every_epoch(tmp_path: Path) -> None:
    folder = tmp_path / "wds"
    folder.mkdir()
    for s in range(4):  # every 7th sample lacks its caption, the very first among them
        with wds.TarWriter(str(folder / f"w-{s}.tar")) as sink:
            for i in range(s * 20, s * 20 + 20):
                sink.write({"__key__": f"k{i:03d}", "cls": i, **({"txt": f"caption {i}"} if i % 7 else {})})
    pattern = str(folder / "w-{0..3}.tar")
    loader = make_loader(pattern, num_workers=2, batch_size=8, seed=1)
    assert [{key for batch in loader for key in batch} for _ in range(4)] == [{"cls"}] * 4
    with pytest.raises(ShardError, match=r"the first record, 'k000', has no field \['txt'\]"):
        make_loader(pattern, fields=["cls", "txt"])  # said when it is made, not in some later epoch
    with pytest.raises(ValueError, match=r"fill keys \['txt'\] are not in the fields read \(those of the shards' "
                                         r"first record, or fields=\) \(it has \['cls'\]\)"):
        make_loader(pattern, fill={"txt": None})  # it would be ignored
    loader = make_loader(pattern, num_workers=2, batch_size=8, seed=1, fields=["cls", "txt"], fill={"txt": None})
    for _ in range(3):
        captions = {int(c): t for batch in loader for c, t in zip(batch["cls"], batch["txt"])}
        assert captions == {i: f"caption {i}" if i % 7 else None for i in range(80)}


def test_a_record_with_fields_the_first_lacks_is_told_of_and_read_when_named(tmp_path: Path, caplog) -> None:
    """Shards of mixed image types (``.jpg`` and ``.png`` samples): without an index, the fields
    read are the first record's, so another record's ``png`` is not read: said, not silent."""
    with wds.TarWriter(str(tmp_path / "a.tar")) as writer:
        for i in range(10):
            writer.write({"__key__": f"s{i}", "png" if i == 9 else "jpg": bytes([i]) * 8, "cls": i})
    url = str(tmp_path / "a.tar")
    batch = next(iter(make_loader(url, num_workers=0, batch_size=10, shuffle=False)))
    assert batch["jpg"][9] is None and "png" not in batch
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"{url}: record 's9' has fields ['png'] that are not read (the fields read are ['cls', 'jpg'], those of the "
        f"shards' first record): pass fields= naming every field, and fill= a value for the records without one, "
        f"to read them; other records with fields that are not read are logged at DEBUG level"]
    named = next(iter(make_loader(url, num_workers=0, batch_size=10, shuffle=False, fields=["jpg", "png", "cls"],
                                  fill={"png": None})))
    assert named["png"][9] == bytes([9]) * 8 and named["png"][:9] == [None] * 9 and named["jpg"][9] is None


def test_fields_not_read_are_told_of_once_not_for_every_shard_every_epoch(tmp_path: Path, caplog) -> None:
    """The first sample of the first shard lacks the caption every other one has: each shard,
    every epoch, warned of it again, for ever; now the first one does, and the rest are DEBUG."""
    for s in range(3):
        with wds.TarWriter(str(tmp_path / f"s-{s}.tar")) as writer:
            for i in range(4):
                writer.write({"__key__": f"k{s}-{i}", "cls": i, **({"notes.txt": "words"} if s or i else {})})
    loader = make_loader(str(tmp_path / "s-{0..2}.tar"), num_workers=0, batch_size=4)
    with caplog.at_level("DEBUG", logger="pipeline.stream"):
        for _ in range(2):
            assert sum(len(batch["cls"]) for batch in loader) == 12
    told = [(r.levelname, r.getMessage()) for r in caplog.records if "that are not read" in r.getMessage()]
    assert [level for level, _ in told] == ["WARNING"] + ["DEBUG"] * 5
    assert told[0][1].endswith("; other records with fields that are not read are logged at DEBUG level")


def test_foreign_samples_of_other_types_keep_their_values_and_types(tmp_path: Path) -> None:
    """Stacked with a float32 beside it, an int64 of 2**62 + 1 became a float64 of 2**62; JSON's
    2**53 + 1 beside 0.5 became 2**53 (numbers a float64 holds exactly still make one array)."""
    import io

    def npy(array: np.ndarray) -> bytes:
        out = io.BytesIO()
        np.save(out, array)
        return out.getvalue()

    with wds.TarWriter(str(tmp_path / "mixed.tar")) as sink:
        sink.write({"__key__": "k0", "npy": npy(np.array([2**62 + 1], np.int64)), "json": b"9007199254740993"})
        sink.write({"__key__": "k1", "npy": npy(np.array([0.5], np.float32)), "json": b"0.5"})
        sink.write({"__key__": "k2", "npy": npy(np.array([3], np.int64)), "json": b"1"})
    batch = next(iter(ShardDataset([str(tmp_path / "mixed.tar")], batch_size=3, shuffle=False)))
    assert [a.tolist() for a in batch["npy"]] == [[2**62 + 1], [0.5], [3]]
    assert [a.dtype for a in batch["npy"]] == [torch.int64, torch.float32, torch.int64]
    assert batch["json"] == [9007199254740993, 0.5, 1] and [type(v) for v in batch["json"]] == [int, float, int]
    with wds.TarWriter(str(tmp_path / "exact.tar")) as sink:
        for key, text in (("k0", b"1"), ("k1", b"2.5")):
            sink.write({"__key__": key, "json": text})
    assert next(iter(ShardDataset([str(tmp_path / "exact.tar")], batch_size=2, shuffle=False)))["json"].tolist() == \
        [1.0, 2.5]


def test_foreign_shards_under_ddp_are_refused_unless_uneven_ranks_are_allowed(tmp_path: Path) -> None:
    urls = webdataset_shards(tmp_path / "wds", count=1, per_shard=10)
    with pytest.raises(ValueError, match=r"1 shards without an index, under DDP \(world size 2\): ranks would get "
                                         r"different numbers of samples.*pipeline index SHARDS.*allow_uneven=True"):
        ShardDataset(urls, batch_size=4, rank=0, world_size=2)
    dataset = ShardDataset(urls, batch_size=4, rank=0, world_size=2, allow_uneven=True)
    with pytest.warns(UserWarning, match="1 shards without an index for 2 consumers") as caught:
        assert sum(len(b["cls"]) for b in dataset) == 10
    assert caught[0].filename == __file__


def test_fewer_shards_than_consumers_is_told_once_at_the_users_line_not_by_workers_every_epoch(tmp_path: Path) -> None:
    """Warned in a worker, it pointed at torch's fetch.py, and non-persistent workers gave it every
    epoch; the loader knows its workers, and tells as it is made. A plain DataLoader's loop over the
    dataset tells it from the user's line too, not from torch's."""
    urls = webdataset_shards(tmp_path / "wds", count=1, per_shard=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make_loader(urls, num_workers=2, batch_size=4, persistent_workers=False)
        for _ in range(2):
            assert sum(len(batch["cls"]) for batch in loader) == 10
    told = [w for w in caught if "shards without an index" in str(w.message)]
    assert [str(w.message) for w in told] == ["1 shards without an index for 2 consumers (ranks x workers): some read "
                                              "nothing; index them with `pipeline index` for exact epochs"]
    assert told[0].filename == __file__
    dataset = ShardDataset(urls, batch_size=4, rank=0, world_size=2, allow_uneven=True)
    with pytest.warns(UserWarning, match="1 shards without an index for 2 consumers") as caught:
        assert sum(len(b["cls"]) for b in torch.utils.data.DataLoader(dataset, batch_size=None)) == 10
    assert caught[0].filename == __file__


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loop_over_shards_without_an_index_left_early_is_told_how_to_go_on(tmp_path: Path, workers: int) -> None:
    """The loader then failed every loop, state_dict() and progress() with 'shards without an index have no known
    length', until a set_epoch."""
    urls = webdataset_shards(tmp_path / "wds", count=3, per_shard=40)
    loader = make_loader(urls, num_workers=workers, batch_size=16, fields=["cls"])
    for step, _ in enumerate(loader):
        if step == 2:
            break
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches"]) == (0, 3)
    with pytest.raises(ValueError, match=re.escape(
            "this loop would go on with epoch 0 after the 3 batches an earlier loop took, which needs an index (shards "
            "without one are streamed whole, with no plan to go on from): call loader.set_epoch(...) to play an epoch "
            "from its start, or index the shards in place (pipeline index) so that loops and checkpoints go on "
            "exactly")):
        next(iter(loader))
    with pytest.raises(TypeError, match=re.escape("progress() counts from the epoch's plan, which shards without an "
                                                  "index have not: index them in place (pipeline index)")):
        loader.progress()
    loader.set_epoch(1)
    assert sum(len(batch["cls"]) for batch in loader) == 120 and loader.epoch == 2


def test_a_corrupt_shard_is_an_error_naming_it_not_a_hang(tmp_path: Path) -> None:
    folder = uneven_shards(tmp_path / "bad", [300, 300])
    shard = folder / "part-000001.tar"
    index = pipeline.load_index(folder)
    data = bytearray(shard.read_bytes())
    data[index.shards[1].offsets[5] + 512] = 0xC1
    shard.write_bytes(bytes(data))
    loader = make_loader(folder, num_workers=2, batch_size=32)
    with pytest.raises(ShardError, match=rf"part-000001\.tar at byte {index.shards[1].offsets[5]}"):
        for _ in loader:
            pass


def test_skip_policy_counts_lost_samples_and_keeps_batch_counts(tmp_path: Path) -> None:
    folder = uneven_shards(tmp_path / "skip", [400, 300, 500], pack=4)
    (folder / "part-000001.tar").unlink()  # one shard lost after the build
    strict = make_loader(folder, num_workers=2, batch_size=32)
    with pytest.raises(pipeline.SourceError, match=r"part-000001\.tar at byte \d+: cannot open: No such file or "
                                                  r"directory; the shard set is missing a shard its index names "
                                                  r"\('pipeline verify' lists what is missing\)"):
        for _ in strict:
            pass
    loader = make_loader(folder, num_workers=2, batch_size=32, on_error="skip")
    batches = [b["i"] for b in loader]
    assert len(batches) == len(loader)  # ranks would still agree on the number of batches
    ids = torch.cat(batches).tolist()
    assert len(ids) == 1200 and not set(range(400, 700)) & set(ids)
    assert set(ids) == set(range(400)) | set(range(700, 1200))
    stats = loader.stats()
    assert stats["replaced_samples"] == 300 and stats["skipped_pieces"] >= 1


def _note_frozen(folder: Path, worker_id: int) -> None:
    (folder / f"worker-{worker_id}").write_text(str(gc.get_freeze_count()))


def test_workers_leave_what_they_inherited_out_of_their_garbage_collections(shards: Path, tmp_path: Path) -> None:
    """A collection in a worker writes to every object it visits, copying the training process's
    heap into the worker page by page: the inherited objects are frozen before anything else."""
    inherited = [[n, str(n)] for n in range(200_000)]  # the training process's own objects (a labels list)
    loader = pipeline.ShardLoader(ShardDataset(shards, batch_size=64), num_workers=2,
                                  worker_init_fn=functools.partial(_note_frozen, tmp_path))
    assert sorted(np.concatenate(epoch_ids(loader)).tolist()) == list(range(pipeline.load_index(shards).samples))
    frozen = [int((tmp_path / f"worker-{n}").read_text()) for n in range(2)]
    assert min(frozen) > len(inherited), frozen  # every list of the list, at least, is out of the collector's reach


@pytest.mark.parametrize("named", ["a folder", "a list of shards", "a pattern of shards"])
def test_a_relative_path_names_the_set_it_named_when_the_loader_was_made(tmp_path: Path, monkeypatch,
                                                                         named: str) -> None:
    """A script that changes its folder after making its loader (into a run's folder, say) read
    the other folder's shards under the first one's index: refused as a rebuild, or, without
    checks, another set's samples without a word."""
    for folder, first in (("a", 0), ("b", 1000)):
        (tmp_path / folder).mkdir()
        pipeline.write_shards(tmp_path / folder / "shards", {"x": np.arange(first, first + 100)}, quiet=True,
                              shard_samples=10)
    monkeypatch.chdir(tmp_path / "a")
    source = {"a folder": "shards", "a list of shards": [f"shards/shard-{n:06d}.tar" for n in range(10)],
              "a pattern of shards": "shards/shard-{000000..000009}.tar"}[named]
    loader = make_loader(source, num_workers=2, batch_size=10, check_records=False)
    monkeypatch.chdir(tmp_path / "b")
    assert sorted(int(x) for batch in loader for x in batch["x"]) == list(range(100))
