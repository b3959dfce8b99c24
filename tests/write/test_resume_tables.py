"""A resume of a table build after its inputs changed: the shards of rows that moved, or of a
file written again, are written again; never another file's rows kept under the plan."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.write.shard_file import ShardFile
from tests.helpers import read_back

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
OPTIONS = dict(shard_samples=10, quiet=True)


def partition(root: Path, year: int, version: int = 0) -> Path:
    """``root/year=YEAR/part-0.parquet``, as pyarrow's write_dataset names every partition's file."""
    folder = root / f"year={year}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "part-0.parquet"
    pq.write_table(pa.table({"y": np.arange(40) + 1000 * year + 100 * version}), path, row_group_size=20)
    return path


def stopped_build(inputs: list[Path], out: Path, monkeypatch, shards: int) -> None:
    """A build stopped (as a kill would) once ``shards`` shards are finished."""
    commit, done = ShardFile.commit, []

    def stopping(self: ShardFile):
        if len(done) == shards:
            raise KeyboardInterrupt
        done.append(self)
        return commit(self)
    monkeypatch.setattr(ShardFile, "commit", stopping)
    with pytest.raises(KeyboardInterrupt):
        pipeline.build_parquet(inputs, out, **OPTIONS)
    monkeypatch.setattr(ShardFile, "commit", commit)


def test_a_partition_added_before_a_resume_gives_the_set_a_fresh_build_gives(tmp_path: Path, monkeypatch) -> None:
    """Files were named in the plan by their base name: every partition's part-0.parquet was the
    same file, so a partition added in front kept 4 shards of another year's rows (that year
    twice, the new one never)."""
    root = tmp_path / "ds"
    files = [partition(root, 2023), partition(root, 2024)]
    stopped_build(files, tmp_path / "out", monkeypatch, shards=4)
    files.insert(0, partition(root, 2022))
    pipeline.build_parquet(files, tmp_path / "out", resume=True, **OPTIONS)
    assert read_back(tmp_path / "out")[1]["y"] == [1000 * year + n for year in (2022, 2023, 2024) for n in range(40)]


def test_a_table_file_written_again_before_a_resume_has_its_shards_written_again(tmp_path: Path, monkeypatch) -> None:
    """A file exported again with as many rows kept its finished shards of the old rows."""
    root = tmp_path / "ds"
    files = [partition(root, 2023), partition(root, 2024)]
    stopped_build(files, tmp_path / "out", monkeypatch, shards=6)
    partition(root, 2023, version=1)
    os.utime(files[0], (1_000_000_000, 1_000_000_000))  # (written again in the same second here: another time)
    pipeline.build_parquet(files, tmp_path / "out", resume=True, **OPTIONS)
    assert read_back(tmp_path / "out")[1]["y"] == [1000 * year + 100 * (year == 2023) + n for year in (2023, 2024)
                                                   for n in range(40)]
