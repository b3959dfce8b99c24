"""index.json: round trip, and refusals that say what is wrong with which file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import IndexFormatError
from pipeline.format.index import merge_indexes


@pytest.fixture
def index_file(tmp_path: Path) -> Path:
    pipeline.write_shards(tmp_path, {"x": np.zeros((100, 3), np.float16), "s": np.arange(100)},
                          shard_samples=30, pack=8, quiet=True)
    return tmp_path / "index.json"


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_index_round_trips_and_records_schema_and_pack(index_file: Path) -> None:
    index = pipeline.load_index(index_file)
    assert pipeline.DatasetIndex.from_json(index.to_json()).to_json() == index.to_json()
    data = json.loads(index_file.read_text())
    assert data["format"] == "pipeline-shards" and data["version"] == 1 and data["pack"] == 8
    assert data["fields"] == {"x": {"dtype": "float16", "shape": [3]}, "s": {"dtype": "int64", "shape": []}}
    assert [s["samples"] for s in data["shards"]] == [30, 30, 30, 10] and data["samples"] == 100
    assert [len(s["offsets"]) for s in data["shards"]] == [4, 4, 4, 2]


def test_missing_index_and_unknown_version_are_named(tmp_path: Path, index_file: Path) -> None:
    with pytest.raises(IndexFormatError, match=r"empty/index\.json: no such index file"):
        (tmp_path / "empty").mkdir()
        pipeline.load_index(tmp_path / "empty")
    edit(index_file, lambda d: d.update(version=2))
    with pytest.raises(IndexFormatError, match="index version 2 is not supported"):
        pipeline.load_index(index_file)


def test_inconsistent_counts_are_refused(index_file: Path) -> None:
    edit(index_file, lambda d: d["shards"][0]["offsets"].pop())
    with pytest.raises(IndexFormatError, match="shard-000000.tar: 3 offsets for 4 records"):
        pipeline.load_index(index_file)


def test_not_json_is_an_index_error(index_file: Path) -> None:
    index_file.write_text("{not json")
    with pytest.raises(IndexFormatError, match="cannot read index"):
        pipeline.load_index(index_file)


def test_merging_complete_indexes_is_refused(index_file: Path) -> None:
    with pytest.raises(IndexFormatError, match="partial indexes only"):
        merge_indexes([pipeline.load_index(index_file)])
