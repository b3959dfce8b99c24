"""A ShardLoader's position when the training loop does more than run epochs through: a loop
through a DevicePrefetcher left early and taken up again, ``set_epoch`` before each epoch of a
resumed run, and ``set_epoch`` or ``load_state_dict`` while a loop is under way. Each delivers
every batch of the uninterrupted run once, in its order."""

from __future__ import annotations

import re
import time
from itertools import islice
from pathlib import Path

import pytest
import torch

from pipeline import DevicePrefetcher, ShardDataset, make_loader
from pipeline.stream import prefetch
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


def test_a_loop_left_early_then_set_epoch_of_that_epoch_starts_it_again(shards: Path, reference) -> None:
    """As an evaluation loader used for its first batches, again and again, is."""
    loader = loader_of(shards, 0)
    for _ in range(2):
        loader.set_epoch(0)
        assert first(3, loader) == reference[0][:3]


def test_a_loader_gives_back_no_more_batches_than_it_delivered(shards: Path, reference) -> None:
    loader = loader_of(shards, 0)
    first(2, loader)
    with pytest.raises(ValueError, match="cannot give back 3 batches: 2 were delivered"):
        loader.give_back(3)
    loader.give_back(2)
    assert ids(loader) == reference[0]


@pytest.mark.parametrize("move", ["load_state_dict", "set_epoch"])
def test_a_prefetched_loop_that_moves_its_loader_then_stops_gives_nothing_back(shards: Path, reference,
                                                                              move: str) -> None:
    loader = loader_of(shards, 2)
    first(4, loader)
    state = loader.state_dict()
    loader = loader_of(shards, 2)
    prefetcher = DevicePrefetcher(loader)
    for n, _ in enumerate(prefetcher, start=1):
        if n == 2:
            loader.load_state_dict(state) if move == "load_state_dict" else loader.set_epoch(1)
            assert prefetcher.state_dict()["batches"] == (4 if move == "load_state_dict" else 0)
            break
    expected = reference[0][4:] if move == "load_state_dict" else reference[1]
    assert ids(DevicePrefetcher(loader)) == expected


def test_a_prefetched_loop_ended_by_an_error_loses_no_batch(shards: Path, reference) -> None:
    """A worker's death (or any error from the loader) ends the loop while a batch is held."""
    failed = []

    def fail_once(sample: dict) -> dict:
        if int(sample["i"]) == reference[0][5][0] and not failed:
            failed.append(True)
            raise RuntimeError("once")
        return sample

    loader = make_loader(ShardDataset(shards, batch_size=32, seed=5, shuffle_buffer=300, sample_transform=fail_once),
                         num_workers=0)
    head = []
    with pytest.raises(RuntimeError, match="once"):
        for batch in DevicePrefetcher(loader):
            head.append(batch["i"].tolist())
    assert head == reference[0][:4]  # batch 5 was held when fetching batch 6 failed
    assert head + ids(DevicePrefetcher(loader)) == reference[0]


@pytest.mark.parametrize("failing_copy", [1, 6])  # the first batch's, or one fetched ahead of the loop
def test_a_copy_to_the_device_that_fails_loses_no_batch(shards: Path, reference, monkeypatch,
                                                        failing_copy: int) -> None:
    """A copy that fails (out of device memory, say) happens after the batch left the loader: it
    is given back with the batch held, not dropped. (CUDA is not at hand here: the copy's failure
    is made, the rest is real.)"""
    copies = []

    def copy_failing_once(batch, device):
        copies.append(1)
        if len(copies) == failing_copy:
            raise torch.OutOfMemoryError("CUDA out of memory (made by the test)")
        return batch

    monkeypatch.setattr(prefetch, "_to_device", copy_failing_once)
    loader = loader_of(shards, 0)
    prefetcher = DevicePrefetcher(loader)
    head = []
    with pytest.raises(torch.OutOfMemoryError):
        for batch in prefetcher:
            head.append(batch["i"].tolist())
    assert len(head) == max(failing_copy - 2, 0)  # copy k is made before batch k - 2 is handed over
    assert head + ids(prefetcher) == reference[0]


def test_stats_sum_every_loop_over_a_prefetcher(shards: Path, reference) -> None:
    prefetcher = DevicePrefetcher(loader_of(shards, 0))
    first(3, prefetcher)  # a loop left early, then the rest of its epoch and another
    for _ in range(2):
        for _ in prefetcher:
            time.sleep(0.01)
        stats = prefetcher.stats()
        assert 0 < stats["waited_s"] < stats["elapsed_s"] and 0 < stats["input_bound"] < 1
    assert stats["batches"] == 2 * len(reference[0]) and stats["elapsed_s"] > 0.01 * (stats["batches"] - 3)


def test_a_prefetcher_over_a_plain_dataloader_may_stop_early(shards: Path) -> None:
    plain = torch.utils.data.DataLoader(list(range(10)), batch_size=2)
    prefetcher = DevicePrefetcher(plain)
    assert first_values(3, prefetcher) == [[0, 1], [2, 3], [4, 5]]
    assert first_values(5, prefetcher) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]  # a plain loader starts over


def first_values(n: int, batches) -> list[list[int]]:
    out = []
    for batch in batches:
        out.append(batch.tolist())
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loop_that_takes_every_batch_but_stops_before_the_end_ends_its_epoch(shards: Path, reference,
                                                                                workers: int) -> None:
    """``zip(range(len(loader)), loader)`` never asks for the batch after the last: the loop is
    closed, not run out. Before, the next loop resumed that epoch with no batch left (epochs of
    N, 0, N, 0 batches), silently."""
    loader = loader_of(shards, workers)
    first = [batch for _, batch in zip(range(len(loader)), loader)]
    second = list(islice(loader, len(loader)))
    assert [ids(first), ids(second)] == reference
    loader.set_epoch(0)
    for step, _ in enumerate(loader):  # a break after the last step
        if step == len(reference[0]) - 1:
            break
    assert loader.epoch == 1 and set(loader.progress().values()) == {0}  # asked before len()
    assert ids(loader) == reference[1]


def test_batches_held_by_a_prefetcher_of_ones_own_are_given_back_after_the_epoch_ended(shards: Path,
                                                                                       reference) -> None:
    """A loop closed after the last batch ends its epoch; a prefetcher that held the last batch
    (not trained on) still gives it back, or leaves it out of a checkpoint, after that: before,
    ``state_dict(in_flight=1)`` said batch -1 of the next epoch, which no loader could load."""
    epoch = reference[0]
    loader = loader_of(shards, 0)
    iterator = iter(loader)
    taken = [next(iterator) for _ in epoch]
    iterator.close()
    state = loader.state_dict(in_flight=1)
    assert (state["epoch"], state["batches"]) == (0, len(epoch) - 1)
    resumed = loader_of(shards, 0)
    resumed.load_state_dict(state)
    assert ids(resumed) == epoch[-1:]
    assert loader.batches_left() == len(reference[1])  # the epoch ended: the next one stands
    with pytest.raises(ValueError, match=f"cannot give back {len(epoch) + 1} batches: {len(epoch)} were delivered"):
        loader.give_back(len(epoch) + 1)
    assert loader.epoch == 1 and loader.batches_left() == len(reference[1])  # a refused give_back: as it was
    loader.give_back(1)  # a prefetcher of one's own, told after something asked batches_left()
    assert loader.batches_left() == 1 and ids(loader) == epoch[-1:] and ids(taken) == epoch
    assert ids(loader) == reference[1]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_prefetched_checkpoint_at_an_epochs_last_batch_stands_at_its_end_as_without_one(shards: Path, reference,
                                                                                          workers: int) -> None:
    """The prefetcher asked for the batch after the last while the last step ran: the loader's
    epoch ended, the checkpoint stood at the next epoch's start, and a resumed run that counted
    that epoch as under way (set_epoch(0)) played all of it again."""
    loader = loader_of(shards, workers)
    prefetcher = DevicePrefetcher(loader)
    states, lengths, played = [], [], []
    for batch in prefetcher:
        played.append(batch["i"].tolist())
        states.append(prefetcher.state_dict())
        lengths.append(prefetcher.batches_left())
    last = len(reference[0])
    assert played == reference[0] and lengths == list(range(last - 1, -1, -1))
    assert [(s["epoch"], s["batches"]) for s in states] == [(0, n) for n in range(1, last + 1)]
    resumed = loader_of(shards, workers)
    resumed.load_state_dict(states[-1])
    epochs = []
    for epoch in range(0, 2):  # the script's own epoch counter, saved with the state: epoch 0 was under way
        resumed.set_epoch(epoch)
        epochs.append(ids(DevicePrefetcher(resumed)))
    assert epochs == [[], reference[1]]
    assert loader.epoch == 1 and ids(DevicePrefetcher(loader)) == reference[1]


def test_a_prefetched_loop_with_no_batch_left_ends_its_epoch(shards: Path, reference) -> None:
    """A prefetcher that asked for nothing when no batch was left never let the loader's loop run
    out: the epoch never ended, and `while loader.epoch < E` ran for ever."""
    loader = loader_of(shards, 0)
    prefetcher = DevicePrefetcher(loader)
    for _ in prefetcher:
        state = prefetcher.state_dict()  # the last one: at epoch 0's end
    resumed = loader_of(shards, 0)
    resumed.load_state_dict(state)
    assert ids(DevicePrefetcher(resumed)) == [] and resumed.epoch == 1
    assert ids(DevicePrefetcher(resumed)) == reference[1] and resumed.epoch == 2
    empty = make_loader(shards, num_workers=0, batch_size=5000, drop_last=True)  # no batch in an epoch
    with pytest.warns(UserWarning, match="no epoch has a batch"):
        assert ids(DevicePrefetcher(empty)) == [] and empty.epoch == 1


@pytest.mark.parametrize("loop", ["zip", "islice", "prefetched zip"])
def test_a_checkpoint_at_an_epochs_end_loaded_moves_on_under_loops_that_ask_for_no_batch(shards: Path, reference,
                                                                                        loop: str) -> None:
    """With len() 0, ``zip(range(len(loader)), loader)`` never starts the loader's loop: after a
    checkpoint taken in an epoch's last step was loaded, every later epoch had 0 batches, the
    loader stood at epoch 0 for ever, and a resumed job ran empty epochs without a word."""
    loader = loader_of(shards, 0)
    for _ in loader:
        state = loader.state_dict()  # in the last step of epoch 0
    resumed = loader_of(shards, 0)
    resumed.load_state_dict(state)
    over = DevicePrefetcher(resumed) if loop == "prefetched zip" else resumed
    epochs = [ids(islice(over, len(over)) if loop == "islice" else (b for _, b in zip(range(len(over)), over)))
              for _ in range(3)]
    assert epochs[:2] == [[], reference[1]] and resumed.epoch == 3 and len(epochs[2]) == len(reference[1])


def test_a_prefetcher_of_something_that_is_no_loader_is_refused(shards: Path) -> None:
    """A path was taken, and its characters iterated as batches."""
    for given, shown in ((str(shards), f"str {str(shards)!r}"), (5, "int 5")):
        with pytest.raises(TypeError, match=re.escape(f"DevicePrefetcher wraps a loader, DevicePrefetcher(make_loader("
                                                      f"...)); got {shown}")):
            DevicePrefetcher(given)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_whose_step_failed_is_delivered_and_given_back_trains_again(shards: Path, reference,
                                                                            workers: int) -> None:
    """As the README says: the batch handed to a step that raised counts as delivered, and
    give_back(1) before the next loop replays it (a notebook's cell fixed and run again)."""
    loader = loader_of(shards, workers)
    trained = []
    with pytest.raises(ZeroDivisionError):
        for step, batch in enumerate(loader):
            if step == 3:
                raise ZeroDivisionError  # (the step's bug)
            trained.append(batch["i"].tolist())
    skipped = trained + ids(loader)
    assert skipped == reference[0][:3] + reference[0][4:]
    loader.set_epoch(0)
    trained = []
    with pytest.raises(ZeroDivisionError):
        for step, batch in enumerate(loader):
            if step == 3:
                raise ZeroDivisionError
            trained.append(batch["i"].tolist())
    loader.give_back(1)
    assert trained + ids(loader) == reference[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_prefetchers_kept_iterator_dropped_after_a_later_loop_costs_no_batch(shards: Path, workers: int,
                                                                             reference) -> None:
    """An iterator kept from a look at a batch held the next one, fetched ahead; dropped after
    training went on in a for loop, it gave that batch back into the for loop's position: a batch
    trained twice, another never, and a checkpoint one batch behind."""
    loader = loader_of(shards, workers)
    prefetcher = DevicePrefetcher(loader)
    kept = iter(prefetcher)
    seen = ids([next(kept)])
    seen += first(4, prefetcher)  # the batch the kept iterator held comes first
    del kept
    assert loader.state_dict()["batches"] == prefetcher.state_dict()["batches"] == len(seen)
    seen += ids(prefetcher)
    assert seen == reference[0]


def test_a_prefetchers_loop_stepped_after_a_later_one_took_over_is_refused(shards: Path, reference) -> None:
    prefetcher = DevicePrefetcher(loader_of(shards, 0))
    kept = iter(prefetcher)
    seen = ids([next(kept)])
    later = iter(prefetcher)
    seen += ids([next(later)])
    with pytest.raises(RuntimeError, match=r"this prefetcher was iterated again while this loop over it ran"):
        next(kept)
    seen += ids(later)
    assert seen == reference[0]


def test_a_loader_peeked_at_in_a_prefetched_loop_delivers_no_batch_twice(shards: Path, reference) -> None:
    """The prefetcher's loop, refused after the peek, gave back its batch fetched ahead into
    the peek's position: the peeked batch came again."""
    loader = loader_of(shards, 2)
    seen = []
    with pytest.raises(RuntimeError, match=r"this loader was iterated again while this loop over it ran"):
        for batch in DevicePrefetcher(loader):
            seen.append(batch["i"].tolist())
            if len(seen) == 3:
                seen.append(next(iter(loader))["i"].tolist())
    seen += ids(loader)
    delivered = sum(seen, [])
    assert len(set(delivered)) == len(delivered) and loader.state_dict()["batches"] == 0  # (the epoch ended)
    assert len(seen) == len(reference[0]) - 1  # the batch the refused loop held is the one not trained

