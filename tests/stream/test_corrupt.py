"""The loader on damaged shards, with and without an index: an error naming the shard and byte,
or under ``on_error="skip"`` samples left out and counted; never a wrong sample.

Every sample holds ``i`` and ``x = [i, i, i]``, so a sample that is delivered wrong shows.
(test_dataset.py covers a lost shard and an undecodable record; this file covers cuts, records
that disagree with the index, and foreign shards.)
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline
from pipeline import ShardDataset, ShardError, SourceError
from pipeline.format.records import iter_records
from pipeline.format.tar import BLOCK
from pipeline.stream.reader import read_rows
from tests.format.crafted import FUZZ

DAMAGED = "part-000001.tar"


def build(folder: Path, samples: list[int], pack: int = 1, shape: tuple[int, ...] = (3,)) -> Path:
    """Shards of the given sizes; sample ``i`` has ``x`` filled with ``i``."""
    with pipeline.ShardWriter(folder, "part", shard_samples=samples[0], pack=pack) as writer:
        for i in range(sum(samples)):
            writer.write({"i": i, "x": np.full(shape, i, np.float32)})
    return folder


def read_all(source, **kwargs) -> tuple[list[int], dict[str, int]]:
    """The ids of every sample delivered (checking each one's ``x``), and the loader's stats."""
    dataset = ShardDataset(source, batch_size=4, shuffle=False, **kwargs)
    ids: list[int] = []
    for batch in dataset:
        i = batch["i"].numpy()
        x = batch["x"].numpy().reshape(len(i), -1)
        assert (x == i[:, None]).all(), "a sample was delivered wrong"
        ids.extend(i.tolist())
    return ids, dataset.stats()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("corrupt") / "set", [6, 6])


@pytest.fixture
def shards(pristine: Path, tmp_path: Path) -> Path:
    """A copy of the set for one test to damage: shard 1 (samples 6..11) is the one damaged."""
    return Path(shutil.copytree(pristine, tmp_path / "set"))


def foreign(folder: Path) -> list[str]:
    """The shards of ``folder`` copied to a folder without the index: shards of another tool."""
    bare = folder.parent / "bare"
    bare.mkdir()
    return [shutil.copy(folder / f"part-00000{n}.tar", bare) for n in (0, 1)]


def test_a_shard_cut_at_every_block_boundary_and_inside_its_end_of_archive_blocks(shards: Path) -> None:
    """(A cut inside the first end-of-archive block left part of a block, read as a header cut
    short: the intact last record was lost.)"""
    shard = shards / DAMAGED
    whole = shard.read_bytes()
    urls = foreign(shards)
    inside = [len(whole) - 2 * BLOCK + 1, len(whole) - 2 * BLOCK + 100, len(whole) - BLOCK - 1, len(whole) - 1]
    for cut in [*range(0, len(whole), BLOCK), *inside]:
        shard.write_bytes(whole[:cut])
        Path(urls[1]).write_bytes(whole[:cut])
        if cut >= len(whole) - 2 * BLOCK:  # only end-of-archive blocks cut: the records are all there
            assert read_all(shards)[0] == list(range(12))
            assert read_all(shards, on_error="skip")[1]["replaced_samples"] == 0
        else:
            with pytest.raises(SourceError, match=rf"{DAMAGED} at byte {cut}: ends at byte {cut}"):
                read_all(shards)
            ids, stats = read_all(shards, on_error="skip")
            assert len(ids) == 12 and stats["replaced_samples"] > 0  # every rank still gets its batches
        if cut >= len(whole) - BLOCK:  # a cut in the last end-of-archive block: no sample lost
            assert read_all(urls)[0] == list(range(12))
            continue
        with pytest.raises(ShardError, match=rf"{DAMAGED} at byte \d+: (truncated|shard ends)"):
            read_all(urls)
        ids, stats = read_all(urls, on_error="skip")  # the records before the cut, then the end
        assert ids == list(range(len(ids))) and 6 <= len(ids) < 12 and stats["skipped_pieces"] == 1


def test_a_shard_cut_short_is_warned_of_once_and_every_piece_it_lost_is_counted(tmp_path: Path, caplog) -> None:
    shards = build(tmp_path / "set", [3000, 3000], shape=(16,))
    damaged = shards / DAMAGED
    os.truncate(damaged, damaged.stat().st_size // 3)
    caplog.set_level(logging.DEBUG, logger="pipeline.stream")
    ids, stats = read_all(shards, on_error="skip")
    skips = [r for r in caplog.records if r.getMessage().startswith("skipping ")]
    assert len(ids) == 6000 and stats["skipped_pieces"] == len(skips) > 10
    assert [r.levelno for r in skips] == [logging.WARNING] + [logging.DEBUG] * (len(skips) - 1)
    assert str(damaged) in skips[0].getMessage() and "later skips in this shard are logged at DEBUG level" in \
        skips[0].getMessage()


@pytest.fixture(scope="module")
def larger(tmp_path_factory) -> Path:
    """Two shards of 30 samples packed 4 to a record, and copies of them without the index."""
    folder = build(tmp_path_factory.mktemp("corrupt-large") / "set", [30, 30], pack=4, shape=(40,))
    foreign(folder)
    return folder


@settings(FUZZ, max_examples=25)
@given(st.data())
def test_a_larger_shard_cut_anywhere(larger: Path, data) -> None:
    shard, urls = larger / DAMAGED, [str(larger.parent / "bare" / f"part-00000{n}.tar") for n in (0, 1)]
    whole = shard.read_bytes()
    cut = data.draw(st.integers(0, len(whole) - 1), "cut")
    try:
        shard.write_bytes(whole[:cut])
        Path(urls[1]).write_bytes(whole[:cut])
        if cut >= len(whole) - 2 * BLOCK:  # only end-of-archive blocks cut: the records are all there
            assert read_all(larger)[0] == list(range(60))
        else:
            with pytest.raises(SourceError, match=rf"{DAMAGED} at byte \d+: ends at byte {cut}"):
                read_all(larger)
            ids, stats = read_all(larger, on_error="skip")
            assert len(ids) == 60 and stats["replaced_samples"] >= 1
        ids, stats = read_all(urls, on_error="skip")
        lost = cut < len(whole) - BLOCK  # else the cut is in the last end-of-archive block
        assert ids == list(range(len(ids))) and (len(ids) < 60) == lost and stats["skipped_pieces"] == lost
    finally:
        shard.write_bytes(whole)
        Path(urls[1]).write_bytes(whole)


def rewrite(shard: Path, record: int, old: bytes, new: bytes) -> int:
    """Replace ``old`` by ``new`` (same length) inside record ``record``; its byte offset."""
    data = bytearray(shard.read_bytes())
    offset = [r.offset for r in iter_records(io.BytesIO(bytes(data)), "s")][record]
    at = data.index(old, offset + BLOCK)
    data[at:at + len(old)] = new
    shard.write_bytes(bytes(data))
    return offset


@pytest.mark.parametrize("old, new", [
    (b"\xa1x", b"\xa1z"),  # a field renamed
    (b"<f4", b"<i4"),  # the same bytes as another dtype
    (struct.pack("<f", 8.0), struct.pack("<f", 9.0)),  # a value changed
])
def test_a_record_changed_since_it_was_indexed_is_an_error_or_skipped(shards: Path, old: bytes, new: bytes) -> None:
    offset = rewrite(shards / DAMAGED, 2, old, new)
    with pytest.raises(ShardError, match=rf"{DAMAGED} at byte {offset}: record '\d+' is corrupt: checksum [0-9a-f]{{8}}, "
                                         r"the index says [0-9a-f]{8}"):
        read_all(shards)
    ids, stats = read_all(shards, on_error="skip")
    assert len(ids) == 12 and 8 not in ids and stats["replaced_samples"] >= 1


def test_a_damaged_shard_says_what_to_do_and_skip_with_nothing_left_names_the_cause(shards: Path) -> None:
    offset = rewrite(shards / DAMAGED, 2, struct.pack("<f", 8.0), struct.pack("<f", 9.0))
    advice = (f": 'pipeline verify {shards}' lists every shard that fails; copy those again or build the set again, "
              f"or pass on_error='skip' to train past damaged records (stats() counts them)")
    with pytest.raises(ShardError) as told:
        read_all(shards)
    assert str(told.value).startswith(f"{shards / DAMAGED} at byte {offset}: record ")
    assert str(told.value).endswith(advice)
    for name in ("part-000000.tar", DAMAGED):  # every shard cut short: nothing can stand in
        with open(shards / name, "r+b") as shard:
            shard.truncate(1000)
    with pytest.raises(ShardError) as told:
        read_all(shards, on_error="skip")
    assert re.fullmatch(rf".*part-00000\d\.tar: every piece of every shard failed, so nothing can stand in for them "
                        rf"\(the last: .*part-00000\d\.tar at byte \d+: ends at byte 1000, expected data up to byte "
                        rf"\d+\){re.escape(advice.split(', or pass')[0])}", str(told.value)), str(told.value)  # (skip is on)


def test_a_shard_cut_only_in_its_end_of_archive_blocks_loses_nothing(shards: Path) -> None:
    """The blocks after the last record hold no data (a writer that stopped before them, a copy
    cut there): the last record, whole, was lost with them."""
    import tarfile

    data = (shards / DAMAGED).read_bytes()
    last = tarfile.open(shards / DAMAGED).getmembers()[-1]
    end = last.offset_data + -(-last.size // 512) * 512
    assert len(data) - end == 1024  # two zero blocks
    (shards / DAMAGED).write_bytes(data[:end])
    assert read_all(shards)[0] == list(range(12))
    (shards / DAMAGED).write_bytes(data[:end - 100])  # into the last record: that one is lost
    with pytest.raises(SourceError, match=rf"{DAMAGED} at byte {end - 100}: ends at byte {end - 100}, expected "
                                          rf"data up to byte {len(data)}: 'pipeline verify .*' lists every shard that "
                                          rf"fails; copy those again or build the set again, or pass on_error='skip' "
                                          rf"to train past damaged records"):
        read_all(shards)
    ids, stats = read_all(shards, on_error="skip")
    assert 11 not in ids and stats["skipped_pieces"] == 1


def test_check_records_false_trusts_the_shards(shards: Path) -> None:
    rewrite(shards / DAMAGED, 2, struct.pack("<f", 8.0) * 3, struct.pack("<f", 9.0) * 3)
    dataset = ShardDataset(shards, batch_size=12, shuffle=False, check_records=False)
    assert next(iter(dataset))["x"][8].tolist() == [9.0] * 3  # delivered as changed, unchecked


@settings(FUZZ, max_examples=40)
@given(st.data())
def test_a_bit_flipped_anywhere_is_an_error_or_a_counted_skip_never_a_wrong_sample(larger: Path, data) -> None:
    shard = larger / DAMAGED
    whole = shard.read_bytes()
    at = data.draw(st.integers(0, len(whole) - 2 * BLOCK - 1), "byte")
    flipped = bytearray(whole)
    flipped[at] ^= 1 << data.draw(st.integers(0, 7), "bit")
    try:
        shard.write_bytes(bytes(flipped))
        try:
            ids, _ = read_all(larger)  # read_all fails the test on a wrong sample
            failed = False
        except ShardError as exc:
            assert DAMAGED in str(exc) and "at byte" in str(exc)
            failed = True
        if not failed:  # a flip the format does not care about: tar padding, an unused header byte
            assert ids == list(range(60))
        ids, stats = read_all(larger, on_error="skip")
        assert len(ids) == 60 and (stats["skipped_pieces"] > 0) == failed
    finally:
        shard.write_bytes(whole)


def test_an_array_of_the_right_bytes_in_the_wrong_shape_is_an_error(tmp_path: Path) -> None:
    folder = build(tmp_path / "shaped", [3], shape=(2, 3))
    offset = rewrite(folder / "part-000000.tar", 1, struct.pack("<2Q", 2, 3), struct.pack("<2Q", 3, 2))
    with pytest.raises(ShardError, match=rf"at byte {offset}: record '\d+' is corrupt: checksum"):
        read_all(folder)


def test_an_index_whose_pack_disagrees_with_the_records_is_an_error(tmp_path: Path) -> None:
    folder = build(tmp_path / "packed", [8], pack=4)
    index = pipeline.load_index(folder)
    with pytest.raises(ShardError, match=r"part-000000\.tar at byte 0: record '\d+' holds 4 rows, the index says 2"):
        read_rows(str(folder / "part-000000.tar"), index.shards[0], 2, 0, 4)


def test_foreign_samples_that_lack_a_field_are_yielded_with_the_fill(tmp_path: Path) -> None:
    first = build(tmp_path / "a", [5])
    with pipeline.ShardWriter(tmp_path / "b", "part", shard_samples=5) as writer:
        for i in range(5, 10):
            writer.write({"i": i, "y": np.full(3, i, np.float32)})
    urls = [shutil.copy(first / "part-000000.tar", tmp_path / "a.tar"),
            shutil.copy(tmp_path / "b" / "part-000000.tar", tmp_path / "b.tar")]
    samples = {}
    for fill in (None, {"x": "none"}):
        for batch in ShardDataset(urls, batch_size=10, shuffle=False, fill=fill):
            samples = dict(zip(batch["i"].tolist(), batch["x"]))
        assert sorted(samples) == list(range(10))  # the fields of the first record: i, x
        assert all((samples[i] == i).all() for i in range(5))
        assert [samples[i] for i in range(5, 10)] == [None if fill is None else "none"] * 5


@pytest.mark.parametrize("shuffle", [False, True])
def test_samples_lost_with_whole_units_are_counted_once(tmp_path: Path, shuffle: bool) -> None:
    """The search for rows to stand in for a failed unit reads other blocks, failed ones too:
    those are counted by their own units, not again by the search."""
    folder = build(tmp_path / "set", [100] * 4, pack=8)
    for n in range(3):
        os.truncate(folder / f"part-00000{n}.tar", 0)
    dataset = ShardDataset(folder, batch_size=16, shuffle=shuffle, on_error="skip", shuffle_buffer=16)
    ids = [i for batch in dataset for i in batch["i"].tolist()]
    assert len(ids) == 400 and set(ids) == set(range(300, 400))
    assert dataset.stats()["replaced_samples"] == 300


@pytest.mark.parametrize("pack", [4, 16])
def test_an_index_json_whose_pack_disagrees_with_its_table_is_refused_when_loaded(tmp_path: Path, pack: int) -> None:
    """Read with another pack, the rows of a record ran past its end: a bare IndexError in the
    middle of an epoch, skipped or not."""
    import json

    folder = build(tmp_path / "set", [100, 100], pack=8)
    data = json.loads((folder / "index.json").read_text())
    data["pack"] = pack
    (folder / "index.json").write_text(json.dumps(data))
    with pytest.raises(pipeline.IndexFormatError, match=rf"index\.json: says pack={pack}, but shard part-000000\.tar "
                                                        rf"holds 13 records for 100 samples \(pack 8\?\)"):
        pipeline.load_index(folder)


def test_a_bit_flipped_anywhere_in_the_shard_table_is_blamed_on_the_table_not_on_a_shard(shards: Path) -> None:
    """The table says where each record starts and what its checksum is: a damaged one made
    sound shards look damaged (an error telling the user to mend them), and under skip, lose
    sound samples. A flip either changes nothing read, or is an error naming the table, with
    the command that writes it again, under either policy."""
    table = shards / "index.bin"
    whole = table.read_bytes()
    blamed = 0
    for at in range(len(whole)):
        flipped = bytearray(whole)
        flipped[at] ^= 0x10
        table.write_bytes(bytes(flipped))
        for policy in ("raise", "skip"):
            try:
                ids, stats = read_all(shards, on_error=policy)  # fails the test on a wrong sample
            except pipeline.IndexFormatError as exc:
                assert str(exc).startswith((f"{table}", f"{shards / 'index.json'}")), exc
                if "sha256" in str(exc):  # found by a read it failed: the shards are not blamed
                    assert str(exc).endswith(f"copy it again with index.json, or re-index the shards: pipeline "
                                             f"index {shards} --overwrite"), exc
                    blamed += 1
                continue
            assert ids == list(range(12)) and stats["skipped_pieces"] == 0, (at, policy)
    assert blamed >= 2 * 12 * 4  # each flip of a record's checksum, at least, under each policy


def test_a_local_shard_table_gone_while_workers_read_it_is_an_error_even_under_skip(tmp_path: Path) -> None:
    """Each worker opens the table again for the offsets of its own pieces: a table that cannot
    be read then fails every piece alike, which skip took for damage of each (training on
    stand-ins) rather than the error it is."""
    pipeline.write_shards(tmp_path, {"x": np.arange(60000, dtype=np.float32)}, shard_samples=100, pack=1, quiet=True)
    loader = pipeline.make_loader(tmp_path, num_workers=2, batch_size=100, on_error="skip")  # read the table's head
    (tmp_path / "index.bin").unlink()
    with pytest.raises(pipeline.IndexFormatError, match=rf"^{tmp_path / 'index.bin'} at byte \d+: cannot read shard "
                                                        r"table: No such file or directory"):
        for _ in loader:
            pass


@pytest.mark.parametrize("workers, on_error", [(0, "raise"), (2, "skip")])
def test_a_set_rebuilt_under_a_running_loader_is_told_so_not_blamed_on_its_table(tmp_path: Path, workers: int,
                                                                                 on_error: str) -> None:
    """The loader holds the index it opened; the new shards fail against it, and so does the new
    table on disk. Re-indexing, the advice for a damaged table, cannot help the running job."""
    def build(seed: int) -> None:
        rng = np.random.default_rng(seed)
        pipeline.write_shards(tmp_path, {"x": rng.random((2000, 16), dtype=np.float32)}, pack=1, shard_samples=400,
                              overwrite=True, quiet=True)

    build(0)
    loader = pipeline.make_loader(tmp_path, num_workers=workers, batch_size=64, on_error=on_error)
    assert sum(1 for _ in loader) == 32
    build(7)  # a sound set: pipeline.verify(tmp_path) == []
    assert pipeline.verify(tmp_path) == []
    with pytest.raises(pipeline.IndexFormatError) as told:
        for _ in loader:
            pass
    assert str(told.value).startswith(f"{tmp_path / 'index.json'} names another shard table than when this loader "
                                      f"opened it: the set was rebuilt or copied anew since, and its shards are not "
                                      f"the ones indexed then (")
    assert str(told.value).endswith("): start the job again, or make a new loader, to read the set as it is now")


@pytest.mark.parametrize("workers, on_error, shards", [(0, "raise", "removed"), (2, "skip", "removed"),
                                                       (0, "skip", "rewritten")])
def test_a_set_a_rebuild_is_replacing_under_a_running_loader_is_told_so(tmp_path: Path, workers: int,
                                                                        on_error: str, shards: str) -> None:
    """A rebuild (overwrite=True) removes the index and the shards under the names it writes as
    it begins: the loader blamed a missing shard ("restore it"), and under skip gave stand-ins
    for most of an epoch; or, the shards written anew before the index, failed every piece."""
    pipeline.write_shards(tmp_path, {"x": np.arange(2000)}, pack=1, shard_samples=400, quiet=True)
    loader = pipeline.make_loader(tmp_path, num_workers=workers, batch_size=64, on_error=on_error)
    (tmp_path / "index.json").unlink()
    for shard in tmp_path.glob("*.tar"):
        if shards == "removed":
            shard.unlink()
        else:
            shard.write_bytes(shard.read_bytes().replace(b"\x00\x00\x00\x00\x00\x00", b"\x01\x01\x01\x01\x01\x01"))
    with pytest.raises(pipeline.IndexFormatError) as told:
        for _ in loader:
            pass
    assert str(told.value).startswith(f"{tmp_path / 'index.json'} is gone since this loader opened it: the set is "
                                      f"being rebuilt, or was removed (")
    assert loader.stats()["replaced_samples"] == 0


def test_a_damaged_shard_without_an_index_says_what_to_do(shards: Path) -> None:
    """Through an index the error said what to do; without one it named the damage only."""
    urls = foreign(shards)
    data = bytearray(Path(urls[1]).read_bytes())
    data[2 * BLOCK + 3] ^= 0x40  # the name in the second record's tar header
    Path(urls[1]).write_bytes(data)
    with pytest.raises(ShardError) as caught:
        read_all(urls)
    assert str(caught.value) == (f"{urls[1]} at byte {2 * BLOCK}: bad tar header checksum (not a tar file, or "
                                 f"corrupt): copy the shard again from where it came from, or pass "
                                 f"on_error='skip' to train past damaged records (stats() counts them)")
