"""A build never leaves behind another build's index naming the shards it wrote over: a
complete build and the parts of a build split into parts (``--part``) write the same shard
names, so the one's index would describe the other's bytes (a loader reading them then calls
sound shards corrupt, and ``merge-index`` joins stale parts with exit status 0)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import IndexFormatError, OutputExistsError, Part
from tests.helpers import read_back

OPTIONS = dict(prefix="shard", pack=4, quiet=True)


@pytest.fixture
def arrays() -> dict[str, np.ndarray]:
    return {"i": np.arange(2000), "x": np.random.default_rng(3).random((2000, 8), dtype=np.float32)}


def _ids(folder: Path) -> list[int]:
    return sorted(int(i) for i in read_back(folder)[1]["i"])


def test_a_complete_build_over_parts_removes_their_indexes(arrays, tmp_path: Path) -> None:
    out = tmp_path / "out"
    for i in range(2):
        pipeline.write_shards(out, arrays, part=Part(i, 2), shard_samples=250, **OPTIONS)  # 8 shards
    with pytest.raises(OutputExistsError, match=re.escape(
            f"{out / 'index.part-00000-of-00002.json'} already exists: the index of a part of a build split into "
            f"parts (2 of them), whose shards this build writes over; pass overwrite=True (--overwrite)")):
        pipeline.write_shards(out, arrays, shard_samples=1000, **OPTIONS)
    pipeline.write_shards(out, arrays, shard_samples=1000, overwrite=True, **OPTIONS)  # 2 shards
    assert sorted(p.name for p in out.iterdir()) == ["index.bin", "index.json", "shard-000000.tar", "shard-000001.tar"]
    with pytest.raises(IndexFormatError, match="no partial indexes"):
        pipeline.merge_index_files([out], overwrite=True)
    assert _ids(out) == list(range(2000))


def test_a_part_built_over_a_complete_set_names_its_index_and_replaces_it(arrays, tmp_path: Path) -> None:
    out = tmp_path / "out"
    pipeline.write_shards(out, arrays, shard_samples=250, **OPTIONS)
    with pytest.raises(OutputExistsError, match=re.escape(
            f"{out / 'index.json'} already exists: a complete set's index, whose shards this part writes over; pass "
            f"overwrite=True (--overwrite) to replace that set, or write elsewhere")):
        pipeline.write_shards(out, arrays, part=Part(0, 2), shard_samples=500, **OPTIONS)
    pipeline.write_shards(out, arrays, part=Part(0, 2), shard_samples=500, overwrite=True, **OPTIONS)
    assert not (out / "index.json").exists() and not (out / "index.bin").exists()
    pipeline.write_shards(out, arrays, part=Part(1, 2), shard_samples=500, overwrite=True, **OPTIONS)
    pipeline.merge_index_files([out])
    assert _ids(out) == list(range(2000))
    assert sorted(p.name for p in out.glob("*.tar")) == [f"shard-00000{n}.tar" for n in range(4)]  # not 8
