"""A job stopped or preempted by its scheduler: the signal sent to the whole process group is
the training process's to handle (save a checkpoint, exit), and a worker that dies while the
training process does something else is reported by the loader, not raised in that code."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from pipeline import WorkerError, make_loader
from tests.helpers import child_pids, run_script, start_script, still_children, worker_pids
from tests.stream.shardsets import random_sizes, uneven_shards

pytestmark = pytest.mark.filterwarnings("ignore:.*suggested max number of worker")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return uneven_shards(tmp_path_factory.mktemp("preempted"), random_sizes(6, 300, 700, seed=8), pack=8)


def new_loader(shards: Path, **options):
    return make_loader(shards, num_workers=2, batch_size=32, seed=7, shuffle_buffer=300, **options)


def ids(batches) -> list[list[int]]:
    return [batch["i"].tolist() for batch in batches]


PREEMPTED = """
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
import torch
from tests.stream.test_job_signals import new_loader
stop = False
def on_term(signum, frame):  # the usual handler: a flag, the checkpoint saved after the step
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGUSR1, on_term)  # Slurm's --signal=USR1 warns ahead of the time limit
if __name__ == "__main__":
    loader = new_loader(Path(sys.argv[1]), multiprocessing_context=sys.argv[3])
    seen = []
    for batch in loader:
        seen.append(batch["i"].tolist())
        if len(seen) == 5:
            print("training", flush=True)
        time.sleep(0.02)  # the step
        if stop:
            torch.save({"loader": loader.state_dict(), "seen": seen}, sys.argv[2])
            sys.exit(0)
    sys.exit(3)  # the epoch ended first: the test sends its signal sooner than that
"""


@pytest.mark.parametrize("how, context", [(signal.SIGTERM, "fork"), (signal.SIGTERM, "spawn"), (signal.SIGUSR1, "spawn")])
def test_a_job_signalled_as_a_group_saves_its_checkpoint_and_resumes_exactly(shards: Path, tmp_path: Path,
                                                                             how: signal.Signals, context: str) -> None:
    """Slurm and torchrun signal the whole process group: the workers died of it, and the
    loader's error was raised in the training step (or in the checkpoint's torch.save) before
    the loop could save: exit status 1, no checkpoint."""
    reference = ids(new_loader(shards))
    checkpoint = tmp_path / "checkpoint.pt"
    job = start_script(tmp_path, PREEMPTED, shards, checkpoint, context)
    try:
        assert job.stdout.readline() == "training\n"
        workers = child_pids(job.pid)
        os.killpg(job.pid, how)
        _, err = job.communicate(timeout=60)
    finally:
        job.kill()
    # (SIGUSR1 also ends the resource tracker that spawn starts, Python's own, whose successor
    # then prints a KeyError for each name the first one held: not this library's words)
    assert (job.returncode, err.count("Error") if how == signal.SIGTERM else 0) == (0, 0), err
    assert still_children(workers) == []
    saved = torch.load(checkpoint)
    resumed = new_loader(shards)
    resumed.load_state_dict(saved["loader"])
    assert saved["seen"] + ids(resumed) == reference


def test_a_worker_that_dies_during_the_step_is_reported_by_the_loader_not_raised_in_the_step(shards: Path,
                                                                                                tmp_path: Path) -> None:
    """PyTorch's death signal raised the error in whatever ran: a step, or the torch.save of a
    checkpoint, left half written."""
    reference = ids(new_loader(shards))
    loader = new_loader(shards)
    loop = iter(loader)
    head = ids([next(loop) for _ in range(3)])
    workers = worker_pids(loader)
    os.kill(workers[0], signal.SIGKILL)
    ended = time.monotonic() + 1.0
    while time.monotonic() < ended:  # the step, and a checkpoint, as the death is signalled
        torch.save({"loader": loader.state_dict(), "weights": torch.zeros(1 << 18)}, tmp_path / "checkpoint.pt")
    saved = torch.load(tmp_path / "checkpoint.pt")
    with pytest.raises(WorkerError, match=rf"DataLoader worker \(pid(\(s\))? {workers[0]}\)"):
        for batch in loop:  # the batches already received come first
            head.append(batch["i"].tolist())
    assert still_children(workers) == []
    assert head == reference[:len(head)]
    resumed = new_loader(shards)
    resumed.load_state_dict(saved["loader"])
    assert reference[:3] + ids(resumed) == reference


def test_an_idle_persistent_worker_that_dies_is_replaced_by_the_next_epoch(shards: Path) -> None:
    """Between epochs nothing waits for the workers: the error was raised in whatever ran."""
    loader = new_loader(shards)
    first = ids(loader)
    workers = worker_pids(loader)
    os.kill(workers[0], signal.SIGKILL)
    time.sleep(0.5)  # the end of the epoch's work: a checkpoint, an evaluation
    second = ids(loader)
    assert sorted(sum(first, [])) == sorted(sum(second, [])) and first != second
    assert still_children(workers[:1]) == []


def _take_sigterm_again(worker_id: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_worker_killed_by_another_process_s_sigterm_is_not_said_to_have_run_out_of_memory(shards: Path) -> None:
    loader = new_loader(shards, worker_init_fn=_take_sigterm_again)
    loop = iter(loader)
    next(loop)
    workers = worker_pids(loader)
    subprocess.run(["kill", "-TERM", str(workers[0])], check=True)  # (not the parent: it would end quietly)
    with pytest.raises(WorkerError, match=r"Terminated.* Another process signalled it \(a job's stop or preemption, "
                                          r"a kill; workers let SIGTERM pass, and SIGUSR1 and SIGUSR2 where the "
                                          r"training process handles them, unless a worker_init_fn undoes that\)") \
            as error:
        for _ in loop:
            pass
    assert "memory" not in str(error.value)


STARTING = """
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
import torch
from tests.stream.test_job_signals import new_loader
stop = False
def on_term(signum, frame):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
if __name__ == "__main__":
    loader = new_loader(Path(sys.argv[1]), multiprocessing_context="spawn")
    print("starting", flush=True)
    for batch in loader:
        if stop:
            torch.save({"loader": loader.state_dict()}, sys.argv[2])
            sys.exit(0)
    sys.exit(3)
"""


def test_a_job_signalled_as_its_workers_start_saves_its_checkpoint(shards: Path, tmp_path: Path) -> None:
    """A worker took its handler in its worker_init_fn: one signalled before (a spawned worker
    imports torch and unpickles the dataset first, seconds) died of it."""
    job = start_script(tmp_path, STARTING, shards, tmp_path / "checkpoint.pt")
    try:
        assert job.stdout.readline() == "starting\n"
        while len(child_pids(job.pid)) < 2:  # the workers (and spawn's resource tracker) are starting
            time.sleep(0.005)
        os.killpg(job.pid, signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode == 0, err
    assert torch.load(tmp_path / "checkpoint.pt")["loader"]["batches"] == 1


def run_a_program(sample: dict) -> dict:
    program = subprocess.Popen(["sleep", "30"])
    program.terminate()
    sample["stopped"] = program.wait(timeout=10) == -signal.SIGTERM
    return sample


def test_a_program_a_transform_runs_in_a_worker_stops_when_told(shards: Path) -> None:
    """An ignored SIGTERM is ignored after exec too: a worker's own programs could not be stopped."""
    loader = new_loader(shards, sample_transform=run_a_program)
    assert next(iter(loader))["stopped"].all()


AFTER_FORKSERVER = """
import multiprocessing, os, sys, threading
from pathlib import Path
sys.path.insert(0, os.getcwd())
from tests.stream.test_job_signals import new_loader
if __name__ == "__main__":
    for batch in new_loader(Path(sys.argv[1]), multiprocessing_context="forkserver"):
        pass
    pool = multiprocessing.get_context("forkserver").Pool(2)
    print(pool.map(abs, [-1, -2]))
    closing = threading.Thread(target=pool.terminate, daemon=True)  # SIGTERM to each of its workers
    closing.start()
    closing.join(30)
    print("terminated" if not closing.is_alive() else "hung", flush=True)
    os._exit(0)
"""


def test_a_pool_of_the_forkserver_a_loader_started_can_still_be_terminated(shards: Path, tmp_path: Path) -> None:
    """The server, started while the loader held the job's signals blocked, kept the block for
    every process it forked later: a Pool's terminate() waited for ever."""
    status, out, err = run_script(tmp_path, AFTER_FORKSERVER, shards, timeout=120)
    assert (status, out) == (0, "[1, 2]\nterminated\n"), err
