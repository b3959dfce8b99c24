"""What load_state_dict refuses, and how: objects that are not a loader's state, positions outside
the epoch, a mix whose sources come in another order, and a set_epoch that leaves a loaded
position; and the warning of an epoch without a batch."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from pipeline import make_loader
from tests.stream.shardsets import uneven_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("state")
    return {"a": uneven_shards(folder / "a", [300, 200, 140]), "b": uneven_shards(folder / "b", [250, 100])}


def loader_of(source, **options):
    return make_loader(source, num_workers=0, batch_size=32, seed=1, shuffle_buffer=128, **options)


def state_after(loader, batches: int) -> dict:
    for n, _ in enumerate(loader, start=1):
        if n == batches:
            break
    return loader.state_dict()


def test_a_state_loads_and_its_batches_follow(shards) -> None:
    whole = [batch["i"].tolist() for batch in loader_of(shards["a"])]
    resumed = loader_of(shards["a"])
    resumed.load_state_dict(state_after(loader_of(shards["a"]), 5))
    assert len(whole) == 20 and resumed.batches_left() == 15
    assert len(resumed) == 20  # the epoch's, as DataLoader's: frameworks size epochs by it
    assert [batch["i"].tolist() for batch in resumed] == whole[5:]


@pytest.mark.parametrize("change, error, message", [
    (lambda state: None, TypeError, "load_state_dict takes what the loader's state_dict() returned (a dict), "
                                    "not a NoneType"),
    (lambda state: {}, ValueError, "load_state_dict takes what the loader's state_dict() returned; this dict is "
                                   "not one (it has no 'version'; its keys: [])"),
    (lambda state: {"weight": 1, "bias": 2}, ValueError, "this dict is not one (it has no 'version'; its keys: "
                                                         "['bias', 'weight'])"),
    (lambda state: {"version": 2}, ValueError, "not a loader state: it lacks ['epoch', 'legs', 'batches', "
                                               "'world_size'] (give load_state_dict what the loader's "
                                               "state_dict() returned)"),
    (lambda state: {**state, "batches": 21}, ValueError, "cannot resume: the checkpoint says 21 batches of epoch 0 "
                                                         "were delivered on 1 rank(s), where a rank has 20 at most"),
    (lambda state: {**state, "legs": [[2, 11]]}, ValueError, "the checkpoint says 11 batches of epoch 0 were "
                                                             "delivered on 2 rank(s), where a rank has 10 at most"),
    (lambda state: {**state, "batches": -5}, ValueError, "not a loader state: epoch 0, legs [], batches -5 and "
                                                         "world_size 1 cannot be negative"),
    (lambda state: {**state, "epoch": "one"}, ValueError, "not a loader state: epoch 'one', legs [], batches 5 and "
                                                          "world_size 1 must be whole numbers"),
    # int() took these, truncated: a damaged or hand-made state resumed somewhere else
    (lambda state: {**state, "epoch": 1.5}, ValueError, "epoch 1.5, legs [], batches 5 and world_size 1 must be "
                                                        "whole numbers"),
    (lambda state: {**state, "batches": "5"}, ValueError, "batches '5' and world_size 1 must be whole numbers"),
    (lambda state: {**state, "epoch": True}, ValueError, "epoch True, legs [], batches 5"),
    (lambda state: {**state, "batches": 21.0}, ValueError, "the checkpoint says 21 batches of epoch 0 were "
                                                           "delivered"),  # a whole float is read (YAML), then checked
])
def test_what_is_not_a_loaders_state_is_refused_at_load_time(shards, change, error, message: str) -> None:
    state = state_after(loader_of(shards["a"]), 5)
    loader = loader_of(shards["a"])
    with pytest.raises(error, match=re.escape(message)):
        loader.load_state_dict(change(state))
    assert len(loader) == 20  # where it stood


def test_the_last_batch_of_an_epoch_is_a_position_inside_it(shards) -> None:
    state = state_after(loader_of(shards["a"]), 20)
    loader = loader_of(shards["a"])
    loader.load_state_dict({**state, "epoch": 0, "batches": 20})
    assert loader.batches_left() == 0 and list(loader) == [] and loader.batches_left() == 20  # then the next epoch


def test_a_mix_whose_sources_come_in_another_order_is_told_so(shards) -> None:
    state = state_after(loader_of({"a": shards["a"], "b": shards["b"]}), 3)
    swapped = loader_of({"b": shards["b"], "a": shards["a"]})
    with pytest.raises(ValueError, match=re.escape("cannot resume: the checkpoint mixes sources ['a', 'b'], this "
                                                   "loader ['b', 'a'] (the same names, in the same order: a "
                                                   "source's order of samples comes from its place in the mix); give "
                                                   "them so, or start the new mix afresh, without load_state_dict "
                                                   "(every source's stream then starts over)")):
        swapped.load_state_dict(state)


def test_other_data_mid_epoch_is_refused_without_contradicting_itself(shards) -> None:
    state = state_after(loader_of(shards["a"]), 3)
    with pytest.raises(ValueError, match=r"holds other data than when the checkpoint was taken .*resume on the "
                                         r"shards the checkpoint was taken on \(other data may follow at an epoch "
                                         r"boundary, not in the middle of an epoch\)"):
        loader_of(shards["b"]).load_state_dict(state)


def test_a_state_of_version_2_goes_on_where_its_plan_is_this_versions(shards) -> None:
    """Version 2 padded every rank under remainder='pad', also with drop_last where this version
    drops the rest instead (640 samples on 3 ranks, 6 batches of 32 each either way): its
    checkpoints of such an epoch are refused mid-epoch, named, and go on elsewhere."""
    def older(state: dict) -> dict:
        assert state["version"] == 4
        return {**state, "version": 2}

    three = dict(drop_last=True, rank=1, world_size=3)
    with pytest.raises(ValueError, match=re.escape(
            "cannot resume: this checkpoint of epoch 0 was taken by an earlier version of pipeline, which with "
            "drop_last=True and remainder='pad' padded 640 samples on 3 ranks with repeats that could stand in for "
            "real samples dropped with each rank's short batch; this version drops the rest instead, so the epoch's "
            "batches differ: go on from the epoch's start (loader.set_epoch(0)) or the next epoch's "
            "(loader.set_epoch(1)), or finish this epoch with the earlier version")):
        loader_of(shards["a"], **three).load_state_dict(older(state_after(loader_of(shards["a"], **three), 2)))
    at_the_start = loader_of(shards["a"], **three)
    at_the_start.load_state_dict(older(loader_of(shards["a"], **three).state_dict()))
    assert len(at_the_start) == 6
    for same_plan in (dict(drop_last=True), dict(rank=1, world_size=3)):  # one rank; no drop_last
        whole = [batch["i"].tolist() for batch in loader_of(shards["a"], **same_plan)]
        resumed = loader_of(shards["a"], **same_plan)
        resumed.load_state_dict(older(state_after(loader_of(shards["a"], **same_plan), 2)))
        assert [batch["i"].tolist() for batch in resumed] == whole[2:]


def test_set_epoch_that_leaves_a_loaded_position_warns(shards) -> None:
    state = state_after(loader_of(shards["a"]), 5)
    loader = loader_of(shards["a"])
    loader.load_state_dict(state)
    loader.set_epoch(0)  # the checkpoint's epoch: goes on from it, quietly
    assert loader.batches_left() == 15
    with pytest.warns(UserWarning, match=re.escape("set_epoch(1) leaves the position load_state_dict loaded "
                                                   "(epoch 0, 5 batches in): epoch 1 plays from its start")) as caught:
        loader.set_epoch(1)
    assert caught[0].filename == __file__ and loader.batches_left() == 20
    between = loader_of(shards["a"])
    whole_loop = loader_of(shards["a"])
    list(whole_loop)
    between.load_state_dict(whole_loop.state_dict())  # after the loop: epoch 1 from its start
    with pytest.warns(UserWarning, match=re.escape("set_epoch(0) leaves the position load_state_dict loaded "
                                                   "(the start of epoch 1): epoch 0 plays from its start")):
        between.set_epoch(0)  # (a loop whose epoch counter was not restored would replay epoch 0)
    at_the_end = loader_of(shards["a"])
    at_the_end.load_state_dict(state_after(loader_of(shards["a"]), 20))  # the epoch's last batch: nothing left
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        at_the_end.set_epoch(1)
    assert len(at_the_end) == 20


def test_an_epoch_without_a_batch_warns_rather_than_passing_silently(tmp_path: Path) -> None:
    tiny = uneven_shards(tmp_path / "tiny", [2])
    loader = make_loader(tiny, num_workers=0, batch_size=4, drop_last=True, rank=1, world_size=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # (not Python's once a line: the loader's own once, not once an epoch)
        for _ in range(3):
            assert list(loader) == []
    assert [str(w.message) for w in caught] == ["no epoch has a batch for rank 1: 2 samples on 3 rank(s), batch_size=4, "
                                                "drop_last=True, remainder='pad'"]
    assert caught[0].filename == __file__ and loader.epoch == 3


def test_a_checkpoint_of_version_3_goes_on_in_its_own_layout(tmp_path: Path) -> None:
    """Version 3 gave each rank's rest of a unit a unit of its own; this version joins a short
    rest to the last unit. ``data/loader_state_v3.json`` holds checkpoints version 3 took (in a
    last unit, after a leg on 2 ranks; then after a batch on 3) and the batches it delivered
    after each: this version delivers the very same, and its own checkpoints of that epoch keep
    the layout."""
    recorded = json.loads((Path(__file__).parent / "data" / "loader_state_v3.json").read_text())
    folder = uneven_shards(tmp_path / "v3", recorded["sizes"])

    def loader(rank: int, world: int, state: dict):
        resumed = loader_of(folder, rank=rank, world_size=world)
        resumed.load_state_dict(state)
        return resumed

    assert [[batch["i"].tolist() for batch in loader(r, 3, recorded["state"])] for r in range(3)] == \
        recorded["rest_on_3"]
    assert [batch["i"].tolist() for batch in loader(0, 1, recorded["state_after_1"])] == recorded["rest_on_1"]
    again = loader(0, 3, recorded["state"])
    state = state_after(again, 1)
    assert state["version"] == 4 and state["short_last_unit"] is True
    assert [batch["i"].tolist() for batch in loader(0, 1, state)] == recorded["rest_on_1"]
    finished = loader(0, 1, state)
    assert len(list(finished)) == len(recorded["rest_on_1"])
    assert "short_last_unit" not in state_after(finished, 2)  # the next epoch: this version's layout


def test_a_state_of_version_3_at_an_epoch_boundary_plays_the_epoch_in_this_versions_layout(tmp_path: Path) -> None:
    """Its layout is of its own epoch's middle only: taken at a boundary, the next epoch played in
    this version's layout while its checkpoints and a loop after a break went on in the old one
    (12 samples missed)."""
    folder = uneven_shards(tmp_path / "s", [700, 333, 512, 825, 230])
    fresh = [batch["i"].tolist() for batch in loader_of(folder, rank=1, world_size=2)]
    boundary = {**loader_of(folder, rank=1, world_size=2).state_dict(), "version": 3}
    loader = loader_of(folder, rank=1, world_size=2)
    loader.load_state_dict(boundary)
    head = [batch["i"].tolist() for _, batch in zip(range(37), loader)]
    state = loader.state_dict()
    assert "short_last_unit" not in state
    assert head + [batch["i"].tolist() for batch in loader] == fresh  # a loop after a break goes on


def test_a_state_refused_leaves_the_loader_as_it_was(tmp_path: Path) -> None:
    """The chunks of a refused state's epoch were kept: the epoch then played in them."""
    folder = uneven_shards(tmp_path / "s", [700, 333, 512, 825, 230])
    fresh = [batch["i"].tolist() for batch in loader_of(folder, chunks_per_buffer=2)]  # chunks of 64, not 2
    state = {**state_after(loader_of(folder, rank=0, world_size=2), 3), "batches": 10**6}
    loader = loader_of(folder, chunks_per_buffer=2)
    with pytest.raises(ValueError, match="cannot resume: the checkpoint says 1000000 batches of epoch 0"):
        loader.load_state_dict(state)
    assert [batch["i"].tolist() for batch in loader] == fresh


@pytest.mark.parametrize("mix, message", [
    ({"offsets": ["x", 0]}, "not a loader state: mix offsets ['x', 0] must be a stream position (a whole number >= 0) "
                            "for each of the 2 source(s)"),
    ({"offsets": [250]}, "mix offsets [250] must be a stream position"),  # a source's position missing
    ({"offsets": [-5000, 0]}, "mix offsets [-5000, 0] must be a stream position"),
    ({"pass_chunks": [0, 0]}, "mix pass_chunks [0, 0] must be a chunk size (a whole number >= 1)"),
])
def test_a_mix_state_of_other_values_is_refused_leaving_the_loader_as_it_was(shards, mix: dict, message: str) -> None:
    """int() refused some with its own words after the loader had taken the state's chunks;
    others were taken: a source missing, a position before its stream."""
    sources = {"a": shards["a"], "b": shards["b"]}
    fresh = [batch["i"].tolist() for batch in loader_of(sources, chunks_per_buffer=2)]
    state = state_after(loader_of(sources), 3)
    loader = loader_of(sources, chunks_per_buffer=2)
    with pytest.raises(ValueError, match=re.escape(message)):
        loader.load_state_dict({**state, "mix": {**state["mix"], **mix}})
    assert [batch["i"].tolist() for batch in loader] == fresh


def test_progress_counts_no_short_batch_that_drop_last_dropped(tmp_path: Path) -> None:
    """Under remainder="keep" a rank may have a batch more than another: at its last one, the
    others' short batches, dropped, were counted delivered (1001 reported for 999)."""
    folder = uneven_shards(tmp_path / "s", [21])
    loaders = [make_loader(folder, num_workers=0, batch_size=11, remainder="keep", drop_last=True, rank=rank,
                           world_size=2) for rank in range(2)]
    with pytest.warns(UserWarning, match="no epoch has a batch for rank 0"):
        assert list(loaders[0]) == []  # spans of 10 and 11: one batch of 11, on rank 1 only
    for batch in loaders[1]:
        assert len(batch["i"]) == 11 and loaders[1].progress() == {"": 11}


def test_len_is_an_epochs_batches_on_this_world_size_after_a_resume_from_another(shards) -> None:
    """PyTorch Lightning reads len() once, after loading a checkpoint, as every later epoch's: a
    checkpoint of 2 ranks resumed on 1 gave the resumed stretch, and cut every later epoch."""
    old = loader_of(shards["a"], rank=0, world_size=2)
    state = state_after(old, 3)
    resumed = loader_of(shards["a"], rank=0, world_size=1)
    resumed.load_state_dict(state)
    whole = len(loader_of(shards["a"]))
    left = resumed.batches_left()
    assert len(resumed) == whole and left == whole - 6  # (3 batches on each of 2 ranks delivered)
    assert sum(1 for _ in resumed) == left  # the resumed epoch runs out, which ends it
    assert len(resumed) == resumed.batches_left() == whole


def test_numpy_numbers_given_as_options_leave_a_plain_state_and_the_same_plan(shards) -> None:
    """A ``shuffle_buffer`` of NumPy's, unsigned at that, plays the epoch an int does, and the
    state holds plain ints: a JSON file or ``torch.load``'s default (weights only) reads it."""
    import numpy as np
    import torch

    whole = [batch["i"].tolist() for batch in loader_of(shards["a"])]
    given = make_loader(shards["a"], num_workers=0, batch_size=32, seed=1, shuffle_buffer=np.uint32(128),
                        chunks_per_buffer=np.int64(2))
    assert [batch["i"].tolist() for batch in given] == [batch["i"].tolist() for batch in
                                                         loader_of(shards["a"], chunks_per_buffer=2)]
    state = state_after(make_loader(shards["a"], num_workers=0, batch_size=32, seed=1,
                                    shuffle_buffer=np.uint32(128)), 5)
    assert json.loads(json.dumps(state)) == state
    (saved := Path(shards["a"]).parent / "numpy_state.pt").unlink(missing_ok=True)
    torch.save(state, saved)
    resumed = loader_of(shards["a"])
    resumed.load_state_dict(torch.load(saved))
    assert [batch["i"].tolist() for batch in resumed] == whole[5:]


def test_a_state_of_an_indexed_set_and_one_of_shards_without_an_index_are_told_apart(shards, tmp_path: Path) -> None:
    import shutil

    copies = []
    for shard in sorted(Path(shards["a"]).glob("*.tar")):
        copies.append(str(shutil.copy(shard, tmp_path)))  # the same shards, without their index
    with pytest.raises(ValueError, match=re.escape("cannot resume: the checkpoint was taken on an indexed set, this "
                                                   "loader reads shards without one: resume on the shards the "
                                                   "checkpoint was taken on, indexed as they were then")):
        loader_of(copies).load_state_dict(state_after(loader_of(shards["a"]), 5))
    with pytest.raises(ValueError, match=re.escape("the checkpoint was taken on shards without an index, this loader "
                                                   "reads an indexed set")):
        loader_of(shards["a"]).load_state_dict(state_after(loader_of(copies), 1))
