"""Reading rows out of shards: ranges that start mid-record, and joining pieces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import ShardError, SourceError
from pipeline.stream.reader import concat_columns, read_rows
from tests.stream.shardsets import uneven_shards


def test_rows_from_the_middle_of_packed_records(tmp_path: Path) -> None:
    folder = uneven_shards(tmp_path / "s", [100, 50], pack=16)
    index = pipeline.load_index(folder)
    columns = read_rows(str(folder / index.shards[0].url), index.shards[0], 16, 7, 61)
    assert columns["i"].tolist() == list(range(7, 61))
    columns = read_rows(str(folder / index.shards[1].url), index.shards[1], 16, 33, 50, {"x"})
    assert list(columns) == ["x"] and columns["x"][:, 0].tolist() == [2.0 * i for i in range(133, 150)]


def test_an_index_that_disagrees_with_the_shard_is_an_error_naming_shard_and_byte(tmp_path: Path) -> None:
    folder = uneven_shards(tmp_path / "s", [100], pack=16)
    shard = pipeline.load_index(folder).shards[0]
    url = str(folder / shard.url)
    wrong = int(shard.offsets[5]) + 512  # points into a record's payload
    shard.offsets = [*shard.offsets[:5], wrong, *shard.offsets[6:]]
    with pytest.raises(ShardError, match=rf"part-000000\.tar at byte {wrong}: bad tar header checksum"):
        read_rows(url, shard, 16, 80, 100)
    (folder / shard.url).write_bytes((folder / shard.url).read_bytes()[:shard.offsets[6]])
    shard = pipeline.load_index(folder).shards[0]
    with pytest.raises(SourceError, match=rf"part-000000\.tar at byte {shard.offsets[6]}: ends at byte"):
        read_rows(url, shard, 16, 80, 100)


def test_joining_pieces_keeps_arrays_and_falls_back_to_lists_for_ragged_fields() -> None:
    pieces = [{"a": np.arange(3), "r": np.zeros((3, 2))}, {"a": np.arange(3, 5), "r": np.zeros((2, 5))}]
    out = concat_columns(pieces)
    assert out["a"].tolist() == [0, 1, 2, 3, 4]
    assert isinstance(out["r"], list) and [r.shape for r in out["r"]] == [(2,)] * 3 + [(5,)] * 2
