"""Warnings of shards without an index given once a dataset: not again by each worker every epoch
(non-persistent workers start anew from a process that never saw them warn), and not kept from a
second loader or a second set that has its own cause to be told."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import webdataset as wds

from pipeline import ShardDataset, make_loader
from tests.stream.test_dataset import webdataset_shards

pytestmark = pytest.mark.filterwarnings("ignore:.*suggested max number of worker")

IDLE = "shards without an index for"


def test_a_second_loader_with_more_consumers_than_shards_is_told_so(tmp_path: Path) -> None:
    """The first loader, with one consumer, had nothing to tell, and kept the second, with two
    consumers of one shard, from telling that one of them reads nothing."""
    dataset = ShardDataset(webdataset_shards(tmp_path / "wds", count=1, per_shard=10), batch_size=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_loader(dataset, num_workers=0)
        make_loader(dataset, num_workers=2)
    assert [str(w.message) for w in caught if IDLE in str(w.message)] == [
        "1 shards without an index for 2 consumers (ranks x workers): some read nothing; index them with "
        "`pipeline index` for exact epochs"]


PLAIN_DATALOADER = """
import sys
from torch.utils.data import DataLoader
from pipeline import ShardDataset

if __name__ == "__main__":
    dataset = ShardDataset([sys.argv[1]], batch_size=4)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
    for _ in range(2):
        print(sum(len(batch["cls"]) for batch in loader))
"""


def test_a_plain_dataloaders_workers_tell_of_idle_consumers_once_not_every_epoch(tmp_path: Path) -> None:
    """Its worker 0 tells as it begins; non-persistent workers, new each epoch, told it again.
    (Spawned workers share the mark as forked ones do, through torch's pickling of shared memory,
    as they share the epoch: 10 s here, to start four.)"""
    (tmp_path / "loop.py").write_text(PLAIN_DATALOADER)
    url, = webdataset_shards(tmp_path / "wds", count=1, per_shard=10)
    result = subprocess.run([sys.executable, str(tmp_path / "loop.py"), url], capture_output=True,
                            text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "10\n10\n"), result.stderr
    assert result.stderr.count(IDLE) == 1, result.stderr


UNREAD = "that are not read (the fields read are"


def captioned_shards(folder: Path, count: int = 4, only: int | None = None) -> str:
    """``count`` shards of 4 samples, each with a caption but the first, whose fields (those read
    without fields=) so leave every other caption unread; with ``only``, the captions are that
    shard's alone."""
    folder.mkdir()
    for s in range(count):
        with wds.TarWriter(str(folder / f"s-{s}.tar")) as writer:
            for i in range(4):
                captioned = (s or i) and only in (None, s)
                writer.write({"__key__": f"k{s}-{i}", "cls": i, **({"notes.txt": "words"} if captioned else {})})
    return str(folder / f"s-{{0..{count - 1}}}.tar")


NEW_WORKERS_EACH_EPOCH = """
import logging, sys
from pipeline import make_loader

if __name__ == "__main__":
    logging.basicConfig(format="%(levelname)s %(message)s")
    loader = make_loader(sys.argv[1], num_workers=2, batch_size=4, persistent_workers=False)
    for _ in range(2):
        print(sum(len(batch["cls"]) for batch in loader))
"""


def test_fields_not_read_are_told_once_not_by_each_epochs_new_workers(tmp_path: Path) -> None:
    """Each worker told once, in a registry of its process: non-persistent workers, forked anew
    each epoch from a process that never saw the warning, told it every epoch. (One shard holds
    the captions, read by one worker an epoch: two workers meeting them at the same moment may
    each tell, the mark being no lock.)"""
    (tmp_path / "loop.py").write_text(NEW_WORKERS_EACH_EPOCH)
    result = subprocess.run([sys.executable, str(tmp_path / "loop.py"), captioned_shards(tmp_path / "wds", only=2)],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "16\n16\n"), result.stderr
    assert result.stderr.count(UNREAD) == 1, result.stderr


def test_fields_not_read_are_told_of_each_set_with_them(tmp_path: Path, caplog) -> None:
    """A validation set with the same fields as the training set, read in the same process, was
    told of at DEBUG level only: the registry was the process's, keyed by the fields."""
    train, validation = captioned_shards(tmp_path / "train"), captioned_shards(tmp_path / "validation", count=2)
    with caplog.at_level("WARNING", logger="pipeline.stream"):
        for pattern in (train, validation):
            assert sum(len(batch["cls"]) for batch in make_loader(pattern, num_workers=0, batch_size=4)) > 0
    told = [r.getMessage() for r in caplog.records if UNREAD in r.getMessage()]
    assert [Path(message.split(":")[0]).parent.name for message in told] == ["train", "validation"]
