"""A DataLoader worker killed with SIGKILL mid-epoch: a clear error within seconds, the other
workers stopped, and an exact resume from the state saved before the kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from pipeline import WorkerError, make_loader
from pipeline.stream.loader import ShardLoader
from tests.helpers import child_pids
from tests.stream.shardsets import random_sizes, uneven_shards

warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """6 shards (about 4,000 samples), packed 8 to a record."""
    return uneven_shards(tmp_path_factory.mktemp("killed"), random_sizes(6, 400, 1000, seed=5), pack=8)


def new_loader(shards: Path) -> ShardLoader:
    # one batch per worker message keeps a worker's output small next to the epoch
    return make_loader(shards, num_workers=2, batch_size=32, seed=7, shuffle_buffer=300)


def started_since(before: set[int]) -> list[int]:
    """Children of this process started since ``before`` was taken: the loader's workers, not
    the servers other tests started."""
    return [pid for pid in child_pids(os.getpid()) if pid not in before]


def ids(batches) -> list[list[int]]:
    return [batch["i"].tolist() for batch in batches]


def kill_one_worker_while_waiting(workers: list[int]) -> None:
    """SIGKILL the first worker while the main thread waits for data: the others are paused
    first (so the main thread drains what they sent and waits), then resumed as the first dies.
    PyTorch's SIGCHLD handler raises in whatever code the main thread runs; waiting for data,
    that is the loader."""
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)

    def kill() -> None:
        os.kill(workers[0], signal.SIGKILL)
        for pid in workers[1:]:
            os.kill(pid, signal.SIGCONT)

    threading.Timer(0.5, kill).start()


def test_a_killed_worker_is_a_clear_error_and_the_saved_state_resumes_exactly(shards: Path) -> None:
    reference = ids(new_loader(shards))
    before = set(child_pids(os.getpid()))
    loader = new_loader(shards)
    iterator = iter(loader)
    head = ids(next(iterator) for _ in range(20))
    checkpoint = loader.state_dict()
    head += ids(next(iterator) for _ in range(5))  # delivered after the checkpoint: trained on, then lost
    workers = started_since(before)
    assert len(workers) == 2
    kill_one_worker_while_waiting(workers)
    started = time.monotonic()
    # PyTorch's SIGCHLD handler says "is killed by signal", its queue watch "exited unexpectedly"
    with pytest.raises(WorkerError, match=rf"DataLoader worker \(pid(\(s\))? {workers[0]}\) (is killed by signal: "
                                          r"Killed|exited unexpectedly).* Epoch 0 stopped after batch \d+; "
                                          r"state_dict\(\) .* resumes the epoch exactly"):
        for batch in iterator:
            head.append(batch["i"].tolist())
    assert time.monotonic() - started < 5
    assert started_since(before) == []  # the other worker is stopped too
    assert head == reference[:len(head)]
    after_error = loader.state_dict()

    resumed = new_loader(shards)
    resumed.load_state_dict(checkpoint)
    assert ids(resumed) == reference[20:]
    assert ids(loader) == reference[len(head):]  # the same loader goes on with new workers
    resumed = new_loader(shards)
    resumed.load_state_dict(after_error)
    assert ids(resumed) == reference[len(head):]


def test_a_worker_killed_while_the_training_loop_runs_fails_the_next_batch_or_step(shards: Path) -> None:
    reference = ids(new_loader(shards))
    before = set(child_pids(os.getpid()))
    loader = new_loader(shards)
    delivered = []
    started = None
    with pytest.raises(WorkerError, match=r"DataLoader worker \(pid(\(s\))? \d+\)") as error:
        for batch in loader:
            delivered.append(batch["i"].tolist())
            if len(delivered) == 10:
                started = time.monotonic()
                os.kill(started_since(before)[0], signal.SIGKILL)
            time.sleep(0.01)  # a training step: where the error often surfaces
    assert started is not None and time.monotonic() - started < 5, error.value
    assert started_since(before) == []  # the other worker is stopped too
    done = loader.state_dict()["batches"]
    assert done - len(delivered) in (0, 1)  # the error may come between a batch and its step
    assert delivered == reference[:len(delivered)]
    assert ids(loader) == reference[done:]  # new workers replace the broken ones


def test_a_loop_that_breaks_and_iterates_again_continues_the_epoch(shards: Path) -> None:
    reference = ids(new_loader(shards))
    loader = new_loader(shards)
    head = []
    for batch in loader:
        head.append(batch["i"].tolist())
        if len(head) == 10:
            break
    assert head + ids(loader) == reference


def test_the_kill_benchmark_runs_and_finds_a_worker_error_every_time() -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_killed_worker.py"
    result = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("4/4 runs: a WorkerError within 5 s, the other worker stopped, an exact resume")
