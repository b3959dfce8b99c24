"""Runs of records laid out alike, checked in bulk (:mod:`pipeline.format.fixed_runs`), one
sample a record and packed: the same columns as walking the records one by one and, whatever byte
is damaged, the same error, or under the skip policy the same rows and the same losses."""

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
from pipeline.format import fixed_runs
from pipeline.format.fixed_runs import RunLayouts
from pipeline.format.tar import BLOCK
from pipeline.storage.opener import map_range
from pipeline.stream import reader
from pipeline.stream.reader import read_rows
from tests.format.crafted import FUZZ

PER_SHARD = 12
SAMPLES = 2 * PER_SHARD + 6  # a third shard of 6: packed by 4, a short last record
IMAGE = (2, 48, 48)  # 18 KB of float32: a large sample, kept as views until a batch is gathered


def sample_x(i: np.ndarray) -> np.ndarray:
    return (i[:, None, None, None] * 1000 + np.arange(np.prod(IMAGE)).reshape(IMAGE)).astype(np.float32)


def build(folder: Path, pack: int = 1, keys: list[str] | None = None) -> Path:
    """Shards of array fields only: ``x`` large, ``y`` a scalar, ``z`` a small row."""
    i = np.arange(SAMPLES)
    arrays = {"x": sample_x(i), "y": i.astype(np.int64), "z": np.stack([i, -i], 1).astype(np.int16)}
    pipeline.write_shards(folder, arrays, prefix="part", keys=keys, pack=pack, shard_samples=PER_SHARD, quiet=True)
    return folder


@pytest.fixture(scope="module", params=[1, 4], ids=["pack=1", "pack=4"])
def pristine(request, tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("fixed-runs") / "set", request.param)


@pytest.fixture
def shards(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "set"))


@pytest.fixture(params=["record by record", "with NumPy"])
def checked(request, monkeypatch) -> None:
    """Runs of any length checked as a few records are, or as many are: each check either way."""
    monkeypatch.setattr(fixed_runs, "FEW_RECORDS", SAMPLES if request.param == "record by record" else 0)


def read(folder: Path, shard: int, start: int, stop: int, layouts: RunLayouts | None, skip: bool = False,
         check_records: bool = True, entry: dict[str, Any] | None = None, wanted: set[str] | None = None) -> Any:
    """What ``read_rows`` gives for rows ``[start, stop)`` (of an index whose shard's ``entry``
    says otherwise, if given: other offsets, say): columns as plain arrays, the error's text, and
    under ``skip`` the losses reported."""
    index = pipeline.load_index(folder)
    info, lost = index.shards[shard], []
    for name, value in (entry or {}).items():
        setattr(info, name, value)
    try:
        columns = read_rows(str(folder / info.url), info, index.pack, start, stop, wanted,
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
    pack = index.pack
    for shard, samples in enumerate((PER_SHARD, PER_SHARD, SAMPLES - 2 * PER_SHARD)):
        info = index.shards[shard]
        view = map_range(str(pristine / info.url), 0, info.bytes)
        for start in range(samples):
            for stop in range(start + 1, samples + 1):
                first, last = start // pack, -(-stop // pack)
                if last * pack <= samples:  # records all full: a run of the layout learnt
                    a, b = int(info.offsets[first]), int(info.offsets[last]) if last < info.records else info.bytes
                    starts = np.asarray(info.offsets[first:last], np.int64) - a
                    assert layouts.read(view[a:b], starts, np.asarray(info.checksum[first:last])) is not None
                walked = read(pristine, shard, start, stop, None)
                assert read(pristine, shard, start, stop, layouts) == walked
                for wanted in ({"y"}, {"x", "z"}):
                    part = read(pristine, shard, start, stop, layouts, wanted=wanted)
                    assert part == read(pristine, shard, start, stop, None, wanted=wanted)
                    assert part[0] == {name: walked[0][name] for name in wanted}
                ids = np.arange(shard * PER_SHARD + start, shard * PER_SHARD + stop)
                assert walked[0]["y"] == ids.tolist() and np.array_equal(walked[0]["x"], sample_x(ids))


def test_large_fields_stay_views_of_the_bytes_read_and_small_ones_are_arrays(tmp_path: Path) -> None:
    folder = build(tmp_path / "set")
    index = pipeline.load_index(folder)
    info = index.shards[0]
    columns = read_rows(str(folder / info.url), info, 1, 2, 7, None, lambda url, a, b, _: map_range(url, a, b),
                        index.fields, layouts=learnt(folder))
    assert isinstance(columns["x"], list) and len(columns["x"]) == 5 and not columns["x"][0].flags.writeable
    assert isinstance(columns["y"], np.ndarray) and columns["y"].tolist() == [2, 3, 4, 5, 6]
    assert columns["z"].tolist() == [[i, -i] for i in range(2, 7)]


@settings(FUZZ, max_examples=120)
@given(st.data())
def test_a_byte_changed_anywhere_reads_as_walking_says(shards: Path, checked: None, data) -> None:
    """The bulk check takes nothing that the walk refuses, and refuses only by leaving it to the
    walk: the error, or under skip the rows and losses, are the walk's."""
    layouts = learnt(shards)
    number = data.draw(st.sampled_from([1, 2]), "shard")  # the last one is shorter, its last record too
    info = pipeline.load_index(shards).shards[number]
    shard = shards / info.url
    whole = shard.read_bytes()
    records = st.integers(0, info.records - 1)
    at = data.draw(st.one_of(  # anywhere, or where the bytes a run shares or checks in bulk are
        st.integers(0, len(whole) - 2 * BLOCK - 1),
        st.builds(lambda r, o: int(info.offsets[r]) + o, records, st.integers(0, BLOCK + 120)),  # headers
        st.builds(lambda r, o: int(info.offsets[r + 1]) - o, records.filter(lambda r: r < info.records - 1),
                  st.integers(1, 700))), "byte")  # the small fields, the padding
    damaged = bytearray(whole)
    damaged[at] = data.draw(st.integers(0, 255).filter(lambda b: b != whole[at]), "value")
    start = data.draw(st.integers(0, info.samples - 1), "start")
    stop = data.draw(st.integers(start + 1, info.samples), "stop")
    try:
        shard.write_bytes(bytes(damaged))
        for skip in (False, True):
            for check_records in (True, False):
                assert (read(shards, number, start, stop, layouts, skip, check_records)
                        == read(shards, number, start, stop, None, skip, check_records))
    finally:  # the shards are the same between examples
        shard.write_bytes(whole)


def test_a_key_that_appears_twice_is_the_walks_error(shards: Path, checked: None) -> None:
    """Record 2 given record 0's whole header: a sound header checksum, a key seen before."""
    index = pipeline.load_index(shards)
    info = index.shards[1]
    path = shards / info.url
    data = bytearray(path.read_bytes())
    zero, two = int(info.offsets[0]), int(info.offsets[2])
    data[two:two + BLOCK] = data[zero:zero + BLOCK]
    path.write_bytes(bytes(data))
    walked = read(shards, 1, 0, PER_SHARD, None)
    assert walked[0] == "error" and "appears twice" in walked[1]
    assert read(shards, 1, 0, PER_SHARD, learnt(shards)) == walked


@pytest.mark.parametrize("byte", [b"7", b".", b"/", b"\0", b"\xd0"])
def test_a_key_rewritten_with_a_sound_header_checksum_reads_as_walking_says(shards: Path, byte: bytes, checked: None) -> None:
    """A header made on purpose: a key byte changed and the checksum made to fit. Another digit
    is another key, a ``/`` a folder in it (both read the record, the walk only for ``/``); the
    others break the key's form or its text."""
    info = pipeline.load_index(shards).shards[1]
    path = shards / info.url
    data = bytearray(path.read_bytes())
    at = int(info.offsets[1])
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
def test_an_index_whose_offsets_disagree_is_the_walks_error(pristine: Path, moved: int, checked: None) -> None:
    offsets = [int(o) for o in pipeline.load_index(pristine).shards[1].offsets]
    offsets[1] += moved
    layouts = learnt(pristine)
    for skip in (False, True):
        walked = read(pristine, 1, 0, PER_SHARD, None, skip, entry={"offsets": offsets})
        assert walked[0] == "error" or walked[1]
        assert read(pristine, 1, 0, PER_SHARD, layouts, skip, entry={"offsets": offsets}) == walked


def test_an_index_that_counts_fewer_samples_is_the_walks_error(pristine: Path) -> None:
    """Packed by 4, the shard's last record then holds more rows than the index says."""
    layouts = learnt(pristine)
    for skip in (False, True):
        walked = read(pristine, 1, 8, PER_SHARD - 1, None, skip, entry={"samples": PER_SHARD - 1})
        assert (walked[0] == "error" or bool(walked[1])) == (pipeline.load_index(pristine).pack == 4)
        assert read(pristine, 1, 8, PER_SHARD - 1, layouts, skip, entry={"samples": PER_SHARD - 1}) == walked


@pytest.mark.parametrize("keys", [[f"ключ-{i:02d}" for i in range(SAMPLES)],  # not ASCII
                                  [f"k{i}" for i in range(SAMPLES)]])  # of two lengths
def test_records_of_other_keys_are_walked(tmp_path: Path, keys: list[str], checked: None) -> None:
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
    assert sorted(seen) == list(range(SAMPLES))


def walks_counted(monkeypatch) -> list[int]:
    """The numbers of the records ``read_rows`` walks one by one, as it walks them."""
    walked: list[int] = []
    walk = reader.walk_shard

    def counted(*args: Any, **kwargs: Any) -> Any:
        for record in walk(*args, **kwargs):
            walked.append(record.number)
            yield record

    monkeypatch.setattr(reader, "walk_shard", counted)
    return walked


def test_a_readers_first_range_walks_one_record_to_learn_from_and_checks_the_rest_in_bulk(
        pristine: Path, monkeypatch) -> None:
    """A reader that had learnt nothing walked the whole of its first range a record at a time,
    and learnt only as it began: a mix of 200 sets of 500 samples walked 11,000 records an epoch,
    one range of every set. It walks the first record, then reads the range as a run."""
    walked = walks_counted(monkeypatch)
    first_ranges = []
    for start in (0, 1):
        expected = read(pristine, 0, start, PER_SHARD, None), read(pristine, 1, start, PER_SHARD, None)
        walked.clear()
        layouts = RunLayouts()
        assert read(pristine, 0, start, PER_SHARD, layouts) == expected[0]
        first_ranges.append(list(walked))
        walked.clear()
        assert read(pristine, 1, start, PER_SHARD, layouts) == expected[1]
        assert walked == []  # learnt: a run
    pack = pipeline.load_index(pristine).pack
    assert first_ranges == [[0], [1 // pack]]


def test_records_that_teach_no_layout_are_tried_once_then_walked_as_before(tmp_path: Path, monkeypatch) -> None:
    """Records with text have no layout to learn: the reader's first range walks its first record
    once more to learn from, and no later range does."""
    pipeline.write_shards(tmp_path / "text", {"y": np.arange(SAMPLES), "caption": [f"c{i}" for i in range(SAMPLES)]},
                          prefix="part", shard_samples=PER_SHARD, pack=1, quiet=True)
    walked = walks_counted(monkeypatch)
    layouts = RunLayouts()
    for start in (0, 3):
        walked.clear()
        got = read(tmp_path / "text", 0, start, PER_SHARD, layouts)
        assert got[0]["y"] == list(range(start, PER_SHARD))
        assert sorted(walked) == sorted([*range(start, PER_SHARD), *([0] if start == 0 else [])])
    assert not layouts.by_size
