"""A ShardLoader's position when the training loop does more than run epochs through: a loop
through a DevicePrefetcher left early and taken up again, ``set_epoch`` before each epoch of a
resumed run, and ``set_epoch`` or ``load_state_dict`` while a loop is under way. Each delivers
every batch of the uninterrupted run once, in its order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline import DevicePrefetcher, make_loader
from tests.stream.shardsets import random_sizes, uneven_shards

pytestmark = pytest.mark.filterwarnings("ignore:.*suggested max number of worker")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return uneven_shards(tmp_path_factory.mktemp("loops"), random_sizes(4, 150, 400, seed=8), pack=4)


def loader_of(shards: Path, workers: int):
    return make_loader(shards, num_workers=workers, batch_size=32, seed=5, shuffle_buffer=300)


def ids(batches) -> list[list[int]]:
    return [batch["i"].tolist() for batch in batches]


@pytest.fixture(scope="module")
def reference(shards: Path) -> list[list[list[int]]]:
    """Two epochs of the uninterrupted run."""
    loader = loader_of(shards, 0)
    return [ids(loader), ids(loader)]


def first(n: int, batches) -> list[list[int]]:
    out = []
    for batch in batches:
        out.append(batch["i"].tolist())
        if len(out) == n:
            return out
    raise AssertionError(f"fewer than {n} batches")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_prefetched_loop_left_early_and_taken_up_again_skips_no_batch(shards: Path, workers: int,
                                                                      reference) -> None:
    loader = loader_of(shards, workers)
    head = first(5, DevicePrefetcher(loader))  # it held batch 6, fetched ahead
    prefetcher = DevicePrefetcher(loader)
    middle = first(3, prefetcher)
    assert prefetcher.state_dict()["batches"] == 8
    tail = ids(DevicePrefetcher(loader))
    assert head + middle + tail == reference[0] and ids(loader) == reference[1]


@pytest.mark.parametrize("workers", [0, 2])
def test_set_epoch_before_each_epoch_of_a_resumed_run_continues_it(shards: Path, workers: int, reference) -> None:
    loader = loader_of(shards, workers)
    head = first(7, loader)
    state = loader.state_dict()
    resumed = loader_of(shards, workers)
    resumed.load_state_dict(state)
    epochs = []
    for epoch in range(state["epoch"], 2):  # the loop of a script that saves its epoch with the state
        resumed.set_epoch(epoch)
        epochs.append(ids(resumed))
    assert [head + epochs[0], epochs[1]] == reference
    resumed.set_epoch(0)  # another epoch than the current one: from its beginning
    assert ids(resumed) == reference[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loop_under_way_ends_when_the_loader_is_moved(shards: Path, workers: int, reference) -> None:
    loader = loader_of(shards, workers)
    first(7, loader)
    state = loader.state_dict()
    loader = loader_of(shards, workers)
    loop = iter(loader)
    first(2, loop)
    loader.load_state_dict(state)
    assert list(loop) == []  # it would go on from batch 3
    assert ids(loader) == reference[0][7:] and loader.epoch == 1
    loop = iter(loader)
    first(1, loop)
    loader.set_epoch(0)
    assert list(loop) == [] and ids(loader) == reference[0] and ids(loader) == reference[1]


def test_a_loader_gives_back_no_more_batches_than_it_delivered(shards: Path) -> None:
    loader = loader_of(shards, 0)
    first(2, loader)
    with pytest.raises(ValueError, match="cannot give back 3 batches: 2 were delivered"):
        loader.give_back(3)
    loader.give_back(2)
    assert np.array_equal(np.concatenate(ids(loader)), np.concatenate(first(len(loader), loader_of(shards, 0))))
