"""Damage costs what is damaged: several bad records in one read, damage after the last record,
damaged .npy headers and gzip-compressed shards, for shards read with and without an index."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline
from pipeline import ShardError
from pipeline.format.errors import SampleError
from pipeline.format.records import _load_npy
from pipeline.format.tar import iter_members
from pipeline.stream.reader import iter_foreign_rows, read_rows
from tests.format.crafted import FUZZ
from tests.write.test_indexing import webdataset_shards


@pytest.fixture
def indexed(tmp_path: Path) -> Path:
    webdataset_shards(tmp_path / "wds", [40])
    pipeline.index_shards(tmp_path / "wds", quiet=True)
    return tmp_path / "wds"


def npy_member(shard: Path, sample: int) -> tuple[int, int]:
    """Where the headers and where the data of sample ``sample``'s .npy member start in ``shard``."""
    data = shard.read_bytes()
    member = next(m for m in iter_members(data, str(shard)) if m.name == f"s{sample:06d}.npy")
    return member.offset, data.index(bytes(member.data), member.offset)


def flip(shard: Path, *positions: int) -> None:
    data = bytearray(shard.read_bytes())
    for at in positions:
        data[at] ^= 0x08
    shard.write_bytes(bytes(data))


def read_with_losses(folder: Path, start: int = 0, stop: int = 40) -> tuple[list[int], list[int]]:
    index = pipeline.load_index(folder)
    shard = index.shards[0]
    lost: list[int] = []
    columns = read_rows(str(folder / shard.url), shard, 1, start, stop, schema=index.fields,
                        on_lost=lambda exc, samples: lost.append(samples))
    return columns["cls"].tolist(), lost


def test_several_bad_records_in_one_read_cost_those_records(indexed: Path) -> None:
    shard = indexed / "w-000000.tar"
    flip(shard, npy_member(shard, 3)[1] + 130, npy_member(shard, 4)[1] + 130,  # their data
         npy_member(shard, 30)[0] + 20)  # a tar header: the structure breaks there
    for start, stop, damaged in ((0, 40, (3, 4, 30)), (4, 31, (4, 30))):  # this read starts and ends at them
        rows, lost = read_with_losses(indexed, start, stop)
        assert len(rows) == stop - start and lost == [1] * len(damaged)
        sound = [n for n in range(start, stop) if n not in damaged]
        assert [rows[n - start] for n in sound] == sound  # every sound record in its place
        assert {rows[n - start] for n in damaged} <= set(sound)  # stood in for by sound ones


@pytest.mark.parametrize("where", [5, 600])  # in the end-of-archive blocks
def test_damage_after_the_last_record_costs_no_sample(indexed: Path, where: int) -> None:
    shard = indexed / "w-000000.tar"
    members_end = max(m.end for m in iter_members(shard.read_bytes(), str(shard)))
    flip(shard, members_end + where)
    rows, lost = read_with_losses(indexed)
    assert rows == list(range(40)) and lost == []
    problems = pipeline.verify(indexed)
    assert len(problems) == 1 and problems[0].record is None  # the shard is damaged, no record of it


@settings(FUZZ, max_examples=300)
@given(st.data())
def test_a_damaged_npy_header_is_a_sample_error_never_another_exception(data) -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.arange(4, dtype=np.float32))
    member = bytearray(buffer.getvalue())
    at = data.draw(st.integers(0, 127), "byte")
    member[at] ^= 1 << data.draw(st.integers(0, 7), "bit")
    try:
        _load_npy(bytes(member))
    except SampleError:
        pass  # or it still reads as some array of those bytes


def gzipped(tmp_path: Path) -> Path:
    return Path(webdataset_shards(tmp_path / "gz", [30], suffix=".tar.gz")[0])


def foreign_rows(url: Path) -> list[int]:
    return [n for columns in iter_foreign_rows(str(url)) for n in columns["cls"]]


def test_a_cut_or_damaged_gzip_shard_is_an_error_naming_it(tmp_path: Path) -> None:
    shard = gzipped(tmp_path)
    whole = shard.read_bytes()
    assert foreign_rows(shard) == list(range(30))
    shard.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(ShardError, match=rf"{shard.name}: gzip-compressed shard is damaged or cut: Compressed file "
                                         r"ended before the end-of-stream marker"):
        foreign_rows(shard)
    crc = bytearray(whole)
    crc[-8] ^= 0xFF  # the CRC of the uncompressed data, checked at the end of the stream
    shard.write_bytes(bytes(crc))
    with pytest.raises(ShardError, match=rf"{shard.name}: gzip-compressed shard is damaged or cut: CRC check failed"):
        foreign_rows(shard)
    assert gzip.decompress(whole)[:2] != whole[:2]  # really compressed


def test_a_damaged_gzip_shard_under_the_skip_policy_costs_the_rest_of_it(tmp_path: Path) -> None:
    shard = gzipped(tmp_path)
    whole = shard.read_bytes()
    shard.write_bytes(whole[:len(whole) // 2])
    dataset = pipeline.ShardDataset([str(shard)], batch_size=8, shuffle=False, on_error="skip")
    seen = [n for batch in dataset for n in batch["cls"].tolist()]
    assert seen == list(range(len(seen))) and dataset.stats()["skipped_pieces"] == 1
