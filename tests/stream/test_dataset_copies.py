"""A copy of a dataset (deepcopy, pickle, copy.copy) plays the epochs the original would, and
shares nothing with it that a loader moves."""

from __future__ import annotations

import copy
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

import pipeline


@pytest.fixture(scope="module")
def numbered(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("copies") / "set"
    pipeline.write_shards(folder, {"i": np.arange(1000)}, shard_samples=100, quiet=True)
    return folder


def epochs(dataset: pipeline.ShardDataset, count: int) -> tuple[list[list[int]], dict]:
    """The order of each of ``count`` epochs played by persistent workers, and the stats."""
    loader = pipeline.make_loader(dataset, num_workers=2)
    orders = [[i for batch in loader for i in batch["i"].tolist()] for _ in range(count)]
    return orders, loader.stats()


@pytest.mark.parametrize("copied", [copy.deepcopy, lambda d: pickle.loads(pickle.dumps(d)), copy.copy])
def test_a_copy_plays_a_new_order_every_epoch_as_the_original(numbered: Path, copied) -> None:
    """A deepcopy or a pickled copy held its epoch in private memory: persistent workers forked
    from it played epoch 0's order at every epoch (and a checkpoint of it resumed another order
    than the one played, losing a quarter of the epoch), and counted nothing in stats()."""
    original = pipeline.ShardDataset(numbered, batch_size=100, seed=0)
    expected, _ = epochs(pipeline.ShardDataset(numbered, batch_size=100, seed=0), 3)
    assert len({tuple(order) for order in expected}) == 3 and all(sorted(o) == list(range(1000)) for o in expected)
    played, stats = epochs(copied(original), 3)
    assert played == expected
    assert stats["decode_s"] > 0  # (the workers' time, counted where the training process sees it)


def test_a_shallow_copys_epoch_is_its_own(numbered: Path) -> None:
    """copy.copy shared the epoch: the copy's set_epoch(7) moved the original to epoch 7."""
    original = pipeline.ShardDataset(numbered, batch_size=100, seed=0)
    shallow = copy.copy(original)
    shallow.set_epoch(7)
    assert (original.epoch, shallow.epoch) == (0, 7)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("copied", [copy.deepcopy, lambda d: pickle.loads(pickle.dumps(d))])
def test_a_loader_that_ran_copies_and_its_copy_plays_on(numbered: Path, copied, persistent: bool) -> None:
    """Its workers' start kept the Event and the shared array of its last loop, which only
    processes it starts may get: 'Condition objects should only be shared between processes
    through inheritance' (a config system's deepcopy, a loader sent to another process)."""
    reference = pipeline.make_loader(numbered, num_workers=0, batch_size=100, seed=0)
    expected = [[b["i"].tolist() for b in reference] for _ in range(2)]
    loader = pipeline.make_loader(numbered, num_workers=2, persistent_workers=persistent, batch_size=100, seed=0)
    assert [b["i"].tolist() for b in loader] == expected[0]
    copy_of_it = copied(loader)
    assert [b["i"].tolist() for b in copy_of_it] == expected[1]
    assert [b["i"].tolist() for b in loader] == expected[1]  # (its own workers, untouched by the copy's)


def test_a_dataset_holds_few_files_open_for_its_shared_numbers(numbered: Path) -> None:
    """Each number a dataset shares with its workers (its epoch, the marks of what its warnings
    told) was a block of shared memory of its own, each holding a file open: a process held half
    as many datasets before "Too many open files" as with the epoch alone."""
    def open_files() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_files()
    kept = [pipeline.ShardDataset(numbered, batch_size=8) for _ in range(20)]
    assert open_files() - before <= 2 * len(kept)  # its counts' table and its numbers' block
    copies = [copy.deepcopy(kept[0]) for _ in range(20)]  # (a validation variant of a training set)
    assert open_files() - before <= 2 * (len(kept) + len(copies))
    del kept, copies
