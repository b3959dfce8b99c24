"""Fixtures shared by the tests."""

from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

# A suite started with SIGINT ignored (`nohup`, a script's `&`) would pass the ignoring on to every
# process it starts, and the tests of Ctrl-C would meet builds that rightly ignore it: take Ctrl-C
# as a terminal's Python does.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def tabular() -> dict[str, np.ndarray]:
    """3000 rows of 10 float32 features and an int64 label."""
    rng = np.random.default_rng(1)
    return {"x": rng.random((3000, 10), dtype=np.float32), "y": rng.integers(0, 10, 3000)}


@pytest.fixture(scope="session")
def tune_shards(tmp_path_factory) -> Path:
    """6,000 samples in 6 shards, packed 8 to a record: what the tune tests measure."""
    import pipeline

    out = tmp_path_factory.mktemp("tuned")
    rng = np.random.default_rng(0)
    pipeline.write_shards(out, {"x": rng.random((6000, 16), np.float32), "y": np.arange(6000)}, pack=8,
                          shard_samples=1000, quiet=True)
    return out


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """An empty folder for a process's TMPDIR, right in /tmp: DataLoader workers make a Unix socket
    in their temporary folder (at most 107 bytes a path), which pytest's deep ones can leave no
    room for (see pipeline.stream.socket_folder)."""
    folder = Path(tempfile.mkdtemp(prefix="t-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
