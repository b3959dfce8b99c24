"""Runs of records laid out alike, checked in bulk (:mod:`pipeline.format.fixed_runs`): the same
columns as walking the records one by one and, whatever byte is damaged, the same error, or under
the skip policy the same rows and the same losses."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline
from pipeline import ShardError
from pipeline.format.fixed_runs import RunLayouts
from pipeline.format.tar import BLOCK
from pipeline.storage.opener import map_range
from pipeline.stream.reader import read_rows
from tests.format.crafted import FUZZ

PER_SHARD = 10
IMAGE = (2, 48, 48)  # 18 KB of float32: a large sample, kept as views until a batch is gathered


def sample_x(i: np.ndarray) -> np.ndarray:
    return (i[:, None, None, None] * 1000 + np.arange(np.prod(IMAGE)).reshape(IMAGE)).astype(np.float32)


def build(folder: Path, samples: int = 2 * PER_SHARD, keys: list[str] | None = None) -> Path:
    """``pack=1`` shards of array fields only: ``x`` large, ``y`` a scalar, ``z`` a small row."""
    i = np.arange(samples)
    arrays = {"x": sample_x(i), "y": i.astype(np.int64), "z": np.stack([i, -i], 1).astype(np.int16)}
    pipeline.write_shards(folder, arrays, prefix="part", keys=keys, pack=1, shard_samples=PER_SHARD, quiet=True)
    return folder


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("fixed-runs") / "set")


@pytest.fixture
def shards(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "set"))


def read(folder: Path, shard: int, start: int, stop: int, layouts: RunLayouts | None, skip: bool = False,
         check_records: bool = True, offsets: list[int] | None = None, wanted: set[str] | None = None) -> Any:
    """What ``read_rows`` gives for rows ``[start, stop)`` (of an index whose shard has the
    record ``offsets`` given): columns as plain arrays, the error's text, and under ``skip`` the
    losses reported."""
    index = pipeline.load_index(folder)
    info, lost = index.shards[shard], []
    if offsets is not None:
        info.offsets = offsets
    try:
        columns = read_rows(str(folder / info.url), info, 1, start, stop, wanted,
                            lambda url, a, b, _: map_range(url, a, b), index.fields, check_records,
                            on_lost=(lambda exc, rows: lost.append((str(exc), rows))) if skip else None,
                            layouts=layouts)
    except ShardError as exc:
        return "error", str(exc)
    if columns is None:
        return "none", lost
    return {name: np.asarray(col).tolist() for name, col in columns.items()}, lost


def learnt(folder: Path) -> RunLayouts:
    layouts = RunLayouts()
    read(folder, 0, 0, 1, layouts)
    assert len(layouts.by_size) == 1
    return layouts


def test_every_run_read_in_bulk_is_what_walking_it_gives(pristine: Path) -> None:
    layouts = learnt(pristine)
    index = pipeline.load_index(pristine)
    for shard in (0, 1):
        info = index.shards[shard]
        view = map_range(str(pristine / info.url), 0, info.bytes)
        for start in range(PER_SHARD):
            for stop in range(start + 1, PER_SHARD + 1):
                a, b = int(info.offsets[start]), int(info.offsets[stop]) if stop < PER_SHARD else info.bytes
                starts = np.asarray(info.offsets[start:stop], np.int64) - a
                bulk = layouts.read(view[a:b], starts, np.asarray(info.checksum[start:stop]))
                assert bulk is not None, (shard, start, stop)  # the run is read in bulk, not walked
                walked = read(pristine, shard, start, stop, None)
                assert read(pristine, shard, start, stop, layouts) == walked
                for wanted in ({"y"}, {"x", "z"}):
                    part = read(pristine, shard, start, stop, layouts, wanted=wanted)
                    assert part == read(pristine, shard, start, stop, None, wanted=wanted)
                    assert part[0] == {name: walked[0][name] for name in wanted}
                assert {name: col.tolist() for name, col in bulk.items()} == walked[0]
                first = shard * PER_SHARD
                assert walked[0]["y"] == list(range(first + start, first + stop))
                assert np.array_equal(walked[0]["x"], sample_x(np.arange(first + start, first + stop)))


def test_large_fields_stay_views_of_the_bytes_read_and_small_ones_are_arrays(pristine: Path) -> None:
    index = pipeline.load_index(pristine)
    info = index.shards[0]
    columns = read_rows(str(pristine / info.url), info, 1, 2, 7, None, lambda url, a, b, _: map_range(url, a, b),
                        index.fields, layouts=learnt(pristine))
    assert isinstance(columns["x"], list) and len(columns["x"]) == 5 and not columns["x"][0].flags.writeable
    assert isinstance(columns["y"], np.ndarray) and columns["y"].tolist() == [2, 3, 4, 5, 6]
    assert columns["z"].tolist() == [[i, -i] for i in range(2, 7)]


@settings(FUZZ, max_examples=120)
@given(st.data())
def test_a_byte_changed_anywhere_reads_as_walking_says(shards: Path, data) -> None:
    """The bulk check takes nothing that the walk refuses, and refuses only by leaving it to the
    walk: the error, or under skip the rows and losses, are the walk's."""
    layouts = learnt(shards)
    info = pipeline.load_index(shards).shards[1]
    shard = shards / info.url
    whole = shard.read_bytes()
    records = st.integers(0, PER_SHARD - 1)
    at = data.draw(st.one_of(  # anywhere, or where the bytes a run shares or checks in bulk are
        st.integers(0, len(whole) - 2 * BLOCK - 1),
        st.builds(lambda r, o: int(info.offsets[r]) + o, records, st.integers(0, BLOCK + 120)),  # headers
        st.builds(lambda r, o: int(info.offsets[r + 1]) - o, records.filter(lambda r: r < PER_SHARD - 1),
                  st.integers(1, 700))), "byte")  # the small fields, the padding
    damaged = bytearray(whole)
    damaged[at] = data.draw(st.integers(0, 255).filter(lambda b: b != whole[at]), "value")
    start = data.draw(st.integers(0, PER_SHARD - 1), "start")
    stop = data.draw(st.integers(start + 1, PER_SHARD), "stop")
    try:
        shard.write_bytes(bytes(damaged))
        for skip in (False, True):
            for check_records in (True, False):
                assert (read(shards, 1, start, stop, layouts, skip, check_records)
                        == read(shards, 1, start, stop, None, skip, check_records))
    finally:  # the shards are the same between examples
        shard.write_bytes(whole)


def test_a_key_that_appears_twice_is_the_walks_error(shards: Path) -> None:
    """Record 4 given record 2's whole header: a sound header checksum, a key seen before."""
    index = pipeline.load_index(shards)
    info = index.shards[1]
    path = shards / info.url
    data = bytearray(path.read_bytes())
    two, four = int(info.offsets[2]), int(info.offsets[4])
    data[four:four + BLOCK] = data[two:two + BLOCK]
    path.write_bytes(bytes(data))
    walked = read(shards, 1, 0, PER_SHARD, None)
    assert walked[0] == "error" and "appears twice" in walked[1]
    assert read(shards, 1, 0, PER_SHARD, learnt(shards)) == walked


@pytest.mark.parametrize("byte", [b"7", b".", b"/", b"\0", b"\xd0"])
def test_a_key_rewritten_with_a_sound_header_checksum_reads_as_walking_says(shards: Path, byte: bytes) -> None:
    """A header made on purpose: a key byte changed and the checksum made to fit. Another digit
    is another key, a ``/`` a folder in it (both read the record, the walk only for ``/``); the
    others break the key's form or its text."""
    info = pipeline.load_index(shards).shards[1]
    path = shards / info.url
    data = bytearray(path.read_bytes())
    at = int(info.offsets[5])
    data[at + 3:at + 4] = byte
    data[at + 148:at + 156] = b" " * 8
    data[at + 148:at + 156] = b"%06o\0 " % sum(data[at:at + BLOCK])
    path.write_bytes(bytes(data))
    layouts = learnt(shards)
    for skip in (False, True):
        walked = read(shards, 1, 0, PER_SHARD, None, skip)
        assert read(shards, 1, 0, PER_SHARD, layouts, skip) == walked
        assert (walked[0] != "error" and not walked[1]) == (byte in b"7/")


@pytest.mark.parametrize("moved", [BLOCK, -BLOCK, 1])
def test_an_index_whose_offsets_disagree_is_the_walks_error(pristine: Path, moved: int) -> None:
    offsets = [int(o) for o in pipeline.load_index(pristine).shards[1].offsets]
    offsets[4] += moved
    layouts = learnt(pristine)
    for skip in (False, True):
        walked = read(pristine, 1, 2, 8, None, skip, offsets=offsets)
        assert walked[0] == "error" or walked[1]
        assert read(pristine, 1, 2, 8, layouts, skip, offsets=offsets) == walked


@pytest.mark.parametrize("keys", [[f"ключ-{i:02d}" for i in range(2 * PER_SHARD)],  # not ASCII
                                  [f"k{i}" for i in range(2 * PER_SHARD)]])  # of two lengths
def test_records_of_other_keys_are_walked(tmp_path: Path, keys: list[str]) -> None:
    folder = build(tmp_path / "set", keys=keys)
    layouts = RunLayouts()
    for shard in (0, 1):  # in the second, keys of "k10" on are longer than the first's
        for start in range(PER_SHARD):
            got = read(folder, shard, start, PER_SHARD, layouts)
            assert got == read(folder, shard, start, PER_SHARD, None)
            assert got[0]["y"] == list(range(shard * PER_SHARD + start, (shard + 1) * PER_SHARD))
    assert keys[0].isascii() == bool(layouts.by_size)  # ASCII keys are learnt, each length in its turn


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_delivers_every_sample_of_fixed_runs_once_and_intact(pristine: Path, workers: int) -> None:
    loader = pipeline.make_loader(pristine, batch_size=4, num_workers=workers, seed=3)
    seen = []
    for batch in loader:
        y = batch["y"].numpy()
        assert np.array_equal(batch["x"].numpy(), sample_x(y)) and batch["z"].numpy().tolist() == [[i, -i] for i in y]
        seen.extend(y.tolist())
    assert sorted(seen) == list(range(2 * PER_SHARD))
