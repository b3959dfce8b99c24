"""Real torchrun, several processes with gloo on CPU: exact epochs across ranks, and training."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

import pipeline
from tests.helpers import child_pids, command_line
from tests.stream.shardsets import random_sizes, uneven_shards
from tests.write.test_indexing import webdataset_shards

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def torchrun(nproc: int, *args: str, timeout: int = 180, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``args`` under a real torchrun. Past ``timeout``, every process of the job is asked for
    its threads' stacks (SIGUSR1: scripts/train.py prints them), then killed, and the test fails
    with what they printed; an interrupted test kills the job too. None is ever left behind."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
               "--nproc-per-node", str(nproc), *args]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                           start_new_session=True)
    try:
        stdout, stderr = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_job(job.pid, ask_for_stacks=True)
        stdout, stderr = job.communicate(timeout=30)
        pytest.fail(f"torchrun {' '.join(args)} ran past {timeout} s; the job's stacks:\n{stderr[-100_000:]}")
    except BaseException:  # Ctrl-C, or the test's own time limit: the job is in sessions no signal of ours reaches
        stop_job(job.pid, ask_for_stacks=False)
        raise
    result = subprocess.CompletedProcess(command, job.returncode, stdout, stderr)
    assert result.returncode == 0 or not check, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def stop_job(pid: int, ask_for_stacks: bool) -> None:
    """Kill torchrun ``pid`` and every process of its job. torchrun starts each rank in a session
    of its own, so the sessions are collected, and every process in one of them is killed (one
    a rank started meanwhile too). torchrun is stopped first: a rank it started after the
    sessions were collected would be in none of them."""
    if ask_for_stacks:  # one process at a time: dumps written at once into the one stderr interleave
        for process in descendants(pid):
            signal_all([process], signal.SIGUSR1)
            time.sleep(0.3)
        time.sleep(1)
    signal_all([pid], signal.SIGSTOP)
    found = descendants(pid)  # (a rank's session is torchrun's until it calls setsid, then its own pid)
    sessions = {pid, *found, *map(session_of, found)} - {None, session_of(os.getpid())}
    for _ in range(50):  # until none is left, or 5 s
        members = [p for p in map(int, filter(str.isdigit, os.listdir("/proc"))) if session_of(p) in sessions]
        if not members:
            return
        signal_all(members, signal.SIGKILL)
        time.sleep(0.1)


def session_of(pid: int) -> int | None:
    """The session of a live process (``None`` for one that has ended, or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] == "Z" else int(fields[3])


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    found = []
    for child in child_pids(pid):
        found += [child, *descendants(child)]
    return found


def assert_exactly_once_with_equal_batches(shards: str, tmp_path: Path, ranks: int, total: int, field: str = "i") -> None:
    out = tmp_path / "out"
    out.mkdir()
    torchrun(ranks, str(HERE / "ddp_collect.py"), shards, str(out), "2", field)
    results = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]
    counts = {len(r["batches"]) for r in results}
    assert len(counts) == 1 and counts == {results[0]["len"]}
    seen = Counter(i for r in results for batch in r["batches"] for i in batch)
    assert set(seen) == set(range(total))  # every sample delivered
    padded = -(-total // ranks) * ranks
    assert sum(seen.values()) == padded  # and only the padding to equal rank spans repeats
    assert sum(n - 1 for n in seen.values()) == padded - total


@pytest.mark.parametrize("ranks, sizes", [
    (2, random_sizes(5, 100, 900, seed=1)),
    (3, random_sizes(4, 50, 700, seed=2)),
    (3, [400, 7]),  # fewer shards than the 6 consumers
])
def test_every_sample_once_and_equal_batch_counts_across_ranks(tmp_path: Path, ranks: int, sizes: list[int]) -> None:
    shards = uneven_shards(tmp_path / "shards", sizes, pack=4)
    assert_exactly_once_with_equal_batches(str(shards), tmp_path, ranks, sum(sizes))


@pytest.mark.parametrize("ranks", [2, 3])
def test_webdataset_shards_indexed_in_place_are_exact_across_ranks(tmp_path: Path, ranks: int) -> None:
    urls = webdataset_shards(tmp_path / "wds", random_sizes(5, 40, 400, seed=ranks))
    total = pipeline.index_shards(urls, quiet=True).samples
    assert_exactly_once_with_equal_batches(str(tmp_path / "wds"), tmp_path, ranks, total, field="cls")


def test_shards_without_an_index_under_torchrun_are_an_error_not_a_hang(tmp_path: Path) -> None:
    urls = webdataset_shards(tmp_path / "wds", [300, 20, 150])
    (tmp_path / "out").mkdir()
    result = torchrun(2, str(HERE / "ddp_collect.py"), "{" + ",".join(urls) + "}", str(tmp_path / "out"), "2", "cls",
                      check=False, timeout=120)
    assert result.returncode != 0
    assert "shards without an index, under DDP (world size 2)" in result.stderr and "pipeline index" in result.stderr


@pytest.mark.parametrize("mistake", ["seed-per-rank", "batch-per-rank", "weights-per-rank"])
def test_ranks_seeded_or_batched_apart_are_an_error_not_a_silent_loss(tmp_path: Path, mistake: str) -> None:
    """Ranks batched apart yield other numbers of batches: the job died in gloo ('Connection closed
    by peer'), naming nothing. Ranks that mixed in shares of their own were not compared at all:
    the samples of one source twice in an epoch, or a hang."""
    shards = uneven_shards(tmp_path / "shards", [300, 200], pack=4)
    (tmp_path / "out").mkdir()
    result = torchrun(2, str(HERE / "ddp_collect.py"), str(shards), str(tmp_path / "out"), "0", "i", mistake,
                      check=False, timeout=120)
    assert result.returncode != 0 and not list((tmp_path / "out").iterdir())
    if mistake == "seed-per-rank":
        assert re.search(r"rank ([01]) shuffles these shards with seed=([56]), rank ([01]) with seed=([56]): every "
                         r"rank must draw the same epoch order", result.stderr), result.stderr[-3000:]
        assert "seed=base, not base + rank" in result.stderr
    elif mistake == "weights-per-rank":
        assert re.search(r"rank ([01]) reads these shards with mix=\{'a': \d+, 'b': \d+\}, rank ([01]) with mix=", 
                         result.stderr), result.stderr[-3000:]
        assert "(mix: the samples each source gives an epoch, from weights= and epoch_samples=)" in result.stderr
    else:
        assert re.search(r"rank ([01]) reads these shards with batch_size=(32|48), rank ([01]) with batch_size=(32|48): "
                         r"every rank must read them alike, or ranks yield other numbers of batches \(a DDP job then "
                         r"stops in its collective calls\) or overlapping samples. Pass the same settings on every "
                         r"rank", result.stderr), result.stderr[-3000:]


def test_a_loader_one_rank_makes_alone_is_compared_with_none_of_the_others(tmp_path: Path) -> None:
    """Rank 0 looked at a batch of a loader of its own first: the training loaders, alike on every
    rank, were paired with it (the n-th dataset of a rank with the n-th of another), and the job
    stopped on 'rank 1 reads these shards with batch_size=32, rank 0 with batch_size=4'."""
    shards = uneven_shards(tmp_path / "shards", [300, 200], pack=4)
    (tmp_path / "out").mkdir()
    torchrun(2, str(HERE / "ddp_collect.py"), str(shards), str(tmp_path / "out"), "0", "i", "peek-on-rank-0")
    got = [n for rank in range(2) for batch in json.loads((tmp_path / "out" / f"rank-{rank}.json").read_text())["batches"]
           for n in batch]
    assert sorted(got) == list(range(500))


def test_training_example_under_torchrun_on_uneven_data(tmp_path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    centres = rng.normal(0, 2, (4, 8)).astype(np.float32)
    for split, n in (("train", 3001), ("validation", 499)):
        y = rng.integers(0, 4, n)
        x = centres[y] + rng.normal(0, 1, (n, 8)).astype(np.float32)
        pipeline.write_shards(tmp_path / "data" / split, {"x": x, "y": y}, prefix=split, pack=16,
                              shard_samples=977, quiet=True)
    def train(*options: str) -> dict:
        result_file = tmp_path / "result.json"
        result_file.unlink(missing_ok=True)
        torchrun(2, str(ROOT / "scripts" / "train.py"), "--data", str(tmp_path / "data"), "--epochs", "2",
                 "--workers", "2", "--batch-size", "64", "--quiet", "--result", str(result_file), *options)
        return json.loads(result_file.read_text()) if result_file.exists() else {}

    result = train()
    assert result["epoch"] == 1 and result["val_samples"] == 499 and result["train_samples"] == 3002  # 1 padded
    assert result["val_accuracy"] > 0.8
    # stopped in the last epoch (24 batches a rank an epoch), resumed: the epoch's loss is every rank's, all of it
    assert train("--checkpoint", str(tmp_path / "ckpt.pt"), "--stop-after", "30") == {}
    resumed = train("--checkpoint", str(tmp_path / "ckpt.pt"), "--resume")
    assert resumed["train_samples"] == 3002 and resumed["val_accuracy"] == result["val_accuracy"]
    assert resumed["train_loss"] == pytest.approx(result["train_loss"], rel=1e-6)


def test_a_job_past_its_time_fails_with_its_stacks_and_leaves_no_process() -> None:
    before = set(child_pids(os.getpid()))
    marker = f"run-{uuid.uuid4().hex}"  # (another job's stuck ranks are none of this test's business)
    with pytest.raises(pytest.fail.Exception, match=r"(?s)ran past 15 s; the job's stacks:.*in wait_for_ever"):
        torchrun(2, str(HERE / "stuck_rank.py"), marker, timeout=15)
    assert set(child_pids(os.getpid())) == before
    assert not ranks_running(marker)


def test_an_interrupted_test_leaves_no_process_of_its_job() -> None:
    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(8)
    marker = f"run-{uuid.uuid4().hex}"
    try:
        with pytest.raises(KeyboardInterrupt):
            torchrun(2, str(HERE / "stuck_rank.py"), marker, timeout=120)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert not ranks_running(marker)


def ranks_running(marker: str) -> list[int]:
    """The processes on this machine whose command line holds ``marker``."""
    return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if marker in command_line(pid)]
