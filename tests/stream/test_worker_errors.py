"""An error raised inside a DataLoader worker reaches the training loop as itself: its own type,
its fields (``url``, ``offset``), a first line naming the shard, the byte and the cause, and the
worker's traceback after it, exactly as without workers."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import pipeline
from pipeline import ShardError, SourceError
from pipeline.stream.workers import stop_workers
from tests.helpers import child_pids, started_since

warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("errors") / "set"
    pipeline.write_shards(folder, {"i": np.arange(600), "x": np.zeros((600, 4), np.float32)}, prefix="part",
                          shard_samples=200, pack=10, quiet=True)
    return folder


@pytest.fixture
def damaged(pristine: Path, tmp_path: Path) -> tuple[Path, int]:
    """A copy whose shard 1 has one flipped byte in the payload of its third record."""
    folder = Path(shutil.copytree(pristine, tmp_path / "set"))
    offset = int(pipeline.load_index(folder).shards[1].offsets[2])
    shard = folder / "part-000001.tar"
    data = bytearray(shard.read_bytes())
    data[offset + 512 + 40] ^= 0xFF
    shard.write_bytes(bytes(data))
    return folder, offset


def first_error(source: Path, workers: int, **options) -> BaseException:
    loader = pipeline.make_loader(source, num_workers=workers, batch_size=50, shuffle=False, **options)
    with pytest.raises(Exception) as caught:
        for _ in loader:
            pass
    return caught.value


@pytest.mark.parametrize("workers", [1, 2])
def test_a_corrupt_record_read_in_a_worker_is_the_shard_error_itself(damaged: tuple[Path, int], workers: int) -> None:
    folder, offset = damaged
    direct = first_error(folder, 0)
    relayed = first_error(folder, workers)
    assert type(relayed) is type(direct) is ShardError
    assert relayed.url == direct.url == str(folder / "part-000001.tar")
    assert relayed.offset == direct.offset == offset
    assert str(relayed) == str(direct)
    assert str(relayed).splitlines()[0].startswith(f"{folder / 'part-000001.tar'} at byte {offset}: ")
    assert "checksum" in str(relayed)
    notes = "\n".join(getattr(relayed, "__notes__", []))
    assert "Raised in DataLoader worker" in notes and "Traceback" in notes


def test_a_shard_gone_after_indexing_is_a_source_error_naming_it(pristine: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(pristine, tmp_path / "set"))
    (folder / "part-000002.tar").unlink()
    error = first_error(folder, 2)
    assert isinstance(error, SourceError)
    assert error.url == str(folder / "part-000002.tar") and isinstance(error.offset, int)
    assert "cannot open" in str(error)


def test_a_users_transform_error_keeps_its_type_and_the_workers_stop(pristine: Path) -> None:
    def transform(batch):
        raise KeyError("no such column: 'label'")

    before = set(child_pids(os.getpid()))
    error = first_error(pristine, 2, batch_transform=transform)
    assert type(error) is KeyError and "no such column" in str(error)
    assert "Raised in DataLoader worker" in "\n".join(error.__notes__)
    assert started_since(before) == []


class Unpicklable(Exception):
    """An error holding what no pickler can copy (a generator), whatever pickling support for
    exceptions the process installed (Dask installs tblib's, for one)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a} and {b}")
        self.source = (n for n in range(a, b))


def test_an_error_that_cannot_cross_processes_arrives_as_a_runtime_error_naming_it(pristine: Path) -> None:
    def transform(batch):
        raise Unpicklable(1, 2)

    error = first_error(pristine, 2, batch_transform=transform)
    assert type(error) is RuntimeError and str(error) == "Unpicklable: 1 and 2"


def test_the_dataset_of_a_loader_still_raises_as_usual_in_a_plain_dataloader(pristine: Path) -> None:
    def transform(batch):
        raise KeyError("no such column: 'label'")

    dataset = pipeline.ShardDataset(pristine, batch_size=50, batch_transform=transform)
    with pytest.raises(KeyError):
        next(iter(pipeline.make_loader(dataset, num_workers=2)))
    plain = iter(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2))
    with pytest.raises(KeyError, match="Caught KeyError in DataLoader worker process"):
        for _ in plain:  # PyTorch's own way: no batch, and no message of ours, stands in for the error
            pass
    # stopped here: the error's traceback holds the iterator in a reference cycle, and PyTorch's
    # shutdown run by a garbage collection (in some later test) waits 5 s per worker
    stop_workers(plain)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_dataloader_rebuilt_from_a_shardloaders_attributes_is_refused_not_fed_unit_messages(
        tmp_path: Path, context: str) -> None:
    """Hugging Face Trainer, resuming, rebuilds a plain DataLoader from the one it is given, the
    ShardLoader's worker_init_fn with it: its workers sent unit messages, which it passed on as
    9 "batches" of 63, and Trainer skipped the rest of the epoch without a word."""
    pipeline.write_shards(tmp_path / "s", {"y": np.arange(1000)}, shard_samples=100, quiet=True)
    loader = pipeline.make_loader(tmp_path / "s", num_workers=2, batch_size=16, multiprocessing_context=context)
    rebuilt = DataLoader(loader.dataset, batch_size=None, num_workers=2, worker_init_fn=loader.worker_init_fn,
                         collate_fn=loader.collate_fn, multiprocessing_context=context)
    with pytest.raises(RuntimeError, match="this DataLoader was made from a ShardLoader's attributes .*: iterate the "
                                           "ShardLoader itself"):
        next(iter(rebuilt))
    assert sum(len(batch["y"]) for batch in loader) == 1000  # the ShardLoader's own workers start as ever
