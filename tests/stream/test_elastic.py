"""Elastic jobs with real processes: a checkpoint taken mid-epoch on W ranks continues on W' ranks
(real torchrun, or processes given RANK and WORLD_SIZE), and the two runs together deliver the
epoch's planned samples exactly once (plus the padding of each run to equal ranks), every rank of
a run the same number of batches; mixes and single shard sets alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from pipeline import make_loader
from tests.stream.mixes import WEIGHTS, mix_folder
from tests.stream.shardsets import random_sizes, uneven_shards
from tests.stream.test_distributed import torchrun

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCRIPT = str(HERE / "elastic_run.py")


@pytest.fixture(scope="module")
def mix(tmp_path_factory) -> str:
    return json.dumps(mix_folder(tmp_path_factory.mktemp("mix")))


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> str:
    return str(uneven_shards(tmp_path_factory.mktemp("uneven"), random_sizes(6, 300, 3000, seed=8), pack=4))


def planned_epoch(sources: str, world: int) -> Counter:
    """The samples of epoch 0 begun on ``world`` ranks (its chunks are cut for them, which decides
    the samples of a mix's subsampled source), from uninterrupted ranks with the settings of
    elastic_run.py, but for the padding (``remainder="keep"``: the same samples, none repeated)."""
    mix = json.loads(sources) if sources.startswith("{") else None
    options = {"weights": {n: WEIGHTS[n] for n in mix}} if mix else {}
    loaders = [make_loader(mix or sources, num_workers=0, batch_size=64, seed=11, shuffle_buffer=1000,
                           rank=rank, world_size=world, remainder="keep", **options) for rank in range(world)]
    return Counter(i for loader in loaders for batch in loader for i in batch["i"].tolist())


def simulated(ranks: int, *args: str) -> None:
    """``ranks`` processes of elastic_run.py at once, each told its RANK and WORLD_SIZE."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WORLD_SIZE": str(ranks)}
    processes = [subprocess.Popen([sys.executable, SCRIPT, *args], env=env | {"RANK": str(r)}, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(ranks)]
    for process in processes:
        _, err = process.communicate(timeout=180)
        assert process.returncode == 0, err[-3000:]


def run(launch: str, ranks: int, sources: str, out: Path, workers: int, stop: int, *state: str) -> list[dict]:
    """One run of ``ranks`` ranks; the batches each received, with its len() at the start."""
    out.mkdir()
    args = (sources, str(out), str(workers), str(stop), *state)
    torchrun(ranks, SCRIPT, *args) if launch == "torchrun" else simulated(ranks, *args)
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]


def delivered(results: list[dict]) -> Counter:
    return Counter(i for result in results for batch in result["batches"] for i in batch)


def assert_equal_batches(results: list[dict], expected: int) -> None:
    assert [len(r["batches"]) for r in results] == [expected] * len(results)


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_mix_under_torchrun_is_exact_with_equal_batches(mix: str, tmp_path: Path, ranks: int) -> None:
    results = run("torchrun", ranks, mix, tmp_path / "run", 2, 0)
    assert_equal_batches(results, results[0]["len"])
    planned, got = planned_epoch(mix, ranks), delivered(results)
    assert not planned - got and sum((got - planned).values()) < ranks  # once each, and the padding


@pytest.mark.parametrize("launch, sources, old, new, workers, stop", [
    ("torchrun", "mix", 3, 2, 2, 97),
    ("simulated", "single", 2, 3, 2, 41),
    ("simulated", "single", 4, 1, 1, 13),
    ("simulated", "mix", 1, 4, 1, 250),
])
def test_a_checkpoint_on_w_ranks_continues_on_other_ranks_exactly_once(
        request, tmp_path: Path, launch: str, sources: str, old: int, new: int, workers: int, stop: int) -> None:
    shards = request.getfixturevalue(sources)
    first = run(launch, old, shards, tmp_path / "first", workers, stop)
    assert_equal_batches(first, stop)
    second = run(launch, new, shards, tmp_path / "second", workers, 0, str(tmp_path / "first" / "state.pt"))
    assert second[0]["len"] > 0
    assert_equal_batches(second, second[0]["len"])
    planned, got = planned_epoch(shards, old), delivered(first) + delivered(second)
    assert not planned - got  # every planned sample delivered ...
    assert sum((got - planned).values()) < old + new - 1  # ... once, but for each run's padding to equal ranks
    state = torch.load(tmp_path / "second" / "state.pt", weights_only=True)
    assert state["epoch"] == 1 and state["batches"] == 0 and state["legs"] == []  # then normal epochs
