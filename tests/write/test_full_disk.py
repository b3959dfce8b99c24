"""A disk that fills while a build writes, or a folder that cannot be written: an error naming
the file and saying what to do, and nothing left that a reader could take for a set."""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.storage.destination import write_error


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


def _open_files() -> list[str]:
    return [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")]


@pytest.mark.parametrize("samples", [150, 300])  # the disk fills as the last shard is finished, or in a write
def test_a_shard_writer_on_a_full_disk_names_the_shard_and_leaves_no_part_of_it(tmp_path: Path, samples: int) -> None:
    """ShardWriter's error named nothing, and a shard whose commit failed kept its temporary file
    and its descriptor: deleting the file freed nothing until the process ended."""
    out = tmp_path / "out"
    out.mkdir()
    (out / f".shard-000001.tar.tmp-{os.getpid()}").symlink_to("/dev/full")
    told = re.escape(f"[Errno 28] No space left on device, writing {out / 'shard-000001.tar'}: free space there, or "
                     f"write elsewhere")
    with pytest.raises(OSError, match=told):
        with pipeline.ShardWriter(out, shard_samples=100) as writer:
            for i in range(samples):
                writer.write({"x": np.full(1000, i)})
    assert sorted(path.name for path in out.iterdir()) == ["shard-000000.tar"]
    assert "/dev/full" not in _open_files()
    (out / f".shard-000001.tar.tmp-{os.getpid()}").symlink_to("/dev/full")
    writer = pipeline.ShardWriter(out, shard_samples=100, overwrite=True)
    with pytest.raises(OSError, match=told):
        for i in range(samples):
            writer.write({"x": np.full(1000, i)})
        writer.close()
    if samples == 300:  # (a write failed: the writer is stopped, and says what it left)
        with pytest.raises(RuntimeError, match=r"ShardWriter is closed by an error: \[Errno 28\]"):
            writer.write({"x": np.zeros(1000)})
        with pytest.raises(RuntimeError, match=r"ShardWriter stopped at an error: \[Errno 28\] .*; the first 100 "
                                               r"samples are in the 1 shards it finished, without an index"):
            writer.close()
    assert sorted(path.name for path in out.iterdir() if path.name != ".index.plan.json") == ["shard-000000.tar"]
    assert "/dev/full" not in _open_files()


def test_a_full_staging_folder_of_a_remote_build_says_where_to_stage_instead() -> None:
    """'write elsewhere' sent the user to change the S3 output; the staging folder is what to move."""
    staged = Path("/tmp/pipeline-staging-host-7-x1/shard-000000.tar")
    named = write_error(OSError(errno.ENOSPC, "No space left on device"), staged)
    assert str(named) == (f"[Errno 28] No space left on device, writing {staged}: free space there, or set "
                          f"PIPELINE_STAGING_DIR to a folder with room (shards wait there for their upload)")


def test_resume_of_a_finished_set_in_a_read_only_folder_has_nothing_to_do(tmp_path: Path, capsys) -> None:
    """--resume deleted the plan of a finished set even where there was none: on a read-only
    folder (a published set), 'Read-only file system' for a file that is not there."""
    pipeline.write_shards(tmp_path / "set", {"x": np.arange(300)}, shard_samples=100, quiet=True)
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    if subprocess.run(["mount", "--bind", "-o", "ro", str(tmp_path / "set"), str(read_only)],
                      capture_output=True).returncode != 0:
        pytest.skip("this process cannot mount (a read-only bind mount needs root)")
    try:
        index = pipeline.write_shards(read_only, {"x": np.arange(300)}, shard_samples=100, resume=True)
        assert index.samples == 300
        assert capsys.readouterr().err.endswith(f"{read_only / 'index.json'} is already complete (3 shards); "
                                                f"nothing to resume\n")
    finally:
        subprocess.run(["umount", str(read_only)], check=True)
