"""Warnings of shards without an index given once a dataset: not again by each worker every epoch
(non-persistent workers start anew from a process that never saw them warn), and not kept from a
second loader or a second set that has its own cause to be told."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

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
