"""A disk that fills while a build writes: an error naming the file and saying what to do, and
nothing left that a reader could take for a set."""

from __future__ import annotations

import os
import re
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
