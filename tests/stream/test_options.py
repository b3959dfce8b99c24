"""Wrong options of a dataset or a loader are errors when it is made, naming the option and what
it may be, and wrong checkpoints say which data they came from: not an exception of NumPy or
PyTorch at the first batch, in a worker."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import pipeline
from pipeline import ShardDataset, make_loader
from pipeline.stream.loader import ShardLoader


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("options") / "set"
    pipeline.write_shards(out, {"x": np.zeros((200, 3), np.float32), "y": np.arange(200)}, shard_samples=50,
                          quiet=True)
    return out


BAD_OPTIONS = [
    # one of rank and world_size, and the other from nowhere: world_size=2 alone was rank 0 in every process
    ({"world_size": 2}, "world_size=2 is given without rank=: pass both (each process its own rank, 0 to "
                        "world_size - 1), or neither under torchrun or torch.distributed"),
    ({"rank": 1}, "rank=1 is given without world_size=: pass both"),
    ({"rank": 0, "world_size": 0}, "world_size must be at least 1, got 0"),
    ({"rank": 2, "world_size": 2}, "rank 2 is outside world size 2: ranks are 0 to 1"),
    ({"as_tuple": ("x", "q")}, "as_tuple names ['q'], which are not in the index (it has ['x', 'y'])"),
    ({"as_tuple": ("x", "y"), "fields": ["x"]}, "as_tuple names ['y'], which fields= leaves out"),
    ({"fields": []}, "fields=[] names no field: name at least one, or leave fields out"),
    ({"fields": "x"}, "fields is a list of field names, e.g. fields=['x', 'y'], got the string 'x'"),
    ({"batch_size": None}, "batch_size must be an integer >= 1, got None"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
    ({"num_workers": -1}, "num_workers must be an integer >= 0 (0: read in the training process), got -1"),
    ({"num_workers": 256}, "num_workers=256 is more than the 255 workers a loader counts the reads of (stats()): "
                           "give fewer"),
    ({"prefetch_factor": 0}, "prefetch_factor must be >= 1 (messages each worker keeps ready), got 0"),
    ({"in_order": False}, "in_order=False lets workers' batches come in any order, which no state can resume"),
    ({"seed": -1}, "seed must be an integer from 0 to 2**64 - 1 (it picks the shuffle's orders, from its 64 bits: a "
                   "larger one would give another's), got -1"),
    ({"seed": 1.7}, "seed must be an integer from 0 to 2**64 - 1 (it picks the shuffle's orders, from its 64 bits: a "
                    "larger one would give another's), got 1.7"),
    ({"seed": 2**64}, "seed must be an integer from 0 to 2**64 - 1 (it picks the shuffle's orders, from its 64 bits: "
                      "a larger one would give another's), got 18446744073709551616"),
    ({"shuffle_buffer": -5}, "shuffle_buffer must be an integer >= 1, or None for its default, got -5"),
    ({"shuffle_buffer": 2.5}, "shuffle_buffer must be an integer >= 1, or None for its default, got 2.5"),
    ({"chunks_per_buffer": 0}, "chunks_per_buffer must be an integer >= 1, or None for its default, got 0"),
    ({"read_ahead": "2"}, "read_ahead must be an integer >= 0 (units read ahead), or None for its default, got '2'"),
]

#: options whose wrong type (a string from a config file, "False", is truthy) is a TypeError
BAD_TYPES = [
    ({"shuffle": "False"}, "shuffle must be True or False, got 'False'"),
    ({"drop_last": "False"}, "drop_last must be True or False, got 'False'"),
    ({"check_records": "false"}, "check_records must be True or False, got 'false'"),
    ({"rank": "1", "world_size": 2}, "rank and world_size must be integers, got '1' and 2"),
    ({"fill": 0}, "fill maps field names to the values of samples that lack them, e.g. fill={'txt': ''}; got 0"),
    ({"sample_transform": "normalise"}, "sample_transform must be a function (or None), got 'normalise'"),
]


@pytest.mark.parametrize("options,message", BAD_TYPES, ids=[str(o) for o, _ in BAD_TYPES])
def test_an_option_of_the_wrong_type_is_refused_not_taken_for_true(shards: Path, options: dict, message: str) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        make_loader(shards, **options)


def test_numpy_integers_are_whole_numbers_and_an_epoch_is_one_too(shards: Path, monkeypatch) -> None:
    assert len(make_loader(shards, num_workers=0, batch_size=64, shuffle=0, drop_last=1)) == 3  # 0/1: as torch takes
    loader = make_loader(shards, num_workers=0, batch_size=50, seed=np.int64(1), rank=np.int64(0),
                         world_size=np.int32(1))
    assert next(iter(loader))["y"].tolist() == next(iter(make_loader(shards, num_workers=0, batch_size=50,
                                                                      seed=1)))["y"].tolist()
    for epoch in (1.7, -1):
        with pytest.raises(ValueError, match=re.escape(f"an epoch is an integer >= 0, got {epoch!r}")):
            loader.set_epoch(epoch)
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match=re.escape("the environment variable WORLD_SIZE='two' is not an integer")):
        make_loader(shards)


@pytest.mark.parametrize("options,message", BAD_OPTIONS, ids=[str(o) for o, _ in BAD_OPTIONS])
def test_a_wrong_option_is_an_error_naming_it_when_the_loader_is_made(shards: Path, options: dict,
                                                                     message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        make_loader(shards, **options)


def test_a_shard_loader_made_directly_checks_its_workers_as_make_loader_does(shards: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("num_workers=300 is more than the 255 workers a loader counts")):
        ShardLoader(ShardDataset(shards), num_workers=300)


def test_dataloaders_pin_memory_device_is_passed_on(shards: Path) -> None:
    """A loop written for a DataLoader may pass it: it was refused, asking "did you mean pin_memory=?"."""
    loader = make_loader(shards, num_workers=0, batch_size=50, pin_memory=False, pin_memory_device="cuda")
    assert loader.pin_memory_device == "cuda"
    assert len(next(iter(loader))["y"]) == 50
    assert make_loader(ShardDataset(shards), pin_memory_device="cuda").pin_memory_device == "cuda"  # beside a dataset


@pytest.mark.parametrize("weight", [float("inf"), float("nan"), -1, "0.7", True])
def test_a_weight_that_is_not_a_finite_number_at_least_0_is_an_error_naming_its_source(shards: Path,
                                                                                      weight: float) -> None:
    with pytest.raises(ValueError, match=re.escape(f"the weight of source 'a' must be a finite number >= 0, got "
                                                   f"{weight!r}")):
        make_loader({"a": shards, "b": shards}, weights={"a": weight, "b": 1})


@pytest.mark.parametrize("option, value, message", [
    ("weights", [0.7, 0.3], "weights= takes a mapping {source name: weight} (the sources are ['a', 'b']), got [0.7, 0.3]"),
    ("samples", 100, "samples= takes a mapping {source name: samples} (the sources are ['a', 'b']), got 100"),
])
def test_weights_or_samples_not_given_per_source_are_an_error_showing_the_form(shards: Path, option: str, value,
                                                                               message: str) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        make_loader({"a": shards, "b": shards}, **{option: value})


def test_a_build_with_a_negative_seed_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("seed must be an integer >= 0 (it picks the validation rows), "
                                                   "got -1")):
        pipeline.write_shards(tmp_path / "o", {"x": np.arange(10)}, validation=0.2, seed=-1, quiet=True)


def test_a_transform_may_make_the_fields_as_tuple_names(shards: Path) -> None:
    loader = make_loader(shards, num_workers=0, batch_size=50, as_tuple=("y", "z"),
                         sample_transform=lambda s: {**s, "z": s["y"] * 2})
    y, z = next(iter(loader))
    assert z.tolist() == (2 * y).tolist() and len(z) == 50
    loader = make_loader(shards, num_workers=0, batch_size=50, as_tuple=("z", "y"),
                         batch_transform=lambda b: {"y": b["y"], "z": b["y"] + 1})
    z, y = next(iter(loader))  # as_tuple applies to what batch_transform returns
    assert z.tolist() == (y + 1).tolist()
    loader = make_loader(shards, num_workers=0, batch_size=50, as_tuple=("x", "y"), batch_transform=lambda b: b["x"])
    with pytest.raises(TypeError, match=re.escape("as_tuple picks fields of a batch, but batch_transform returned a "
                                                  "Tensor: return a dict from it, or leave as_tuple out")):
        next(iter(loader))


def test_sample_transform_outputs_are_put_together_as_stored_fields_are(shards: Path) -> None:
    def tokens(sample: dict) -> dict:
        n = int(sample["y"])
        return {"y": sample["y"], "tokens": np.arange(n % 3 + 1), "note": None if n % 2 else n}
    batch = next(iter(make_loader(shards, num_workers=0, batch_size=6, shuffle=False, sample_transform=tokens)))
    assert [t.tolist() for t in batch["tokens"]] == [list(range(n % 3 + 1)) for n in range(6)]  # shapes differ: a list
    assert batch["note"] == [0, None, 2, None, 4, None] and batch["y"].tolist() == list(range(6))
    for workers in (0, 2):  # complex values (a spectrum, say) become a tensor too
        batch = next(iter(make_loader(shards, num_workers=workers, batch_size=6, shuffle=False,
                                      sample_transform=lambda s: {"y": s["y"], "z": s["x"] * 1j, "w": complex(s["y"])})))
        assert batch["z"].dtype == torch.complex64 and batch["z"].shape == (6, 3) and batch["w"].tolist() == [*range(6)]

    def some_have_more(sample: dict) -> dict:
        return {**sample, "w": 1} if int(sample["y"]) % 2 else dict(sample)
    with pytest.raises(ValueError, match=re.escape("sample_transform returned the fields ['x', 'y'] for one sample of "
                                                   "a batch and ['w', 'x', 'y'] for another: return the same fields")):
        next(iter(make_loader(shards, num_workers=0, batch_size=6, shuffle=False, sample_transform=some_have_more)))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_transform_keeps_fields_it_leaves_alone_and_stacks_only_exact_values(tmp_path: Path,
                                                                                       workers: int) -> None:
    """An identity transform stacked a field of several types (2**53 + 1 beside 0.5 became a float,
    True beside 2 an int) and token sequences of a batch whose lengths agreed (a tensor in one step,
    a list in the next); a transform got tensors in workers, NumPy values without."""
    ys = [2**53 + 1, 0.5, 3, 4, True, 2, None, 7]
    with pipeline.ShardWriter(tmp_path / "s") as writer:
        for n, y in enumerate(ys):
            writer.write({"y": y, "seq": np.arange(2 if n < 4 else 3, dtype=np.int16), "n": np.int32(n)})

    def batches(transform) -> list:
        return list(make_loader(tmp_path / "s", num_workers=workers, batch_size=2, shuffle=False,
                                sample_transform=transform))

    def relabelled(sample: dict) -> dict:
        sample["n"] = sample["n"] + 1
        return sample
    plain = list(make_loader(tmp_path / "s", num_workers=workers, batch_size=2, shuffle=False))
    for same in (batches(lambda s: s), batches(relabelled)):
        assert [b["y"] for b in same] == [b["y"] for b in plain] == [ys[i:i + 2] for i in range(0, 8, 2)]
        assert all(type(v) is type(w) for b, c in zip(same, plain) for v, w in zip(b["y"], c["y"]))
        assert all(isinstance(b["seq"], list) and [t.tolist() for t in b["seq"]] == [t.tolist() for t in c["seq"]]
                   for b, c in zip(same, plain))  # lengths agree within each batch, yet the field varies: a list
    kinds = batches(lambda s: {"kind": type(s["n"]).__name__})
    assert [kind for b in kinds for kind in b["kind"]] == ["int32"] * 8  # (a tensor in workers, before)

    def changed(sample: dict) -> dict:  # what one array holds exactly, of a kind among its values', is stacked
        odd = sample["n"] % 2
        return {"seq": np.pad(sample["seq"], (0, 3 - len(sample["seq"]))), "mean": np.float32(1.5) if odd else 0.25,
                "both": sample["n"] if odd else 0.5, "ids": np.array([5], np.uint64) if odd else np.array([1]), "big": 2**63 + 1}
    for batch in batches(changed):
        assert batch["seq"].dtype == torch.int16 and batch["seq"].shape == (2, 3)  # padded in every sample: stacked
        assert batch["mean"].dtype == torch.float64 and batch["mean"].tolist() == [0.25, 1.5]
        assert isinstance(batch["both"], list) and batch["both"][0] == 0.5 and int(batch["both"][1]) % 2
        assert isinstance(batch["ids"], list) and batch["big"] == [2**63 + 1] * 2  # (a float64, a bare TypeError)


@pytest.mark.parametrize("source, given", [(None, "NoneType None"), (123, "int 123"), (b"x.tar", "bytes b'x.tar'")])
def test_a_source_that_names_no_shards_is_told_what_does(source, given: str) -> None:
    """None and numbers failed as "'NoneType' object is not iterable"."""
    with pytest.raises(TypeError, match=re.escape(
            f"the source is an index (a folder, index.json or its URL), a brace pattern or a list of shard paths, or "
            f"a mapping {{name: index}} of sources to mix; got {given}")):
        make_loader(source)


def test_shard_paths_may_come_from_any_iterable(shards: Path) -> None:
    paths = sorted(shards.glob("*.tar"))
    for given in (iter(paths), np.array([str(p) for p in paths]), map(str, paths)):
        assert sum(len(batch["y"]) for batch in make_loader(given, batch_size=50)) == 200
    with pytest.raises(ValueError, match="no shards"):
        make_loader([])


def test_a_source_of_a_mix_that_names_no_shards_or_a_fill_beside_fields_is_named(shards: Path) -> None:
    with pytest.raises(TypeError, match=re.escape(
            "source 'a' of the mix is an index (a folder, index.json or its URL), a brace pattern or a list of shard "
            "paths; got dict {'b': 'x'}")):
        make_loader({"a": {"b": "x"}})
    with pytest.raises(ValueError, match=re.escape(  # 'y' is in the index: fields= leaves it out
            "fill keys ['y'] are not in the fields read (fields=) (it has ['x'])")):
        make_loader(shards, fields=["x"], fill={"y": 0})


def _normalise_in_place(sample: dict) -> None:
    sample["x"] = sample["x"] * 2  # and no return: the loop got None (or a TypeError from inside the loader)


def _scale_in_place(batch: dict) -> None:
    batch["x"] *= 2


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_that_returns_nothing_is_told_to_return_what_it_changed(shards: Path, workers: int) -> None:
    """A sample_transform returning None failed with "'NoneType' object is not iterable"; a
    batch_transform returning None gave the loop None for every batch."""
    with pytest.raises(TypeError, match=re.escape(
            "sample_transform must return a dict of fields, got NoneType (a function that changes the sample in place "
            "still ends with `return sample`)")):
        next(iter(make_loader(shards, num_workers=workers, batch_size=6, sample_transform=_normalise_in_place)))
    with pytest.raises(TypeError, match=re.escape(
            "batch_transform returned None: return the batch (a function that changes it in place still ends with "
            "`return batch`)")):
        next(iter(make_loader(shards, num_workers=workers, batch_size=6, batch_transform=_scale_in_place)))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_iterated_by_two_loops_at_once_is_an_error_not_a_lost_epoch(shards: Path, workers: int) -> None:
    loader = make_loader(shards, num_workers=workers, batch_size=10)
    with pytest.raises(RuntimeError, match=re.escape("this loader was iterated again while this loop over it ran")) \
            as caught:
        for _ in zip(loader, loader):
            pass
    assert type(caught.value) is RuntimeError  # not a WorkerError of the workers the second loop stopped
    loader = make_loader(shards, num_workers=workers, batch_size=10)
    first = next(iter(loader))  # a loop left behind (a break) is no matter: the next one goes on from there
    rest = list(loader)
    assert sorted(torch.cat([first["y"], *(batch["y"] for batch in rest)]).tolist()) == list(range(200))


def test_an_empty_mix_or_a_source_name_that_keys_cannot_tell_apart_is_an_error(shards: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("an empty mapping mixes no source: give {name: index}")):
        make_loader({})
    for name in ("", "t/a", 3):  # keys 'a/k' of source 'a' and of 't/a' would be alike; "" names an unmixed set
        with pytest.raises(ValueError, match=re.escape(f"a mix names its sources by non-empty strings without '/' (a "
                                                       f"sample's key is 'name/key', and progress() counts by name), "
                                                       f"got {name!r}")):
            make_loader({name: shards, "b": shards})


def test_a_checkpoint_of_other_data_or_of_a_mix_says_so(shards: Path, tmp_path: Path) -> None:
    loader = make_loader(shards, num_workers=0, batch_size=16)
    next(iter(loader))
    state = loader.state_dict()
    other = Path(shutil.copytree(shards, tmp_path / "other"))
    pipeline.write_shards(other, {"x": np.ones((200, 3), np.float32), "y": np.arange(200)}, shard_samples=50,
                          quiet=True, overwrite=True)
    with pytest.raises(ValueError, match=re.escape(f"cannot resume: {other} holds other data than when the "
                                                   f"checkpoint was taken")):
        make_loader(other, num_workers=0, batch_size=16).load_state_dict(state)
    mixed = make_loader({"a": shards, "b": other}, num_workers=0, batch_size=16)
    next(iter(mixed))
    with pytest.raises(ValueError, match="cannot resume: the checkpoint was taken with a mix of sources, this "
                                         "loader reads one source"):
        loader.load_state_dict(mixed.state_dict())


def test_a_list_of_indexed_shards_in_any_order_gives_the_epochs_of_the_index_s_order(shards: Path) -> None:
    """Nodes that glob their own copies list the shards in their file systems' orders: the plans
    differed, so under DDP a quarter of the epoch came twice and another never, and a checkpoint
    was refused on the other node as other data."""
    listed = sorted(str(path) for path in shards.glob("*.tar"))
    def loader(source):
        return make_loader(source, num_workers=0, batch_size=16, seed=3, world_size=2, rank=1)

    epochs = [[batch["y"].tolist() for batch in loader(order)]
              for order in (shards, listed, listed[::-1], listed[1::2] + listed[::2])]
    assert epochs[0] == epochs[1] == epochs[2] == epochs[3]
    stopped = loader(listed[::-1])
    for number, _ in enumerate(stopped):
        if number == 1:
            break
    resumed = loader(listed)
    resumed.load_state_dict(stopped.state_dict())  # (mid-epoch: on the same data only)
    assert [batch["y"].tolist() for batch in resumed] == epochs[0][2:]


def test_a_pattern_with_a_shard_the_index_lacks_warns_that_it_streams_without_the_index(shards: Path,
                                                                                          tmp_path: Path) -> None:
    folder = Path(shutil.copytree(shards, tmp_path / "more"))
    shutil.copy(folder / "shard-000003.tar", folder / "shard-000004.tar")  # not in the index
    pattern = str(folder / "shard-{000000..000004}.tar")
    with pytest.warns(UserWarning, match=re.escape(f"1 of the 5 shards given are not in the index beside them "
                                                   f"({folder / 'index.json'}), e.g. {folder / 'shard-000004.tar'}")) as caught:
        dataset = pipeline.ShardDataset(pattern, batch_size=50, shuffle=False)
    assert caught[0].filename == __file__  # the user's line, not the library's
    with pytest.warns(UserWarning, match="1 of the 5 shards given") as caught:
        pipeline.make_loader(pattern, num_workers=0, batch_size=50)
    assert caught[0].filename == __file__
    assert sum(len(batch["y"]) for batch in dataset) == 250


def test_more_workers_than_cores_is_warned_of_once(shards: Path) -> None:
    """PyTorch warns when the loader is made; the loader warned again as its workers started."""
    import os
    import warnings

    workers = len(os.sched_getaffinity(0)) + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make_loader(shards, num_workers=workers, batch_size=50)
        assert sum(len(batch["y"]) for batch in loader) == 200
    told = [w for w in caught if "suggested max number of worker" in str(w.message)]
    assert len(told) == 1, [str(w.message) for w in told]


def test_a_world_size_in_the_environment_without_a_rank_is_refused(shards: Path, monkeypatch) -> None:
    """PyTorch Lightning's launcher sets WORLD_SIZE and LOCAL_RANK, not RANK: each process took
    rank 0's share."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match=re.escape("WORLD_SIZE=2 is set but RANK is not, and torch.distributed is not "
                                                   "initialised: every process would read rank 0's share. Make the "
                                                   "loader once torch.distributed is initialised (under PyTorch "
                                                   "Lightning, in the LightningDataModule's")):
        make_loader(shards)
    assert make_loader(shards, rank=1, world_size=2).dataset.rank == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert make_loader(shards).dataset.world_size == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_made_before_its_process_group_is_not_read_as_another_rank(shards: Path, tmp_path: Path,
                                                                             monkeypatch, workers: int) -> None:
    """A loader made before trainer.fit started the process group kept rank 0 of 1 (or what the
    environment said then): every rank read the whole set, without a word."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    early = make_loader(shards, batch_size=10, num_workers=workers)
    chosen = make_loader(shards, batch_size=10, num_workers=workers, rank=1, world_size=2)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match=re.escape("this dataset was made as rank 1 of 2, before "
                                                         "torch.distributed was initialised, and this process is rank "
                                                         "0 of 1: it would read another share than its rank's.")):
            next(iter(early))
        with pytest.raises(RuntimeError, match="this dataset was made as rank 1 of 2"):
            next(iter(early.dataset))
        with pytest.raises(RuntimeError, match="this dataset was made as rank 1 of 2"):  # (forked: the parent's group)
            next(iter(DataLoader(early.dataset, batch_size=None, num_workers=workers)))
        assert sum(len(batch["y"]) for batch in chosen) == 100  # rank= and world_size= given: as chosen
        assert make_loader(shards, num_workers=workers).dataset.world_size == 1  # made after: the group's
    finally:
        torch.distributed.destroy_process_group()
