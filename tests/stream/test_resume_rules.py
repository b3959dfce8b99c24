"""load_state_dict: the seed and shuffle cannot change even at an epoch boundary (README: 'At an
epoch boundary all of them but the seed and `shuffle` may change'), shuffle not mid-epoch either,
and a checkpoint taken right after an elastic resume resumes the very batches the first one did."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline import make_loader
from tests.stream.shardsets import uneven_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return uneven_shards(tmp_path_factory.mktemp("rules"), [300, 200, 140])


def loader_of(shards: Path, **options):
    options = {"seed": 1, "shuffle_buffer": 128, **options}
    return make_loader(shards, num_workers=0, batch_size=32, **options)


def ids(loader) -> list[list[int]]:
    return [batch["i"].tolist() for batch in loader]


@pytest.mark.parametrize("change, words", [({"seed": 2}, "seed=1, this loader has seed=2"),
                                           ({"shuffle": False}, "shuffle=True, this loader has shuffle=False")])
def test_the_seed_and_shuffle_cannot_change_at_an_epoch_boundary(shards: Path, change: dict, words: str) -> None:
    loader = loader_of(shards)
    ids(loader)  # epoch 0 to its end: the state stands at epoch 1's start
    boundary = loader.state_dict()
    assert (boundary["epoch"], boundary["batches"], boundary["legs"]) == (1, 0, [])
    other = loader_of(shards, **change)
    with pytest.raises(ValueError, match=re.escape(f"cannot resume: the checkpoint was taken with {words}")):
        other.load_state_dict(boundary)
    allowed = make_loader(shards, num_workers=0, batch_size=16, seed=1, shuffle_buffer=128)
    allowed.load_state_dict(boundary)  # (the batch size may change there: the check is not a blanket refusal)
    assert allowed.epoch == 1


def test_shuffle_cannot_change_mid_epoch(shards: Path) -> None:
    loader = loader_of(shards)
    for n, _ in enumerate(loader, start=1):
        if n == 5:
            break
    with pytest.raises(ValueError, match=re.escape("the checkpoint was taken with shuffle=True, this loader has "
                                                   "shuffle=False")):
        loader_of(shards, shuffle=False).load_state_dict(loader.state_dict())


def test_a_checkpoint_taken_right_after_an_elastic_resume_goes_on_as_the_first_one(shards: Path) -> None:
    """2 ranks deliver 3 batches each; the job resumes on 3 ranks and checkpoints before any
    batch (a save at the start of the resumed run), then resumes on 1 rank: that rank must get
    the very batches a resume of the first checkpoint on 1 rank gets (no empty leg of 3 ranks,
    whose padding would repeat samples, whose 'drop' would lose some)."""
    for remainder in ("pad", "drop", "keep"):
        first = loader_of(shards, rank=0, world_size=2, remainder=remainder)
        for n, _ in enumerate(first, start=1):
            if n == 3:
                break
        state = first.state_dict()
        on_three = loader_of(shards, rank=0, world_size=3, remainder=remainder)
        on_three.load_state_dict(state)
        again = on_three.state_dict()
        assert again["legs"] == [[2, 3]] and again["batches"] == 0 and again["world_size"] == 3
        direct, via_three = (loader_of(shards, remainder=remainder) for _ in range(2))
        direct.load_state_dict(state)
        via_three.load_state_dict(again)
        assert ids(via_three) == ids(direct), remainder
