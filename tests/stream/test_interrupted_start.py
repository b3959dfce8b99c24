"""A loop cut as it starts or resets its workers (Ctrl-C as an epoch begins, in a notebook), and
a forked child that iterates the loader its parent was using: the loader goes on exactly, and
leaves nothing running behind it."""

from __future__ import annotations

import multiprocessing.process
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

import pipeline
from tests.helpers import child_pids
from tests.stream.shardsets import random_sizes, uneven_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return uneven_shards(tmp_path_factory.mktemp("interrupted"), random_sizes(4, 200, 400, seed=5), pack=4)


def interrupted_once_its_workers_were_asked_to_reset(monkeypatch) -> None:
    """Ctrl-C pressed while the persistent workers' iterator resets for a new epoch, after it
    sent them the word to start again and before it heard from each of them."""
    reset, get_data = _MultiProcessingDataLoaderIter._reset, _MultiProcessingDataLoaderIter._get_data
    armed = {"reset": True}

    def resetting(self, loader, first_iter: bool = False) -> None:
        self._interrupt_next_get = not first_iter and armed.pop("reset", False)
        reset(self, loader, first_iter)

    def getting(self):
        if getattr(self, "_interrupt_next_get", False):
            self._interrupt_next_get = False
            os.kill(os.getpid(), signal.SIGINT)
        return get_data(self)
    monkeypatch.setattr(_MultiProcessingDataLoaderIter, "_reset", resetting)
    monkeypatch.setattr(_MultiProcessingDataLoaderIter, "_get_data", getting)


def test_ctrl_c_as_persistent_workers_reset_for_an_epoch_leaves_a_loader_that_plays_it_exactly(
        shards: Path, monkeypatch) -> None:
    """Cut in the middle of the reset, the iterator was kept, half reset: the next loop over the
    loader raised KeyError: _ResumeIteration from inside DataLoader, or waited for ever."""
    loader = pipeline.make_loader(shards, num_workers=2, batch_size=32, seed=0)
    samples = loader.dataset.samples
    assert sorted(i for batch in loader for i in batch["i"].tolist()) == list(range(samples))
    interrupted_once_its_workers_were_asked_to_reset(monkeypatch)
    workers = {worker.pid for worker in loader._iterator._workers}
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    assert not set(child_pids(os.getpid())) & workers  # the workers of the cut reset are stopped
    for epoch in (1, 2):
        assert loader.epoch == epoch
        assert sorted(i for batch in loader for i in batch["i"].tolist()) == list(range(samples))


def test_ctrl_c_as_workers_start_stops_them_and_the_next_loop_plays_the_epoch(shards: Path, monkeypatch) -> None:
    """Workers that do not persist: the interrupt, held until they had started, left them running
    (the loop's iterator, not yet the loader's, was not stopped)."""
    reset, started = _MultiProcessingDataLoaderIter._reset, []

    def interrupted(self, loader, first_iter: bool = False) -> None:
        started.append({worker.pid for worker in self._workers})
        os.kill(os.getpid(), signal.SIGINT)
        reset(self, loader, first_iter)
    monkeypatch.setattr(_MultiProcessingDataLoaderIter, "_reset", interrupted)
    loader = pipeline.make_loader(shards, num_workers=2, batch_size=32, seed=0, persistent_workers=False)
    with pytest.raises(KeyboardInterrupt) as interrupted_loop:  # (its traceback kept, as a notebook keeps it)
        for _ in loader:
            pass
    assert len(started[0]) == 2 and not set(child_pids(os.getpid())) & started[0], interrupted_loop
    monkeypatch.setattr(_MultiProcessingDataLoaderIter, "_reset", reset)
    assert sorted(i for batch in loader for i in batch["i"].tolist()) == list(range(loader.dataset.samples))


def test_ctrl_c_pressed_twice_as_workers_start_stops_those_started(shards: Path, monkeypatch) -> None:
    """The second press cuts the iterator's __init__, before the loop has an iterator to stop: the
    workers it had started ran on while the traceback was kept."""
    start, started = multiprocessing.process.BaseProcess.start, []

    def pressed_twice_before_the_second(self) -> None:
        if len(started) == 1:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        start(self)
        started.append(self.pid)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", pressed_twice_before_the_second)
    loader = pipeline.make_loader(shards, num_workers=2, batch_size=32, seed=0, persistent_workers=False)
    with pytest.raises(KeyboardInterrupt) as interrupted_loop:  # (its traceback kept, as a notebook keeps it)
        for _ in loader:
            pass
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    assert started and not set(child_pids(os.getpid())) & set(started), interrupted_loop
    assert sorted(i for batch in loader for i in batch["i"].tolist()) == list(range(loader.dataset.samples))


FORKED = """
import os, sys
import pipeline
loader = pipeline.make_loader(sys.argv[1], num_workers=2, batch_size=32, seed=0)
loop = iter(loader)
seen = [i for _ in range(3) for i in next(loop)["i"].tolist()]
child = os.fork()
if child == 0:
    try:
        print("child", len(seen) + sum(len(batch["i"]) for batch in loader), flush=True)
    finally:
        os._exit(0)
os.waitpid(child, 0)
seen += [i for batch in loop for i in batch["i"].tolist()]
print("parent", sorted(seen) == list(range(loader.dataset.samples)), flush=True)
"""


def test_a_forked_child_that_iterates_its_copy_of_the_loader_leaves_the_parents_loop_alone(shards: Path) -> None:
    """The child's loop stopped the parent's workers, through the events it shares with them:
    the parent's loop then waited for a batch for ever, with no error."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(FORKED), str(shards)], capture_output=True,
                            text=True, timeout=120)
    samples = pipeline.load_index(shards).samples
    assert result.returncode == 0 and result.stdout.split("\n") == [f"child {samples}", "parent True", ""], result.stderr
