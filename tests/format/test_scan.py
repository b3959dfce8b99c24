"""Scanning a shard gives back the index entry and schema its writer gave, and refuses a file
that is not a whole shard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.format.scan import scan_shard
from pipeline.format.tar import END_OF_ARCHIVE
from pipeline.write.resume import planned_rows


def entry(info: pipeline.ShardInfo) -> tuple:
    return info.url, info.samples, info.records, info.bytes, info.sha256, [int(o) for o in info.offsets]


@pytest.mark.parametrize("pack", [1, 7])
def test_a_scan_gives_the_entry_and_schema_the_writer_gave(tmp_path: Path, pack: int) -> None:
    rng = np.random.default_rng(2)
    arrays = {"x": rng.random((700, 3, 2), dtype=np.float32), "y": rng.integers(0, 5, 700),
              "flag": rng.random(700) > 0.5}
    index = pipeline.write_shards(tmp_path, arrays, pack=pack, shard_bytes=16 << 10, quiet=True)
    assert len(index.shards) > 2
    for info in index.shards:
        scanned, schema, rows = scan_shard((tmp_path / info.url).read_bytes(), info.url)
        assert entry(scanned) == entry(info)
        assert schema == index.fields
        assert rows == planned_rows(info.samples, pack)


def test_a_packed_list_column_is_described_by_every_value(tmp_path: Path) -> None:
    (tmp_path / "files").mkdir()
    for i, text in enumerate(["a", "b", "c", "d"]):
        (tmp_path / "files" / f"{i:04d}.txt").write_text(text)
    index = pipeline.build_folder(tmp_path / "files", tmp_path / "out", pack=3, quiet=True)
    for info in index.shards:
        scanned, schema, _ = scan_shard((tmp_path / "out" / info.url).read_bytes(), info.url)
        assert entry(scanned) == entry(info)
        assert schema == index.fields


@pytest.fixture
def shard(tmp_path: Path) -> bytes:
    index = pipeline.write_shards(tmp_path, {"x": np.arange(40)}, pack=4, quiet=True)
    return (tmp_path / index.shards[0].url).read_bytes()


@pytest.mark.parametrize("damage, reason", [
    (lambda data: data[:-len(END_OF_ARCHIVE)], "end-of-archive"),  # cut at a record boundary
    (lambda data: data[:700], "truncated"),
    (lambda data: data + b"\0" * 512, "end-of-archive"),
    (lambda data: data[:100] + b"?" + data[101:], "checksum"),
    (lambda data: b"", "end-of-archive"),
])
def test_a_damaged_or_unfinished_shard_is_refused(shard: bytes, damage, reason: str) -> None:
    with pytest.raises(pipeline.ShardError, match=reason):
        scan_shard(damage(shard), "s.tar")
