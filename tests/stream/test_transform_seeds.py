"""A transform's random draws (``random``, ``np.random``, torch): seeded for each batch, so that
augmentations are reproducible on any number of workers and after a resume, differ between
ranks and epochs, and leave the training process's own generators as they were."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline import make_loader
from tests.stream.shardsets import random_sizes, uneven_shards
from tests.stream.test_foreign_breaks import shard

pytestmark = pytest.mark.filterwarnings("ignore:.*suggested max number of worker")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return uneven_shards(tmp_path_factory.mktemp("augmented"), random_sizes(6, 150, 400, seed=4), pack=4)


def draw_per_sample(sample: dict) -> dict:
    return {"i": sample["i"], "numpy": np.random.randint(1 << 30), "random": random.getrandbits(30),
            "torch": int(torch.randint(1 << 30, ()))}


def draw_per_batch(batch: dict) -> dict:
    return {**batch, "batch": torch.full((len(batch["i"]),), int(np.random.randint(1 << 30)))}


def rows(batches) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in values)
            for batch in batches for values in zip(batch["i"], batch["numpy"], batch["random"], batch["torch"],
                                                   batch["batch"])]


def loader(shards: Path, workers: int, **options):
    torch.manual_seed(0)  # as a training script seeds every process: the workers' seeds come from it
    return make_loader(shards, num_workers=workers, batch_size=64, seed=3, sample_transform=draw_per_sample,
                       batch_transform=draw_per_batch, **options)


def test_the_same_batches_get_the_same_draws_on_any_number_of_workers(shards: Path) -> None:
    """Draws came from generators the workers were seeded with: other noise on another
    num_workers, and NumPy's generator was seeded with torch's seed (the same Mersenne
    Twister): a torch coin and a NumPy coin fell alike every time."""
    expected = rows(loader(shards, 0))
    assert rows(loader(shards, 2)) == expected
    assert rows(loader(shards, 3, multiprocessing_context="spawn")) == expected
    for column in (1, 2, 3):  # a draw per sample from each library, each its own
        assert len({row[column] for row in expected}) > 0.99 * len(expected)
    assert sum(row[1] == row[3] for row in expected) == 0 and sum(row[1] == row[2] for row in expected) == 0
    assert len({row[4] for row in expected}) == -(-len(expected) // 64)  # a draw per batch, each its own


def test_a_resumed_epoch_draws_what_the_uninterrupted_one_drew_not_its_first_batches_again(shards: Path) -> None:
    """The resumed run's new workers were seeded as the first run's: the rest of the epoch got
    the draws of its first batches again."""
    whole = rows(loader(shards, 2))
    first = loader(shards, 2)
    batches = iter(first)
    head = rows([next(batches) for _ in range(4)])
    state = first.state_dict()
    del batches
    resumed = loader(shards, 3)
    resumed.load_state_dict(state)
    assert head + rows(resumed) == whole


def test_ranks_and_epochs_draw_apart(shards: Path) -> None:
    """Every rank seeded torch alike, so every rank drew alike."""
    ranks = [rows(loader(shards, 2, rank=rank, world_size=2)) for rank in (0, 1)]
    assert not {row[1:] for row in ranks[0]} & {row[1:] for row in ranks[1]}
    epochs = loader(shards, 2)
    first, second = rows(epochs), rows(epochs)
    assert not {row[1:] for row in first} & {row[1:] for row in second}


def test_the_training_processs_generators_are_left_as_they_were(shards: Path) -> None:
    """Without workers the transforms run in the training process: its generators (dropout's)
    go on as if they had drawn nothing."""
    def after(transformed: bool) -> tuple:
        torch.manual_seed(1), np.random.seed(1), random.seed(1)
        options = dict(sample_transform=draw_per_sample, batch_transform=draw_per_batch) if transformed else {}
        for _ in make_loader(shards, num_workers=0, batch_size=64, **options):
            pass
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random()

    assert after(True) == after(False)


def draw_from_torch(sample: dict) -> dict:
    return {"cls": sample["cls"], "torch": int(torch.randint(1 << 30, ()))}


def test_workers_and_ranks_over_shards_without_an_index_draw_apart(tmp_path: Path) -> None:
    """A row's place there holds its consumer's number above bit 40, and torch seeds its
    generator with a seed's low 32 bits: every worker and rank drew what the first did."""
    for n in range(4):
        shard(tmp_path / f"s-{n}.tar", 40)
    source = str(tmp_path / "s-{0..3}.tar")
    options = dict(batch_size=8, seed=0, fields=["cls"], sample_transform=draw_from_torch)
    workers = [b["torch"].tolist() for b in make_loader(source, num_workers=2, **options)]
    assert len({tuple(draws) for draws in workers}) == len(workers) == 20
    ranks = [[b["torch"].tolist() for b in make_loader(source, num_workers=0, rank=rank, world_size=2,
                                                       allow_uneven=True, **options)] for rank in (0, 1)]
    assert not {tuple(draws) for draws in ranks[0]} & {tuple(draws) for draws in ranks[1]}
