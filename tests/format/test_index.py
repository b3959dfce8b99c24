"""index.json and its binary shard table: round trip, scale-friendly layout, and refusals that
say what is wrong with which file."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import xxhash

import pipeline
from pipeline import IndexFormatError
from pipeline.format.index import merge_indexes
from pipeline.format.records import iter_records
from pipeline.format.shard_names import ShardNames
from pipeline.format.shard_table import RangeColumn, ShardInfo, ShardTable, read_table, write_table


@pytest.fixture
def index_file(tmp_path: Path) -> Path:
    pipeline.write_shards(tmp_path, {"x": np.zeros((100, 3), np.float16), "s": np.arange(100)},
                          shard_samples=30, pack=8, quiet=True)
    return tmp_path / "index.json"


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_index_is_small_json_plus_a_table_with_every_record_offset(index_file: Path) -> None:
    data = json.loads(index_file.read_text())
    assert data["format"] == "pipeline-shards" and data["version"] == 2 and data["pack"] == 8
    assert data["fields"] == {"x": {"dtype": "float16", "shape": [3]}, "s": {"dtype": "int64", "shape": []}}
    assert data["samples"] == 100 and data["records"] == 14
    table = index_file.with_name("index.bin").read_bytes()
    assert data["shards"] == {"count": 4, "names": ["shard-{000000..000003}.tar"], "table": "index.bin",
                              "table_bytes": len(table), "table_sha256": hashlib.sha256(table).hexdigest()}
    index = pipeline.load_index(index_file)
    assert [s.samples for s in index.shards] == [30, 30, 30, 10]
    for info in index.shards:
        with open(index_file.parent / info.url, "rb") as shard:
            records = list(iter_records(shard, info.url))
        assert list(info.offsets) == [r.offset for r in records]
        assert list(info.checksum) == [xxhash.xxh3_64_intdigest(r.members["msgpack"]) & 0xFFFFFFFF for r in records]
        assert info.sha256 == hashlib.sha256((index_file.parent / info.url).read_bytes()).hexdigest()


def table_of(shards: int, records: int, shard_bytes: int) -> ShardTable:
    rng = np.random.default_rng(0)
    infos = [ShardInfo(f"s-{i:03d}.tar", records * 2, records, shard_bytes, rng.bytes(32).hex(),
                       sorted(rng.integers(0, shard_bytes, records).tolist()),
                       rng.integers(0, 1 << 32, records).tolist()) for i in range(shards)]
    return ShardTable.from_infos(infos)


@pytest.mark.parametrize("shard_bytes, width", [(10_000, 4), (5 << 30, 8)])
def test_table_round_trips_with_4_or_8_byte_offsets(shard_bytes: int, width: int) -> None:
    table = table_of(5, 7, shard_bytes)
    out = io.BytesIO()
    size, sha = write_table(out, table)
    data = out.getvalue()
    assert size == len(data) == 64 + 5 * 56 + 5 * 7 * (width + 4) and sha == hashlib.sha256(data).hexdigest()
    for block_bytes in (8, 1 << 16):
        reread = read_table(lambda a, b: data[a:b], len(data), "t", table.names, block_bytes)
        assert [vars(s) | {"offsets": list(s.offsets), "checksum": list(s.checksum)} for s in reread] == \
               [vars(s) | {"offsets": list(s.offsets), "checksum": list(s.checksum)} for s in table]


def test_offsets_are_read_by_block_and_only_where_asked() -> None:
    values = np.arange(1000, dtype="<u4") * 3
    requests: list[tuple[int, int]] = []

    def read(start: int, stop: int) -> bytes:
        requests.append((start, stop))
        return values.tobytes()[start - 8:stop - 8]
    offsets = RangeColumn(read, 8, np.dtype("<u4"), len(values), block_bytes=64)  # 16 offsets a block
    assert offsets.read(10, 50).tolist() == values[10:50].tolist()
    assert requests == [(8, 72), (72, 136), (136, 200), (200, 264)]
    assert offsets.read(990, 1000).tolist() == values[990:].tolist()
    assert requests[4:] == [(8 + 61 * 64, 8 + 62 * 64), (8 + 62 * 64, 8 + 4000)]


def test_shard_names_compress_into_ranges_and_expand_back() -> None:
    names = ["a/t-000000.tar", "a/t-000001.tar", "b/t-000002.tar", "x.tar", "t-9.tar", "t-10.tar"]
    compact = ShardNames.of(names)
    assert compact.to_json() == ["a/t-{000000..000001}.tar", "b/t-000002.tar", "x.tar", "t-9.tar", "t-10.tar"]
    assert list(ShardNames.from_json(compact.to_json(), 6, "w")) == names
    million = ShardNames.of(f"train-{i:06d}.tar" for i in range(10**6))
    assert million.to_json() == ["train-{000000..999999}.tar"] and million[123456] == "train-123456.tar"
    with pytest.raises(IndexFormatError, match="braces are reserved"):
        ShardNames.of(["odd-{1}.tar"])


def test_missing_index_and_unknown_version_are_named(tmp_path: Path, index_file: Path) -> None:
    with pytest.raises(IndexFormatError, match=r"empty/index\.json: no such index file"):
        (tmp_path / "empty").mkdir()
        pipeline.load_index(tmp_path / "empty")
    edit(index_file, lambda d: d.update(version=1))
    with pytest.raises(IndexFormatError, match=re.escape(
            f"index version 1 is not supported (this library reads version 2): an earlier version of this library "
            f"wrote it: re-index the shards: pipeline index {index_file.parent} --overwrite (where that version's "
            f"shards are too old to read, as the first ones are, build the set again from its inputs")):
        pipeline.load_index(index_file)
    edit(index_file, lambda d: d.update(version=3))
    with pytest.raises(IndexFormatError, match="index version 3 is not supported .*: a later version of this library "
                                               "wrote it: read it with that version"):
        pipeline.load_index(index_file)


def test_a_table_that_does_not_match_its_index_is_refused(index_file: Path) -> None:
    table = index_file.with_name("index.bin")
    edit(index_file, lambda d: d.update(samples=99))
    with pytest.raises(IndexFormatError, match="says 99 samples, its shard table holds 100"):
        pipeline.load_index(index_file)
    edit(index_file, lambda d: d.update(samples=100))
    data = table.read_bytes()
    table.write_bytes(data[:-4])
    with pytest.raises(IndexFormatError, match=r"index\.bin: is \d+ bytes, the index says \d+ \(cut short or "
                                               r"replaced: copy it again with index\.json, or re-index the shards: "
                                               r"pipeline index \S+ --overwrite\)$"):
        pipeline.load_index(index_file)
    edit(index_file, lambda d: d["shards"].update(table_bytes=len(data) - 4))
    with pytest.raises(IndexFormatError, match=r"index\.bin: is \d+ bytes, its header implies \d+"):
        pipeline.load_index(index_file)
    table.unlink()
    with pytest.raises(IndexFormatError, match=r"index\.bin: no such shard table"):
        pipeline.load_index(index_file)
    edit(index_file, lambda d: d["shards"].update(table="../elsewhere.bin"))
    with pytest.raises(IndexFormatError, match="must lie beside the index"):
        pipeline.load_index(index_file)


def test_verify_checks_the_table_checksum(index_file: Path) -> None:
    table = index_file.with_name("index.bin")
    data = bytearray(table.read_bytes())
    data[64 + 4 * 24] ^= 1  # first byte of shard 0's sha256
    table.write_bytes(bytes(data))
    problems = [str(p) for p in pipeline.verify(index_file)]
    assert problems[0].startswith(f"{table}: sha256 ") and "the shard table is damaged" in problems[0]
    assert problems[1].startswith(f"{index_file.parent / 'shard-000000.tar'}: disagrees with the damaged shard "
                                  f"table: sha256 ")


def test_not_json_is_an_index_error(index_file: Path) -> None:
    index_file.write_text("{not json")
    with pytest.raises(IndexFormatError, match="cannot read index"):
        pipeline.load_index(index_file)


def test_merging_complete_indexes_is_refused(index_file: Path) -> None:
    with pytest.raises(IndexFormatError, match="partial indexes only"):
        merge_indexes([pipeline.load_index(index_file)])


def test_a_loaded_index_pickles_for_spawned_workers(index_file: Path) -> None:
    index = pipeline.load_index(index_file)
    assert len(index.shards[0].offsets) == 4  # opens the table file in this process
    copy = pickle.loads(pickle.dumps(index))
    assert [list(s.offsets) for s in copy.shards] == [list(s.offsets) for s in index.shards]
