"""``verify`` on a set whose ``index.json`` disagrees with its shard table or its shards' records:
an edited pack, sample total or shard count. Each is a problem naming ``index.json``, the field,
both values and what to do, by ``pipeline.verify`` and by ``pipeline verify`` (exit 1), never a
set verified that the loader then refuses in the middle of an epoch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import pipeline
from pipeline.cli import main
from pipeline.format.codec import encode_fields
from pipeline.format.errors import IndexFormatError, ShardError
from pipeline.format.index import DatasetIndex
from pipeline.format.packing import packed_fields
from pipeline.format.scan import scan_shard
from pipeline.storage.destination import destination
from pipeline.write.output import save_index
from tests.format.crafted import archive, member

FIX = "re-index the shards: pipeline index s --overwrite"
OTHER_BUILD = f"index.json and its shard table are of different builds, or one was edited: copy both again from the " \
              f"build that wrote them, or {FIX}"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def edit(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """``index.json`` of ``folder`` with ``change`` applied, as a user's editor would leave it."""
    path = folder / "index.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.fixture
def packed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three shards of 20 samples, 5 to a record (4 records each), built as ``s`` in the current
    folder (``tmp_path``), so that messages name the paths a user typed."""
    monkeypatch.chdir(tmp_path)
    pipeline.write_shards("s", {"x": np.arange(120, dtype=np.float32).reshape(60, 2)}, prefix="train",
                          shard_samples=20, pack=5, quiet=True)
    assert pipeline.verify("s") == []
    return Path("s")


def test_a_pack_that_gives_as_many_records_is_blamed_on_index_json_once(packed: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """20 samples are 4 records of 5 or of 6: the table's counts agree with either, so the index
    opens, and the loader refuses the first record it reads. The shards are intact: one problem,
    of index.json, not one per shard."""
    edit(packed, lambda d: d.update(pack=6))
    with pytest.raises(ShardError, match=r"record '\d+' holds 5 rows, the index says 6"):
        next(iter(pipeline.ShardDataset(packed)))
    told = ("s/index.json: says pack=6, but the records of s/train-000000.tar hold 5 rows each (pack=5), which the "
            f"loader refuses: copy index.json again from the build that wrote it, or {FIX}")
    assert [str(p) for p in pipeline.verify(packed)] == [told]
    shards = "".join(f"ok   s/train-00000{n}.tar\n" for n in range(3))
    result = "not verified s: its index.json disagrees with its shards\n"
    assert run(capsys, "verify", "s") == (1, f"FAIL {told}\n{shards}{result}", "")
    assert run(capsys, "verify", "s", "--quiet") == (1, f"FAIL {told}\n{result}", "")


@pytest.mark.parametrize(("change", "wrong"), [
    (lambda d: d["fields"]["x"].update(dtype="float64"), "field 'x' is float32[2], the index's schema says float64[2]"),
    (lambda d: d["fields"].update(z=d["fields"].pop("x")), "fields differ from the index's schema (missing ['z'], extra ['x'])"),
], ids=["dtype", "name"])
def test_an_edited_schema_is_blamed_on_index_json_not_on_the_shards(packed: Path, capsys: pytest.CaptureFixture[str],
                                                                     change: Callable[[dict[str, Any]], None],
                                                                     wrong: str) -> None:
    """Every record is as written (its checksum is the table's): the loader raises, under skip
    too (skipping would drop every sample), and says to mend index.json, not to copy the shards."""
    edit(packed, change)
    fix = f"copy index.json again from the build that wrote it, or {FIX}"
    as_written = ("the record is as written (its checksum is the shard table's), so index.json's schema is not the one "
                  "its shards were written with")
    for options in ({}, {"on_error": "skip"}, {"num_workers": 2, "on_error": "skip"}):
        with pytest.raises(IndexFormatError) as caught:
            next(iter(pipeline.make_loader(packed, batch_size=4, **{"num_workers": 0, **options})))
        loader_fix = fix.replace("pipeline index s", f"pipeline index {packed.resolve()}")  # (a loader's paths are
        assert str(caught.value).endswith(f"{wrong}; {as_written}: {loader_fix}"), options  # absolute: see shards.py)
    told = f"s/index.json: its schema does not describe the records of s/train-000000.tar (record '000000000000': {wrong}), " \
           f"which the loader refuses: {fix}"
    assert [str(p) for p in pipeline.verify(packed)] == [told]
    shards = "".join(f"ok   s/train-00000{n}.tar\n" for n in range(3))
    assert run(capsys, "verify", "s") == (1, f"FAIL {told}\n{shards}not verified s: its index.json disagrees with its "
                                             f"shards\n", "")
    code, _, err = run(capsys, "inspect", "s")
    assert code == 1 and err == f"error: s/train-000000.tar at byte 0: record '000000000000': {wrong}; {as_written}: {fix}\n"
    assert run(capsys, "index", "s", "--overwrite")[0] == 0  # the mend it names
    assert pipeline.verify(packed) == []


def test_a_pack_that_gives_other_record_counts_is_refused_when_opened(packed: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    edit(packed, lambda d: d.update(pack=4))
    told = (f"s/index.json: says pack=4, but shard train-000000.tar holds 4 records for 20 samples (pack 5?): "
            f"{OTHER_BUILD}")
    with pytest.raises(IndexFormatError) as caught:
        pipeline.verify(packed)
    assert str(caught.value) == told
    assert run(capsys, "verify", "s") == (1, "", f"error: {told}\n")


@pytest.mark.parametrize("field", ["samples", "records", "bytes"])
def test_a_total_that_is_not_the_tables_is_refused_when_opened(packed: Path, capsys: pytest.CaptureFixture[str],
                                                               field: str) -> None:
    """What inspect would print and what the loader counts an epoch by must be the table's."""
    right = json.loads((packed / "index.json").read_text())[field]
    edit(packed, lambda d: d.update({field: right + 1}))
    told = f"s/index.json: says {right + 1} {field}, its shard table holds {right}: {OTHER_BUILD}"
    with pytest.raises(IndexFormatError) as caught:
        pipeline.verify(packed)
    assert str(caught.value) == told
    assert run(capsys, "verify", "s") == (1, "", f"error: {told}\n")
    assert run(capsys, "inspect", "s") == (1, "", f"error: {told}\n")


@pytest.mark.parametrize(("change", "told"), [
    (lambda d: d["shards"].update(count=2), "s/index.json: 3 shard names for 2 shards"),
    (lambda d: d["shards"].update(count=4), "s/index.json: 3 shard names for 4 shards"),
    (lambda d: d["shards"].update(count=2, names=["train-{000000..000001}.tar"]),
     "s/index.bin: holds 3 shards, the index names 2"),
])
def test_a_shard_count_that_is_not_the_tables_is_refused_when_opened(packed: Path, capsys: pytest.CaptureFixture[str],
                                                                     change: Callable[[dict[str, Any]], None],
                                                                     told: str) -> None:
    edit(packed, change)
    with pytest.raises(IndexFormatError) as caught:
        pipeline.verify(packed)
    assert str(caught.value) == told
    assert run(capsys, "verify", "s") == (1, "", f"error: {told}\n")


def test_a_shard_whose_records_follow_no_pack_is_the_shards_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Records of 2, 1 and 2 rows: as many records as 5 samples packed 2 to a record give, so the
    index opens; the second record is what the loader refuses, and what verify names."""
    monkeypatch.chdir(tmp_path)
    Path("s").mkdir()
    rows = {"000000": 2, "000002": 1, "000003": 2}
    shard = Path("s/train-000000.tar")
    shard.write_bytes(archive(*(member(f"{key}.msgpack".encode(),
                                       encode_fields(packed_fields({"x": np.zeros((n, 2), np.float32)}, n, None), key))
                                for key, n in rows.items())))
    info, schema, _ = scan_shard(shard.read_bytes(), shard.name)
    save_index(destination("s"), DatasetIndex(schema, [info], pack=2))
    reason = "record '000002' holds 1 rows, the index says 2"
    with pytest.raises(ShardError, match=reason):
        next(iter(pipeline.ShardDataset("s")))
    told = f"s/train-000000.tar record 1 (byte {int(info.offsets[1])}): {reason}"
    assert [str(p) for p in pipeline.verify("s")] == [told]
    assert run(capsys, "verify", "s") == (1, f"FAIL {told}\nnot verified s: 1 of 1 shards failed: copy them again from where they came from, or build the set again (--overwrite)\n", "")


def test_a_renamed_member_of_a_foreign_shard_is_named_with_its_record(tmp_path: Path) -> None:
    """A member renamed after indexing (``.txt`` to ``.dat``): its data, so its checksum, is
    unchanged, but the record's fields are not the index's; the shard's sha256 differs, and the
    problem says where, not only that."""
    def shard(renamed: bytes) -> bytes:
        return archive(member(b"0000.cls", b"1"), member(b"0000.txt", b"cat"),
                       member(b"0001.cls", b"2"), member(b"0001" + renamed, b"dog"))

    (tmp_path / "theirs.tar").write_bytes(shard(b".txt"))
    pipeline.index_shards(tmp_path / "theirs.tar", quiet=True)
    info = pipeline.load_index(tmp_path).shards[0]
    (tmp_path / "theirs.tar").write_bytes(shard(b".dat"))
    [problem] = pipeline.verify(tmp_path)
    assert (problem.record, problem.offset) == (1, int(info.offsets[1]))
    assert str(problem).startswith(f"{tmp_path / 'theirs.tar'} record 1 (byte {int(info.offsets[1])}): record '0001': ")
    assert "differs from the index's" in str(problem)


@pytest.mark.parametrize("change", [lambda d: d.update(pack=float("inf")),
                                    lambda d: d["shards"].update(table_bytes=float("inf")),
                                    lambda d: d["shards"].update(count=float("-inf"))])
def test_infinity_in_index_json_is_a_malformed_index(packed: Path, capsys: pytest.CaptureFixture[str],
                                                     change: Callable[[dict[str, Any]], None]) -> None:
    """JSON's Infinity made a bare OverflowError (a traceback from verify), where NaN or a string
    there is a malformed index naming the file."""
    edit(packed, change)
    told = "error: s/index.json: malformed index: cannot convert float infinity to integer\n"
    assert run(capsys, "verify", "s") == (1, "", told)
    with pytest.raises(IndexFormatError, match="s/index.json: malformed index"):
        pipeline.make_loader("s", num_workers=0)


def test_an_index_nested_too_deeply_or_packing_2_31_samples_a_record_is_a_malformed_index(
        packed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A RecursionError (a traceback from inspect and verify), and an OverflowError from the
    epoch plan's int32 row counts, named no file."""
    index = packed / "index.json"
    sound = index.read_text()
    index.write_text("[" * 200_000 + "]" * 200_000)
    assert run(capsys, "verify", "s") == (1, "", "error: s/index.json: not an index: JSON nested too deeply\n")
    index.write_text(sound)
    edit(packed, lambda d: d.update(pack=1 << 31))
    with pytest.raises(IndexFormatError, match=r"s/index.json: pack=2147483648, not a number of samples a record"):
        pipeline.make_loader("s", num_workers=0)
