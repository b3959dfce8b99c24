"""A DataLoader worker killed with SIGKILL mid-epoch: a clear error within seconds, the other
workers stopped, and an exact resume from the state saved before the kill."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import get_worker_info

import pipeline
from pipeline import WorkerError, make_loader
from pipeline.stream.loader import ShardLoader
from tests.helpers import child_pids, still_children, worker_pids
from tests.stream.shardsets import random_sizes, uneven_shards

warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """6 shards (about 4,000 samples), packed 8 to a record."""
    return uneven_shards(tmp_path_factory.mktemp("killed"), random_sizes(6, 400, 1000, seed=5), pack=8)


def new_loader(shards: Path) -> ShardLoader:
    # one batch per worker message keeps a worker's output small next to the epoch
    return make_loader(shards, num_workers=2, batch_size=32, seed=7, shuffle_buffer=300)


def ids(batches) -> list[list[int]]:
    return [batch["i"].tolist() for batch in batches]


def kill_one_worker_while_waiting(workers: list[int], how: signal.Signals = signal.SIGKILL) -> None:
    """SIGKILL the first worker while the main thread waits for data: the others are paused
    first (so the main thread drains what they sent and waits), then resumed as the first dies.
    PyTorch's SIGCHLD handler raises in whatever code the main thread runs; waiting for data,
    that is the loader."""
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)

    def kill() -> None:
        os.kill(workers[0], how)
        for pid in workers[1 if how == signal.SIGKILL else 0:]:  # a stopped process takes other signals once resumed
            os.kill(pid, signal.SIGCONT)

    threading.Timer(0.5, kill).start()


def test_a_killed_worker_is_a_clear_error_and_the_saved_state_resumes_exactly(shards: Path) -> None:
    reference = ids(new_loader(shards))
    loader = new_loader(shards)
    iterator = iter(loader)
    head = ids(next(iterator) for _ in range(20))
    checkpoint = loader.state_dict()
    head += ids(next(iterator) for _ in range(5))  # delivered after the checkpoint: trained on, then lost
    workers = worker_pids(loader)
    assert len(workers) == 2
    kill_one_worker_while_waiting(workers)
    started = time.monotonic()
    # PyTorch's SIGCHLD handler says "is killed by signal", its queue watch "exited unexpectedly"
    with pytest.raises(WorkerError, match=rf"DataLoader worker \(pid(\(s\))? {workers[0]}\) (is killed by signal: "
                                          rf"Killed|exited unexpectedly).* Epoch 0 of the loader over "
                                          rf"{re.escape(str(shards))} stopped after batch \d+; "
                                          r"state_dict\(\) .* resumes the epoch exactly"):
        for batch in iterator:
            head.append(batch["i"].tolist())
    assert time.monotonic() - started < 5
    assert still_children(workers) == []  # the other worker is stopped too, and both are reaped
    assert worker_pids(loader) == []
    assert head == reference[:len(head)]
    after_error = loader.state_dict()

    resumed = new_loader(shards)
    resumed.load_state_dict(checkpoint)
    assert ids(resumed) == reference[20:]
    assert ids(loader) == reference[len(head):]  # the same loader goes on with new workers
    resumed = new_loader(shards)
    resumed.load_state_dict(after_error)
    assert ids(resumed) == reference[len(head):]


def test_a_worker_dead_of_a_bus_error_is_told_of_shards_cut_short_under_it(shards: Path) -> None:
    """A local shard is read through a memory map: truncated or rewritten in place while a worker
    reads it, it kills the worker with SIGBUS, which PyTorch puts down to shared memory."""
    loader = new_loader(shards)
    iterator = iter(loader)
    next(iterator)
    kill_one_worker_while_waiting(worker_pids(loader), signal.SIGBUS)
    with pytest.raises(WorkerError, match=r"Bus error.* A bus error is memory gone from under a worker: a shard "
                                          r"truncated or rewritten in place while it was read \(local shards are "
                                          r"memory-mapped: replace one by renaming a new file over it\), or "
                                          r"/dev/shm full"):
        for _ in iterator:
            pass


def test_a_worker_killed_while_the_training_loop_runs_fails_the_next_batch(shards: Path) -> None:
    reference = ids(new_loader(shards))
    loader = new_loader(shards)
    delivered, workers = [], []
    started = None
    with pytest.raises(WorkerError, match=rf"DataLoader worker \(pid(\(s\))? \d+\).* Epoch 0 of the loader over "
                                          rf"{re.escape(str(shards))} stopped after batch \d+; ") as error:
        for batch in loader:
            delivered.append(batch["i"].tolist())
            if len(delivered) == 10:
                workers = worker_pids(loader)
                started = time.monotonic()
                os.kill(workers[0], signal.SIGKILL)
            time.sleep(0.01)  # a training step: where PyTorch raises the error as often as not
    assert started is not None and time.monotonic() - started < 5, error.value
    assert len(workers) == 2 and still_children(workers) == []  # the other worker is stopped too
    assert worker_pids(loader) == []  # and none started in their place before the next loop
    done = loader.state_dict()["batches"]
    assert done == len(delivered)  # raised by the loader: never between a batch and its step
    assert delivered == reference[:len(delivered)]
    assert ids(loader) == reference[done:]  # new workers replace the broken ones


def _train_until_a_worker_dies(shards: Path, step_s: float) -> weakref.ref:
    """A training loop in a function of its own (its frame goes when it returns, unless a cycle
    keeps it) whose worker is killed; a weak reference to its loader."""
    loader = new_loader(shards)
    try:
        for n, _ in enumerate(loader):
            if n == 10:
                os.kill(worker_pids(loader)[0], signal.SIGKILL)
            time.sleep(step_s)
    except WorkerError:
        pass
    return weakref.ref(loader)


def test_a_loader_whose_worker_died_is_freed_without_a_garbage_collection(shards: Path) -> None:
    """A death told while the loop runs (or while the loader waits for a batch) leaves no
    reference cycle through the error: one kept the loop's frame, its loader and the DataLoader
    iterator until a collection, which may run in a worker forked later, where the iterator's
    shutdown fails ('can only test a child process')."""
    gc.disable()
    try:
        for step_s in (0.01, 0.0):  # the death told in a step, or in the wait for a batch
            assert _train_until_a_worker_dies(shards, step_s)() is None
    finally:
        gc.enable()


class HangInFirstWorker:
    """A batch transform that hangs worker 0 at its ``at``-th batch, once it said so in ``marker``
    (the worker then has nothing in flight: all it sent can be received)."""

    def __init__(self, marker: Path, at: int) -> None:
        self.marker, self.at, self.calls = marker, at, 0

    def __call__(self, batch: dict) -> dict:
        info = get_worker_info()
        self.calls += 1
        if info is not None and info.id == 0 and self.calls == self.at:
            self.marker.write_text(str(os.getpid()))
            time.sleep(600)
        return batch


def test_a_death_the_signal_does_not_report_is_found_by_the_loader_within_a_second(shards: Path, tmp_path: Path) -> None:
    """The death signal may never raise in the loader: it lands on another thread of the process
    (the main thread's wait goes on), or its error is raised in code that drops errors (a step's
    ``except Exception``, a ``weakref.finalize`` callback). The loader's own watch of its workers
    must then find the death, and not in PyTorch's 5 s. Here the signal is ignored, and the
    worker is killed while the main thread waits for its next batch."""
    marker = tmp_path / "hanging"
    reference = ids(make_loader(shards, num_workers=2, batch_size=32, seed=7, shuffle_buffer=300,
                                batch_transform=HangInFirstWorker(marker, at=10**9)))
    loader = make_loader(shards, num_workers=2, batch_size=32, seed=7, shuffle_buffer=300,
                         batch_transform=HangInFirstWorker(marker, at=30))
    iterator = iter(loader)
    head = ids([next(iterator)])
    workers = worker_pids(loader)
    killed = []

    def kill_once_hanging() -> None:
        while not marker.exists():
            time.sleep(0.01)
        time.sleep(0.3)  # the main thread waits for the worker's batch by now
        killed.append(time.monotonic())
        os.kill(int(marker.read_text()), signal.SIGKILL)

    watched = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        threading.Thread(target=kill_once_hanging, daemon=True).start()
        with pytest.raises(WorkerError, match=r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"):
            for batch in iterator:
                head.append(batch["i"].tolist())
        # (PyTorch's own watch: about 5 s after the main thread began to wait, 0.3 s before the kill)
        assert time.monotonic() - killed[0] < 4
    finally:
        signal.signal(signal.SIGCHLD, watched)
    assert len(workers) == 2 and still_children(workers) == [] and worker_pids(loader) == []
    assert head == reference[:len(head)]


def test_a_death_signal_handled_in_a_finalizer_leaves_the_error_to_the_loader(shards: Path, monkeypatch) -> None:
    """The main process releases each worker buffer in a ``weakref.finalize`` callback; an error
    raised there is printed and dropped. The death is then left to the loader's watch."""
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    loader = new_loader(shards)
    iterator = iter(loader)
    head = ids(next(iterator) for _ in range(10))
    workers = worker_pids(loader)
    victim = workers[0]
    watched = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.kill(victim, signal.SIGKILL)
    os.waitid(os.P_PID, victim, os.WEXITED | os.WNOWAIT)
    signal.signal(signal.SIGCHLD, watched)
    held = torch.zeros(1)
    weakref.finalize(held, signal.raise_signal, signal.SIGCHLD)
    del held  # the handler runs in the finalizer: PyTorch's finds the death
    assert dropped == []
    with pytest.raises(WorkerError, match=rf"DataLoader worker \(pid(\(s\))? {victim}\)"):
        for batch in iterator:
            head.append(batch["i"].tolist())
    assert still_children(workers) == [] and worker_pids(loader) == []


class _HangInFork:
    """Makes this process's forks hang in their child before it runs a line of the worker, as
    Python 3.11.7 does when another thread makes its thread state as the process forks."""

    on = False
    registered = False

    @classmethod
    def hang(cls) -> None:
        while cls.on:  # (the child's copy stays on: it waits until it is stopped)
            time.sleep(0.05)


def test_a_worker_hung_in_its_fork_is_an_error_naming_it_not_a_wait_for_ever(shards: Path, monkeypatch) -> None:
    from pipeline.stream import workers as worker_module

    monkeypatch.setattr(worker_module, "START_S", 2.0)
    if not _HangInFork.registered:
        os.register_at_fork(after_in_child=_HangInFork.hang)
        _HangInFork.registered = True
    loader = new_loader(shards)
    before = set(child_pids(os.getpid()))
    started = time.monotonic()
    _HangInFork.on = True  # (the workers start at the first batch asked for)
    try:
        with pytest.raises(WorkerError, match=r"^DataLoader worker 0 \(pid \d+\) has not started 2 s after its fork: "
                                              r"it hangs in it\. Python 3\.\d+\.\d+: .*CPython gh-112275.* Epoch 0 "
                                              r"of the loader over .* stopped after batch 0; state_dict\(\) .* resumes"):
            next(iter(loader))
    finally:
        _HangInFork.on = False
    # (2 s, then each hung worker's stop: PyTorch waits 5 s for a worker to exit before it terminates it)
    assert 2 <= time.monotonic() - started < 30
    assert set(child_pids(os.getpid())) <= before  # the hung workers are stopped and reaped
    assert ids(loader) == ids(new_loader(shards))  # new workers play the whole epoch


def test_a_loop_that_breaks_and_iterates_again_continues_the_epoch(shards: Path) -> None:
    reference = ids(new_loader(shards))
    loader = new_loader(shards)
    head = []
    for batch in loader:
        head.append(batch["i"].tolist())
        if len(head) == 10:
            break
    assert head + ids(loader) == reference


@pytest.mark.parametrize("mode", [[], ["--text"]])  # --text: killed in the middle of a message, every other run
def test_the_kill_benchmark_runs_and_finds_a_worker_error_every_time(short_tmp: Path, mode: list[str]) -> None:
    """... and leaves nothing in the temporary folder: not the folders of the workers it kills (pymp-*)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_killed_worker.py"
    result = subprocess.run([sys.executable, str(script), "--quick", *mode], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "TMPDIR": str(short_tmp)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("4/4 runs: a WorkerError within 5 s, the other worker stopped, an exact resume")
    assert not list(short_tmp.iterdir())


def test_a_worker_that_fails_at_its_start_is_not_told_to_have_run_out_of_memory(shards: Path, tmp_path: Path) -> None:
    """A spawned worker that cannot unpickle a transform of python -c's __main__ exits with an
    error status: the error said a worker killed by the system has often run out of memory."""
    code = f"""
import pipeline
def double(sample):
    return sample
loader = pipeline.make_loader({str(shards)!r}, num_workers=1, batch_size=64, multiprocessing_context="spawn",
                              sample_transform=double)
try:
    next(iter(loader))
except pipeline.WorkerError as exc:
    print(exc)
"""
    told = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert re.search(r"exited unexpectedly.* Worker \d+ exited with status 1\. .*A worker that exits with an error "
                     r"status failed in its start or its own code: its traceback is on standard error\. A worker "
                     r"started with spawn or forkserver imports the script", told.stdout), told.stdout + told.stderr
    assert "run out of memory" not in told.stdout
    assert "Can't get attribute 'double'" in told.stderr


def test_timeout_is_a_batchs_though_a_worker_sends_a_units_batches_at_once(tmp_path: Path) -> None:
    """DataLoader's timeout waits for a message, here a unit's batches: a timeout that each batch
    met (a batch takes 0.2 s, the timeout 1 s) fired before the first one came (a unit of 10
    batches, 2 s). (The unit's timeout, 10 s, leaves the worker's start room on a busy machine:
    with 50 ms batches and a 2 s unit timeout, it timed out once under three test runs at once.)"""
    pipeline.write_shards(tmp_path / "set", {"i": np.arange(5120)}, quiet=True)

    def slow(batch: dict) -> dict:
        time.sleep(0.2)
        return batch
    loader = make_loader(tmp_path / "set", num_workers=1, batch_size=64, shuffle_buffer=640, batch_transform=slow,
                         timeout=1.0)
    assert len(next(iter(loader))["i"]) == 64
    stuck = make_loader(tmp_path / "set", num_workers=1, batch_size=64, shuffle_buffer=128, timeout=0.01,
                        batch_transform=slow)
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0\.02 seconds: no unit of 2 batches came from "
                                           r"the workers in that time \(timeout= is a batch's, 0\.01 s; a worker "
                                           r"sends a unit's batches at once\)"):
        next(iter(stuck))
