"""A disk that fills while a build writes: an error naming the file and saying what to do, and
nothing left that a reader could take for a set."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

import numpy as np
import pytest

import pipeline


@pytest.mark.parametrize("written", ["shard-000001.tar", "index.json"])
def test_a_full_disk_is_an_error_naming_the_file_and_what_to_do(tmp_path: Path, written: str) -> None:
    """The error said "[Errno 28] No space left on device", naming nothing; and a disk that
    filled as the index was saved left its table, index.bin, without it. (/dev/full answers
    every write with ENOSPC: the file's temporary name is made a link to it.)"""
    out = tmp_path / "out"
    out.mkdir()
    (out / f".{written}.tmp-{os.getpid()}").symlink_to("/dev/full")
    with pytest.raises(OSError, match=re.escape(f"[Errno 28] No space left on device, writing {out / written}: free "
                                                f"space there, or write elsewhere")):
        pipeline.write_shards(out, {"x": np.arange(300)}, shard_samples=100, quiet=True)
    assert not (out / written).exists() and not (out / "index.bin").exists()
    assert sorted(path.name for path in out.iterdir())[1:] == ["shard-000000.tar"] + (
        ["shard-000001.tar", "shard-000002.tar"] if written == "index.json" else [])  # (after .index.plan.json)


def test_a_failure_after_the_index_is_in_place_keeps_its_shard_table(tmp_path: Path, monkeypatch) -> None:
    """The folder's fsync, after the index's rename, failed: the table the index in place names
    was deleted with the failed write's clean-up, and the set no longer opened. (An I/O error of a
    folder's fsync cannot be had on demand: os.fsync is made to fail on the folder once the index is there.)"""
    fsync = os.fsync

    def failing_on_folders(descriptor: int) -> None:
        if stat.S_ISDIR(os.fstat(descriptor).st_mode) and (tmp_path / "out" / "index.json").exists():
            raise OSError(errno.EIO, "Input/output error")
        fsync(descriptor)
    monkeypatch.setattr(os, "fsync", failing_on_folders)
    with pytest.raises(OSError, match="Input/output error"):
        pipeline.write_shards(tmp_path / "out", {"x": np.arange(300)}, shard_samples=100, quiet=True)
    monkeypatch.setattr(os, "fsync", fsync)
    assert pipeline.load_index(tmp_path / "out").samples == 300
