"""Two builds into one folder at once: the second is refused while the first writes, rather than
both deleting each other's files and one index naming the other's shards."""

from __future__ import annotations

import errno
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import OutputExistsError, Part, ShardWriter
from pipeline.storage import folder_lock
from pipeline.storage.destination import destination
from tests.helpers import read_back

ARRAYS = {"x": np.arange(300)}


def test_a_build_is_refused_while_another_writes_the_folder_and_goes_ahead_once_it_ended(tmp_path: Path) -> None:
    """Two --overwrite builds of other inputs started together: one said it succeeded, with an
    index naming 21 of the other's shards, which failed their checks."""
    with ShardWriter(tmp_path / "out", shard_samples=100) as writer:
        writer.write_columns(ARRAYS)
        for build in (lambda: pipeline.write_shards(tmp_path / "out", ARRAYS, overwrite=True, quiet=True),
                      lambda: pipeline.write_shards(tmp_path / "out", ARRAYS, validation=0.1, overwrite=True),
                      lambda: ShardWriter(tmp_path / "out", overwrite=True),
                      lambda: pipeline.index_shards(tmp_path / "out", overwrite=True, quiet=True)):
            with pytest.raises(OutputExistsError, match=re.escape(
                    f"{tmp_path / 'out'} is being written by another build now (or by a ShardWriter, or pipeline "
                    f"index; one never closed? close() it): wait for it to end, or write elsewhere")):
                build()
    pipeline.write_shards(tmp_path / "out", {"x": np.arange(50)}, overwrite=True, quiet=True)
    assert read_back(tmp_path / "out")[1]["x"] == list(range(50))


def test_the_parts_of_one_build_write_beside_each_other_but_not_beside_a_whole_build(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "whole", shard_samples=100):
        with pytest.raises(OutputExistsError, match="is being written by a build of the whole set now"):
            pipeline.write_shards(tmp_path / "whole", ARRAYS, part=Part(0, 2), quiet=True)
    first = destination(tmp_path / "parts")
    try:
        assert first.hold(shared=True)  # part 0 writing
        pipeline.write_shards(tmp_path / "parts", ARRAYS, part=Part(1, 2), shard_samples=100, quiet=True)
        with pytest.raises(OutputExistsError, match="is being written by another build now"):
            pipeline.write_shards(tmp_path / "parts", ARRAYS, overwrite=True, quiet=True)
    finally:
        first.close()


def test_a_killed_build_holds_the_folder_no_longer(tmp_path: Path) -> None:
    """The lock is the folder's flock: it goes with the process, however it ends."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, pipeline; w = pipeline.ShardWriter(sys.argv[1]); "
                               "print('holding', flush=True); sys.stdin.read()", str(tmp_path / "out")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "holding\n"
        with pytest.raises(OutputExistsError, match="is being written by another build now"):
            pipeline.write_shards(tmp_path / "out", ARRAYS, quiet=True)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    pipeline.write_shards(tmp_path / "out", ARRAYS, overwrite=True, quiet=True)
    assert read_back(tmp_path / "out")[1]["x"] == list(range(300))


FORK_POOL = """
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
import numpy as np
import pipeline
with ProcessPoolExecutor(2, mp_context=get_context("fork")) as pool:
    pipeline.write_shards(sys.argv[1], {"x": np.arange(300)}, shard_samples=100, executor=pool, quiet=True)
    pipeline.write_shards(sys.argv[1], {"x": np.arange(30)}, overwrite=True, quiet=True)  # (the pool's workers live on)
print(pipeline.load_index(sys.argv[1]).samples)
"""


def test_processes_forked_while_the_folder_was_held_do_not_hold_it_once_the_build_ended(tmp_path: Path) -> None:
    """A fork pool of the user's, given as executor=: its workers shared the lock, and held it
    after the build that took it had ended."""
    result = subprocess.run([sys.executable, "-c", FORK_POOL, str(tmp_path / "out")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout == "30\n", result.stderr


def test_a_writer_dropped_unclosed_lets_the_folder_go(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path / "out")
    writer.write({"x": 1})
    del writer  # (a notebook cell that failed before its close)
    pipeline.write_shards(tmp_path / "out", ARRAYS, overwrite=True, quiet=True)
    assert len(read_back(tmp_path / "out")[0]) == 300


def test_a_folder_that_takes_no_lock_is_written_as_before(tmp_path: Path, monkeypatch) -> None:
    """NFS answers flock on a folder with EBADF (it emulates flock with POSIX locks, which need a
    file open for writing); Lustre without -o flock with ENOSYS: every build there failed."""
    def unsupported(descriptor: int, operation: int) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")
    monkeypatch.setattr(folder_lock.fcntl, "flock", unsupported)
    with ShardWriter(tmp_path / "out", shard_samples=100) as writer:
        writer.write_columns(ARRAYS)
    assert len(read_back(tmp_path / "out")[0]) == 300
