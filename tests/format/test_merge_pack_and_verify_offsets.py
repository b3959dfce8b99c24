"""merge-index names parts of another pack at merge time; verify finds a shard table whose record offsets are not where the records start."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import IndexFormatError, Part

ARRAYS = {"x": np.arange(1000, dtype=np.int64), "y": np.ones((1000, 3), np.float32)}


def test_parts_of_another_pack_are_named_at_merge_time(tmp_path: Path) -> None:
    pipeline.write_shards(tmp_path / "p", ARRAYS, part=Part(0, 2), shard_samples=100, pack=10, quiet=True)
    pipeline.write_shards(tmp_path / "p", ARRAYS, part=Part(1, 2), shard_samples=100, pack=20, quiet=True)
    with pytest.raises(IndexFormatError, match=re.escape("part 1 was built with pack=20, part 0 with pack=10")):
        pipeline.merge_index_files([tmp_path / "p"])
    assert not (tmp_path / "p" / "index.json").exists()


def test_verify_finds_record_offsets_the_table_misstates(tmp_path: Path) -> None:
    """A table whose offsets were edited (its sha256 in index.json made to match): every
    record's checksum is still right, so only the offset check tells that a ranged read of
    record 1 would start in the wrong place."""
    pipeline.write_shards(tmp_path, ARRAYS, shard_samples=100, pack=10, quiet=True)
    index = pipeline.load_index(tmp_path)
    table = tmp_path / "index.bin"
    data = bytearray(table.read_bytes())
    shards = len(index.shards)
    offsets_start = 64 + shards * 56  # header, then samples, records, bytes (int64 each) and sha256 per shard
    width = 4  # every shard under 4 GiB: 4-byte offsets
    second = int.from_bytes(data[offsets_start + width:offsets_start + 2 * width], "little")
    assert second == int(index.shards[0].offsets[1]) > 0
    data[offsets_start + width:offsets_start + 2 * width] = (second + 512).to_bytes(width, "little")
    table.write_bytes(bytes(data))
    meta = json.loads((tmp_path / "index.json").read_text())
    meta["shards"]["table_sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    (tmp_path / "index.json").write_text(json.dumps(meta))
    problems = [str(p) for p in pipeline.verify(tmp_path)]
    assert len(problems) == 1, problems
    assert f"record starts at byte {second}, the index says {second + 512}" in problems[0]
