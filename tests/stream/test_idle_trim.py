"""Reused memory kept across back-to-back epochs, given back once a process stops reading."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import pipeline
from pipeline.storage.buffers import process_pool
from pipeline.stream import idle_trim as idle_trim_module
from pipeline.stream.idle_trim import IdleTrim
from tests.helpers import wait_for


def held_after_a_loan(pool_bytes: int = 1 << 20) -> int:
    view = process_pool().take(pool_bytes)
    del view  # idle in the pool from now on
    return process_pool().held_bytes


@pytest.fixture
def quiet_process(monkeypatch) -> None:
    """No trim of this process's own under way (a loader of an earlier test may have asked for
    one), and trims 1 s after the last reading (a test held up for a moment on a busy machine
    must not miss its window); the pool emptied after the test."""
    gc.collect()  # an earlier test's loader left for the collector ends its readings now, not mid-test
    idle_trim_module.idle_trim().call_off()
    monkeypatch.setattr(idle_trim_module, "IDLE_S", 1.0)
    yield
    process_pool().trim()


def test_memory_goes_once_no_reading_started_for_a_while(quiet_process) -> None:
    trim = IdleTrim()
    assert held_after_a_loan() > 0
    trim.started()
    trim.ended()
    assert process_pool().held_bytes > 0  # not at the end of the reading itself
    assert wait_for(lambda: process_pool().held_bytes == 0)


def test_a_reading_that_starts_in_time_keeps_the_memory(quiet_process) -> None:
    trim = IdleTrim()
    held = held_after_a_loan()
    trim.started()
    trim.ended()
    trim.started()  # the next epoch, at once
    time.sleep(1.5)
    assert process_pool().held_bytes == held
    trim.started()  # a second reading of the process (a validation loader without workers)
    trim.ended()
    time.sleep(1.5)
    assert process_pool().held_bytes == held  # one reading still under way
    trim.ended()
    assert wait_for(lambda: process_pool().held_bytes == 0)


def test_a_stopped_trim_never_runs(quiet_process) -> None:
    trim = IdleTrim()
    held = held_after_a_loan()
    trim.started()
    trim.ended()
    trim.stop()  # what the exit does
    trim.started()  # a reading that ends after the exit's stop (in a thread still ending)
    trim.ended()
    time.sleep(1.5)
    assert process_pool().held_bytes == held


class PoolAllocations:
    """A batch transform that adds, to each batch, the worker's pid and the buffers its pool
    has made so far."""

    def __call__(self, batch: dict) -> dict:
        batch["pool"] = torch.tensor([os.getpid(), process_pool().allocations])
        return batch


def allocations_per_worker(loader) -> dict[int, int]:
    """Per worker, the buffers its pool made by the end of an epoch of ``loader``."""
    made: dict[int, int] = {}
    for batch in loader:
        pid, count = batch["pool"].tolist()
        made[pid] = max(made.get(pid, 0), count)
    return made


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """11,000 samples of 1 KB: the rows of a block are joined in the pool (1.3 MB; the epoch's
    last block 0.6 MB, which does not fit the others' buffers)."""
    folder = tmp_path_factory.mktemp("trim")
    x = np.random.default_rng(0).random((11_000, 256), dtype=np.float32)
    pipeline.write_shards(folder, {"x": x, "i": np.arange(11_000)}, prefix="t", pack=16, shard_samples=2_750,
                          quiet=True)
    return folder


def test_workers_reading_epoch_after_epoch_make_no_buffers_after_the_first(shards: Path, monkeypatch) -> None:
    monkeypatch.setattr(idle_trim_module, "IDLE_S", 60.0)  # inherited by the workers: no trim between epochs
    loader = pipeline.make_loader(shards, num_workers=2, batch_size=100, shuffle_buffer=2_600, seed=1,
                                  batch_transform=PoolAllocations())
    first = allocations_per_worker(loader)
    assert len(first) == 2 and min(first.values()) > 0
    for _ in range(3):  # the epoch's last block is smaller: its buffer is kept beside the others
        assert allocations_per_worker(loader) == first


def test_idle_workers_give_their_memory_back(shards: Path, monkeypatch) -> None:
    monkeypatch.setattr(idle_trim_module, "IDLE_S", 0.3)
    loader = pipeline.make_loader(shards, num_workers=2, batch_size=100, shuffle_buffer=2_600, seed=1,
                                  batch_transform=PoolAllocations())
    first = allocations_per_worker(loader)
    time.sleep(4)  # the training process evaluates, say: the workers idle (their trims are due in 0.3 s)
    again = allocations_per_worker(loader)
    assert again.keys() == first.keys() and all(again[pid] > first[pid] for pid in first)
