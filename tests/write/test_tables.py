"""Builds from Parquet tables: every row arrives exactly, as the arrays, strings and bytes it
held, or a clear error naming the file, the column and the row (Arrow IPC and ``datasets``
folders: ``test_arrow_tables.py``)."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather
import pyarrow.parquet as pq
import pytest

import pipeline
from pipeline import SampleError
from pipeline.cli import main as cli_main
from pipeline.write.run import chunk_rows_for
from pipeline.write.sources.tables import ParquetSource
from tests.helpers import index_content, read_back

ROOT = Path(__file__).resolve().parents[2]
DIM = 768


def embeddings(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, DIM), dtype=np.float32), rng.integers(0, 10, rows)


def fixed_list(x: np.ndarray) -> pa.FixedSizeListArray:
    """Rows of ``x`` (2-D or more) as nested fixed-size lists."""
    values: pa.Array = pa.array(x.ravel())
    for size in reversed(x.shape[1:]):
        values = pa.FixedSizeListArray.from_arrays(values, size)
    return values


def mixed_table(rows: int) -> pa.Table:
    """A column of every supported kind."""
    rng = np.random.default_rng(1)
    return pa.table({
        "x": fixed_list(rng.standard_normal((rows, 4)).astype(np.float32)),
        "grid": fixed_list(np.arange(rows * 6, dtype=np.int16).reshape(rows, 2, 3)),
        "y": pa.array(np.arange(rows, dtype=np.int64)),
        "score": pa.array(rng.random(rows)),
        "flag": pa.array(np.arange(rows) % 3 == 0),
        "name": pa.array([f"row {i} é" for i in range(rows)]),
        "blob": pa.array([bytes([i % 256]) * (i % 7) for i in range(rows)], pa.binary()),
        "ragged": pa.array([list(range(i % 5)) for i in range(rows)], pa.list_(pa.float32())),
        "when": pa.array(np.arange(rows, dtype=np.int64) * 1000, pa.timestamp("ms")),
        "day": pa.array(np.arange(rows, dtype=np.int32), pa.date32()),
    })


def check_mixed(folder: Path, table: pa.Table) -> None:
    keys, fields = read_back(folder)
    assert len(keys) == table.num_rows and list(fields) == table.column_names
    rows = table.num_rows
    x = np.stack(fields["x"])
    assert x.dtype == np.float32 and x.tobytes() == table["x"].combine_chunks().flatten().to_numpy().tobytes()
    np.testing.assert_array_equal(np.stack(fields["grid"]), np.arange(rows * 6, dtype=np.int16).reshape(rows, 2, 3))
    assert [int(v) for v in fields["y"]] == list(range(rows))
    assert np.array(fields["score"]).tobytes() == table["score"].to_numpy().tobytes()
    assert [bool(v) for v in fields["flag"]] == (np.arange(rows) % 3 == 0).tolist()
    assert fields["name"] == table["name"].to_pylist() and fields["blob"] == table["blob"].to_pylist()
    assert [v.tolist() for v in fields["ragged"]] == table["ragged"].to_pylist()
    assert all(v.dtype == np.float32 for v in fields["ragged"])
    assert [int(v) for v in fields["when"]] == [i * 1000 for i in range(rows)]  # int64 milliseconds
    assert [int(v) for v in fields["day"]] == list(range(rows))  # days since 1970-01-01


def test_every_column_kind_of_a_parquet_file_with_several_row_groups_arrives_exactly(tmp_path: Path) -> None:
    table = mixed_table(700)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=128)
    assert pq.ParquetFile(tmp_path / "t.parquet").metadata.num_row_groups == 6
    index = pipeline.build_parquet(tmp_path / "t.parquet", tmp_path / "out", shard_bytes=32 << 10, quiet=True)
    assert len(index.shards) > 3 and index.pack == 1  # strings and ragged lists: rows of different shapes
    assert index.fields["x"].shape == (4,) and index.fields["grid"].shape == (2, 3)
    assert index.fields["ragged"].shape == (None,) and index.fields["when"].dtype == "int64"
    check_mixed(tmp_path / "out", table)


def test_strings_and_bytes_beside_numbers_pack_several_samples_a_record(tmp_path: Path) -> None:
    """A text column made a table one sample a record (3,000 records, 5x the bytes of write_shards' set)."""
    table = mixed_table(2600).drop_columns(["ragged"])
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=700)
    index = pipeline.build_parquet(tmp_path / "t.parquet", tmp_path / "out", quiet=True)
    assert index.pack == 2600 // 512 and index.fields["name"].dtype == "str"  # 512 records at least
    keys, fields = read_back(tmp_path / "out")
    assert len(keys) == 2600 and fields["name"] == table["name"].to_pylist()
    assert fields["blob"] == table["blob"].to_pylist() and [int(v) for v in fields["y"]] == list(range(2600))


def test_a_file_larger_than_a_read_chunk_packs_embeddings_byte_exact(tmp_path: Path) -> None:
    x, y = embeddings(7000)
    pq.write_table(pa.table({"x": fixed_list(x), "y": y}), tmp_path / "e.parquet", row_group_size=2500)
    source = ParquetSource(tmp_path / "e.parquet")
    assert source.fixed_shape and os.path.getsize(tmp_path / "e.parquet") > chunk_rows_for(source, 1) * DIM * 4
    index = pipeline.build_parquet(tmp_path / "e.parquet", tmp_path / "out", shard_bytes=4 << 20, quiet=True)
    assert index.pack == 7000 // 512 and len(index.shards) == 6  # 21 MB: 512 records at least, of 13 samples
    _, fields = read_back(tmp_path / "out")
    assert np.stack(fields["x"]).tobytes() == x.tobytes()
    np.testing.assert_array_equal(np.array(fields["y"]), y)


def test_reads_in_any_order_across_batches_and_row_groups_give_the_rows_asked_for(tmp_path: Path) -> None:
    x, y = embeddings(6000, seed=4)
    pq.write_table(pa.table({"x": fixed_list(x), "y": y}), tmp_path / "e.parquet", row_group_size=2500)
    source = ParquetSource(tmp_path / "e.parquet")
    for start, stop in [(0, 1), (1300, 1400), (1400, 2600), (2600, 6000), (10, 20), (5999, 6000), (2499, 2501)]:
        block = source.read(start, stop)
        assert block.columns["x"].tobytes() == x[start:stop].tobytes(), (start, stop)
        np.testing.assert_array_equal(block.columns["y"], y[start:stop])
    window = source.window(2400, 2700)  # what a task carries: the paths and the two row groups it needs
    assert len(window) == 300 and len(window.units) == 2 and len(pickle.dumps(window)) < 2000
    assert pickle.loads(pickle.dumps(window)).read(90, 110).columns["x"].tobytes() == x[2490:2510].tobytes()


def test_nulls_are_an_error_naming_file_column_and_rows_until_a_fill_is_given(tmp_path: Path) -> None:
    y = pa.array([None if i in (3, 1500, 1502) else i for i in range(2000)], pa.int64())
    x = pa.FixedSizeListArray.from_arrays(pa.array(np.ones(6000, np.float32)), 3,
                                          mask=pa.array(np.arange(2000) == 7))
    pq.write_table(pa.table({"x": x, "y": y}), tmp_path / "n.parquet", row_group_size=1000)
    with pytest.raises(SampleError, match=re.escape(  # every column of nulls at once, not one a run
            f"{tmp_path / 'n.parquet'}: column 'x' has nulls, the first at row 7; column 'y' has 3 nulls, at rows 3, "
            f"... (counting from 0 in the file); fill them with --fill x=VALUE --fill y=VALUE (fill={{'x': VALUE, "
            f"'y': VALUE}} in Python), or leave the columns out with --columns")):
        pipeline.build_parquet(tmp_path / "n.parquet", tmp_path / "out", quiet=True)
    with pytest.raises(SampleError, match=r"n\.parquet: column 'y' has 3 nulls, at rows 3, \.\.\. \("):  # 2 later
        pipeline.build_parquet(tmp_path / "n.parquet", tmp_path / "out", columns=["y"], quiet=True)
    assert not (tmp_path / "out").exists()
    late = pa.array([None if i in (1500, 1502) else i for i in range(2000)], pa.int64())
    pq.write_table(pa.table({"y": late}), tmp_path / "late.parquet", row_group_size=1000, write_statistics=False)
    with pytest.raises(SampleError, match=r"late\.parquet: column 'y' has nulls, the first at rows 1500, 1502 \("):
        pipeline.build_parquet(tmp_path / "late.parquet", tmp_path / "out", quiet=True)  # found by the read
    assert not (tmp_path / "out" / "index.json").exists()
    pipeline.build_parquet(tmp_path / "n.parquet", tmp_path / "out", fill={"y": -1, "x": 0.5}, quiet=True)
    _, fields = read_back(tmp_path / "out")
    assert [int(fields["y"][i]) for i in (2, 3, 4, 1500, 1501)] == [2, -1, 4, -1, 1501]
    assert fields["x"][7].tolist() == [0.5] * 3 and fields["x"][8].tolist() == [1.0] * 3


def test_nulls_in_variable_length_lists_and_strings_are_found_and_filled(tmp_path: Path) -> None:
    ragged = pa.array([[1.0], [], None, [2.0, None], [3.0]], pa.list_(pa.float64()))
    names = pa.array(["a", None, "c", "d", "e"])
    pq.write_table(pa.table({"ragged": ragged, "name": names}), tmp_path / "r.parquet", row_group_size=2)
    with pytest.raises(SampleError, match=r"column 'ragged' has nulls, the first at rows 2, 3 "):
        pipeline.build_parquet(tmp_path / "r.parquet", tmp_path / "out", columns=["ragged"], quiet=True)
    with pytest.raises(SampleError, match=r"column 'name' has 1 null, at row 1 "):
        pipeline.build_parquet(tmp_path / "r.parquet", tmp_path / "out", fill={"ragged": 0}, quiet=True)
    pq.write_table(pa.table({"ragged": ragged, "name": names}), tmp_path / "one.parquet")  # one row group
    with pytest.raises(SampleError, match=r"column 'ragged' has nulls, the first at rows 2, 3; column 'name' has 1 "):
        pipeline.build_parquet(tmp_path / "one.parquet", tmp_path / "out", quiet=True)  # both at once
    far = pa.table({"a": pa.array([None] + list(range(1, 3000)), pa.int64()),
                    "x": pa.array([[1.0]] * 2999 + [None], pa.list_(pa.float64()))})
    pq.write_table(far, tmp_path / "far.parquet", row_group_size=1000)  # the list's null two row groups later
    with pytest.raises(SampleError, match=r"column 'a' has 1 null, at row 0; column 'x' has nulls, the first at row "
                                          r"2999 "):
        pipeline.build_parquet(tmp_path / "far.parquet", tmp_path / "out", quiet=True)
    pipeline.build_parquet(tmp_path / "r.parquet", tmp_path / "out", fill={"ragged": 0, "name": "?"}, quiet=True)
    _, fields = read_back(tmp_path / "out")
    assert [v.tolist() for v in fields["ragged"]] == [[1.0], [], [], [2.0, 0.0], [3.0]]
    assert fields["name"] == ["a", "?", "c", "d", "e"]


def test_a_null_list_filled_in_lists_of_any_length_says_how_to_fill_it_with_copies(tmp_path: Path, capsys) -> None:
    """pandas and ``datasets`` write arrays as lists of any length: a null filled there is an
    empty list, and the field's shape varies; the warning says to cast the column."""
    emb = pa.array([None if i == 5 else [float(i)] * 8 for i in range(20)], pa.list_(pa.float32()))
    pq.write_table(pa.table({"emb": emb}), tmp_path / "any.parquet")
    pq.write_table(pa.table({"emb": emb.cast(pa.list_(pa.float32(), 8))}), tmp_path / "eight.parquet")
    pipeline.build_parquet(tmp_path / "any.parquet", tmp_path / "any", fill={"emb": 0}, quiet=False)
    warned = capsys.readouterr().err
    assert "sample 5 has shape [0], the samples before it [8]" in warned and "(a null of a column of lists of any " \
        "length, as 'emb' is, is filled with an empty list: cast the column to lists of one length, " \
        "pyarrow.list_(type, length), to fill a null with that many copies of its fill)" in warned
    pipeline.build_parquet(tmp_path / "eight.parquet", tmp_path / "eight", fill={"emb": 0}, quiet=True)
    _, fields = read_back(tmp_path / "eight")
    assert [v.tolist() for v in fields["emb"]][4:7] == [[4.0] * 8, [0.0] * 8, [6.0] * 8]


def test_a_fill_that_the_column_cannot_hold_is_refused_when_the_source_opens(tmp_path: Path) -> None:
    pq.write_table(pa.table({"y": pa.array([1, None], pa.int8()), "s": ["a", None]}), tmp_path / "f.parquet")
    with pytest.raises(SampleError, match=r"fill value 0.5 of column 'y' is not a whole number; the column holds int8"):
        ParquetSource(tmp_path / "f.parquet", fill={"y": 0.5})
    with pytest.raises(SampleError, match=r"fill value 300 of column 'y' does not fit"):
        ParquetSource(tmp_path / "f.parquet", fill={"y": 300})
    with pytest.raises(SampleError, match=r"a fill is given for column 'z', which is not among the columns read: y, s"):
        ParquetSource(tmp_path / "f.parquet", fill={"z": 1})
    assert ParquetSource(tmp_path / "f.parquet", ["s"], fill={"s": 7}).read(0, 2).columns["s"] == ["a", "7"]
    # as the command line gives them: text, a number for a numeric column, the text as typed for a text one
    assert ParquetSource(tmp_path / "f.parquet", ["s"], fill={"s": "007"}).read(0, 2).columns["s"] == ["a", "007"]
    assert ParquetSource(tmp_path / "f.parquet", ["y"], fill={"y": "-1"}).fill["y"] == -1
    with pytest.raises(SampleError, match=r"fill value 'many' of column 'y' is not a number"):
        ParquetSource(tmp_path / "f.parquet", fill={"y": "many"})


def test_a_boolean_fill_reads_true_and_false_and_a_time_fill_is_told_its_unit(tmp_path: Path) -> None:
    """--fill ok=false was refused as 'not a number', told to 'give a value of that type'."""
    pq.write_table(pa.table({"ok": pa.array([True, None, False]), "when": pa.array([5, None, 7], pa.timestamp("us"))}),
                   tmp_path / "f.parquet")
    assert ParquetSource(tmp_path / "f.parquet", ["ok"], fill={"ok": "false"}).read(0, 3).columns["ok"].tolist() == \
        [True, False, False]
    assert ParquetSource(tmp_path / "f.parquet", ["ok"], fill={"ok": "True"}).fill["ok"] is True
    with pytest.raises(SampleError, match=re.escape("fill value 'yes' of column 'ok' is not a number; the column "
                                                    "holds bool: give true, false, 0 or 1")):
        ParquetSource(tmp_path / "f.parquet", ["ok"], fill={"ok": "yes"})
    with pytest.raises(SampleError, match=re.escape(
            "fill value '2020-01-01' of column 'when' is not a number; the column holds timestamp[us]: give a whole "
            "number of the column's unit (its values are stored so: a timestamp's since 1970)")):
        ParquetSource(tmp_path / "f.parquet", ["when"], fill={"when": "2020-01-01"})
    assert ParquetSource(tmp_path / "f.parquet", ["when"], fill={"when": "6"}).read(0, 3).columns["when"].tolist() == \
        [5, 6, 7]


def test_a_fill_that_would_be_stored_as_another_value_is_refused(tmp_path: Path) -> None:
    """A float too large for its column became inf; None on a text column the text 'None'."""
    pq.write_table(pa.table({"f": pa.array([1.0, None], pa.float32()), "h": pa.array([1.0, None], pa.float16()),
                             "s": ["a", None], "b": [b"a", None]}), tmp_path / "f.parquet")
    for column, value in (("f", 1e40), ("h", 70000.0)):
        with pytest.raises(SampleError, match=re.escape(f"fill value {value!r} of column {column!r} does not fit")):
            ParquetSource(tmp_path / "f.parquet", [column], fill={column: value})
    for column in ("s", "b"):
        with pytest.raises(SampleError, match=rf"fill value None of column '{column}' is no text, bytes or number"):
            ParquetSource(tmp_path / "f.parquet", [column], fill={column: None})
    assert ParquetSource(tmp_path / "f.parquet", ["f"], fill={"f": 2.5}).read(0, 2).columns["f"].tolist() == [1.0, 2.5]


def test_inputs_and_columns_given_in_another_form_say_which_to_give(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1, 2], "s": ["a", "b"]}), tmp_path / "c.parquet")
    with pytest.raises(TypeError, match=re.escape("columns= takes a list of column names, e.g. columns=['id']; got "
                                                  "'id'")):
        pipeline.build_parquet(tmp_path / "c.parquet", tmp_path / "out", columns="id", quiet=True)
    with pytest.raises(TypeError, match=re.escape("inputs are the paths of Arrow IPC (.arrow, .feather) files or "
                                                  "folders, got a Table: save a datasets.Dataset")):
        pipeline.build_arrow(pa.table({"id": [1]}), tmp_path / "out", quiet=True)


def test_a_folder_of_files_is_read_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "parts").mkdir()
    for n in (2, 0, 1):
        pq.write_table(pa.table({"y": np.arange(n * 100, n * 100 + 100)}), tmp_path / "parts" / f"part-{n}.parquet")
    (tmp_path / "parts" / "notes.txt").write_text("not a table")
    pipeline.build_parquet(tmp_path / "parts", tmp_path / "out", quiet=True)
    _, fields = read_back(tmp_path / "out")
    assert [int(v) for v in fields["y"]] == list(range(300))
    with pytest.raises(SampleError, match=r"part-0\.parquet is given twice"):
        ParquetSource([tmp_path / "parts", tmp_path / "parts" / "part-0.parquet"])
    with pytest.raises(FileNotFoundError, match=r"out: no Parquet \(\.parquet\) files in this folder"):
        ParquetSource(tmp_path / "out")


def test_a_file_that_is_not_readable_parquet_is_an_error_naming_it(tmp_path: Path, capsys) -> None:
    (tmp_path / "parts").mkdir()
    for n in (0, 2):
        pq.write_table(pa.table({"y": np.arange(10)}), tmp_path / "parts" / f"part-{n}.parquet")
    bad = tmp_path / "parts" / "part-1.parquet"  # cut short: its first 6 bytes
    bad.write_bytes((tmp_path / "parts" / "part-0.parquet").read_bytes()[:6])
    assert cli_main(["build", "parquet", str(tmp_path / "parts"), str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (
        f"error: {bad}: not a readable Parquet file (Parquet file size is 6 bytes, smaller than the minimum file "
        f"footer (8 bytes)): replace it with a whole copy, or leave it out of the inputs\n")
    assert not (tmp_path / "out" / "index.json").exists()
    corrupt = tmp_path / "corrupt.parquet"  # its footer reads, its pages do not decode
    pq.write_table(pa.table({"y": np.arange(1000)}), corrupt, row_group_size=100, compression="snappy")
    data = bytearray(corrupt.read_bytes())
    data[100:400] = b"\xff" * 300
    corrupt.write_bytes(bytes(data))
    with pytest.raises(SampleError, match=rf"^{re.escape(str(corrupt))}: not a readable Parquet file \(.+\): "
                                          r"replace it with a whole copy, or leave it out of the inputs$"):
        pipeline.build_parquet(corrupt, tmp_path / "corrupt-out", quiet=True)


@pytest.mark.parametrize("command, kind, convert", [
    ("parquet", "Parquet", "pyarrow.parquet.write_table(pyarrow.csv.read_csv(path), 'table.parquet')"),
    ("arrow", "Arrow IPC", "pyarrow.feather.write_feather(pyarrow.csv.read_csv(path), 'table.arrow')")])
def test_a_csv_file_is_told_to_be_converted_not_to_be_copied_again(tmp_path: Path, capsys, command: str, kind: str,
                                                                   convert: str) -> None:
    csv = tmp_path / "table.csv"
    csv.write_text("x,y\n1,2\n")
    assert cli_main(["build", command, str(csv), str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (
        f"error: {csv}: not in {kind} format (it starts with b'x,y\\n1,2\\n'): convert it first (a CSV file: "
        f"{convert}), or leave it out of the inputs\n")
    assert not (tmp_path / "out").exists()


def test_a_table_of_the_other_format_is_told_which_command_builds_it(tmp_path: Path, capsys) -> None:
    """A Parquet file given to build arrow was told to be converted 'a CSV file: ...'."""
    table = pa.table({"y": [1, 2]})
    pq.write_table(table, tmp_path / "t.parquet")
    pyarrow.feather.write_feather(table, tmp_path / "t.arrow")
    assert cli_main(["build", "arrow", str(tmp_path / "t.parquet"), str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (f"error: {tmp_path / 't.parquet'}: a file in Parquet format, not Arrow IPC: "
                                       f"build it with 'pipeline build parquet' (pipeline.build_parquet in Python)\n")
    assert cli_main(["build", "parquet", str(tmp_path / "t.arrow"), str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (f"error: {tmp_path / 't.arrow'}: a file in Arrow IPC format, not Parquet: "
                                       f"build it with 'pipeline build arrow' (pipeline.build_arrow in Python)\n")
    assert not (tmp_path / "out").exists()


def test_a_file_of_no_rows_builds_an_empty_set_and_the_build_warns(tmp_path: Path, capsys) -> None:
    empty, out = tmp_path / "empty.parquet", tmp_path / "out"
    pq.write_table(pa.table({"y": pa.array([], pa.int64())}), empty)
    assert cli_main(["build", "parquet", str(empty), str(out)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (f"warning: wrote 0 samples (parquet {empty} -> {out}): the set is empty, and a loader "
                        f"reading it yields nothing; is the input empty?")
    assert len(lines) == 2 and lines[1].startswith("wrote 0 samples in 0 shards, 0.0 MB, in ")
    assert pipeline.load_index(out).samples == 0


def test_files_with_different_schemas_are_refused_naming_both_files_and_the_column(tmp_path: Path) -> None:
    pq.write_table(pa.table({"x": [1.0, 2.0], "y": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": [1, 2], "y": [1, 2]}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"y": [1, 2]}), tmp_path / "c.parquet")
    pq.write_table(pa.table({"x": [1.0], "y": [1], "z": [0]}), tmp_path / "d.parquet")
    a = tmp_path / "a.parquet"
    with pytest.raises(SampleError, match=r"column 'x' is int64 in .*b\.parquet but double in .*a\.parquet"):
        ParquetSource([a, tmp_path / "b.parquet"])
    with pytest.raises(SampleError, match=r"c\.parquet has no column 'x', which .*a\.parquet has"):
        ParquetSource([a, tmp_path / "c.parquet"])
    with pytest.raises(SampleError, match=r"d\.parquet has column 'z', which .*a\.parquet has not"):
        ParquetSource([a, tmp_path / "d.parquet"])
    assert len(ParquetSource([a, tmp_path / "b.parquet", tmp_path / "d.parquet"], columns=["y"])) == 5
    # what changes nothing in the shards does not count: 64-bit offsets, the name of list items
    pq.write_table(pa.table({"s": pa.array(["a"]), "l": pa.array([[1]])}), tmp_path / "e.parquet")
    large = pa.schema([("s", pa.large_string()), ("l", pa.large_list(pa.field("element", pa.int64())))])
    pq.write_table(pa.table({"s": ["b"], "l": [[2, 3]]}, schema=large), tmp_path / "f.parquet")
    both = ParquetSource([tmp_path / "e.parquet", tmp_path / "f.parquet"]).read(0, 2).columns
    assert both["s"] == ["a", "b"] and [v.tolist() for v in both["l"]] == [[1], [2, 3]]


def test_columns_choose_the_fields_and_unknown_or_invalid_names_are_refused(tmp_path: Path, capsys) -> None:
    table = pa.table({"__index_level_0__": [5, 6], "a": [1, 2], "b": ["p", "q"], "s": pa.array([{"k": 1}] * 2)})
    pq.write_table(table, tmp_path / "t.parquet")
    assert cli_main(["build", "parquet", str(tmp_path / "t.parquet"), str(tmp_path / "out"),
                              "--columns", "b, a", "--quiet"]) == 0  # (spaces after commas: as typed)
    _, fields = read_back(tmp_path / "out")
    assert list(fields) == ["b", "a"] and fields["b"] == ["p", "q"]
    with pytest.raises(SampleError, match=r"t\.parquet has no column 'c'; its columns are: __index_level_0__, a, b, s"):
        ParquetSource(tmp_path / "t.parquet", columns=["a", "c"])
    with pytest.raises(SampleError, match=r"column '__index_level_0__' cannot be a field name \(names starting with "
                                          r"'__' are reserved.*\): rename it, or leave it out with --columns a,b,s"):
        ParquetSource(tmp_path / "t.parquet")
    with pytest.raises(SampleError, match=r"column 's' has type struct<k: int64>, which shards cannot store .* "
                                          r"leave it out with --columns \(columns=\[\.\.\.\] in Python\), or convert it "
                                          r"first$"):
        ParquetSource(tmp_path / "t.parquet", columns=["a", "s"])
    pd = pytest.importorskip("pandas")  # a category column, as pandas writes it: a dictionary
    pd.DataFrame({"c": pd.Categorical(["x", "y", "x"])}).to_parquet(tmp_path / "c.parquet")
    with pytest.raises(SampleError, match=re.escape("or convert it first: a dictionary column holds its values once "
                                                    "and a number a row; write the values (pandas: df['c'].astype(str), "
                                                    "or .cat.codes for the numbers; pyarrow: cast the column to "
                                                    "string)")):
        ParquetSource(tmp_path / "c.parquet")
    assert cli_main(["build", "parquet", str(tmp_path / "t.parquet"), str(tmp_path / "bad"),
                              "--columns", "a,zz"]) == 1
    assert "error: " in capsys.readouterr().err and not (tmp_path / "bad").exists()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "build", *args], capture_output=True, text=True,
                          cwd=ROOT)


def test_a_cli_build_with_validation_puts_every_row_in_exactly_one_split(tmp_path: Path) -> None:
    x, _ = embeddings(2000)
    y = pa.array([None if i == 10 else i for i in range(2000)], pa.int64())
    pq.write_table(pa.table({"x": fixed_list(x), "y": y}), tmp_path / "t.parquet", row_group_size=300)
    result = run_cli("parquet", str(tmp_path / "t.parquet"), str(tmp_path / "out"), "--validation", "0.1",
                     "--fill", "y=10", "--shard-bytes", "512KiB")
    assert result.returncode == 0, result.stderr
    seen = []
    for split, expected in (("train", 1800), ("validation", 200)):
        _, fields = read_back(tmp_path / "out" / split)
        assert len(fields["y"]) == expected
        for row, features in zip(fields["y"], fields["x"]):
            assert features.tobytes() == x[int(row)].tobytes()
            seen.append(int(row))
    assert sorted(seen) == list(range(2000))


def test_a_build_with_two_workers_is_byte_identical_to_one(tmp_path: Path) -> None:
    table = mixed_table(3000)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=700)
    with pa.ipc.new_stream(tmp_path / "t.arrows", table.schema) as writer:
        writer.write_table(table, max_chunksize=500)
    for layout, path in (("parquet", "t.parquet"), ("arrow", "t.arrows")):
        for workers in ("1", "2"):
            result = run_cli(layout, str(tmp_path / path), str(tmp_path / f"{layout}{workers}"), "--workers", workers,
                             "--shard-bytes", "64KiB", "--quiet")
            assert result.returncode == 0, result.stderr
        one, two = (pipeline.load_index(tmp_path / f"{layout}{n}") for n in "12")
        assert len(one.shards) > 8 and index_content(one) == index_content(two)
        for shard in one.shards:
            first, second = (tmp_path / f"{layout}{n}" / shard.url for n in "12")
            assert first.read_bytes() == second.read_bytes()


def test_without_pyarrow_a_build_says_which_extra_to_install(tmp_path: Path) -> None:
    pq.write_table(pa.table({"y": [1, 2]}), tmp_path / "t.parquet")
    block = "import sys; sys.modules['pyarrow'] = None; "  # as if pyarrow were not installed
    api = subprocess.run([sys.executable, "-c", block + "import pipeline; pipeline.build_parquet('t.parquet', 'o')"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert api.returncode == 1
    assert api.stderr.strip().endswith("ImportError: reading Parquet and Arrow files needs pyarrow: "
                                       "pip install 'pipeline[parquet]'")
    cli = subprocess.run([sys.executable, "-c", block + "from pipeline.cli import main; "
                          "sys.exit(main(['build', 'arrow', 't.parquet', 'o']))"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert cli.returncode == 1
    assert cli.stderr == "error: reading Parquet and Arrow files needs pyarrow: pip install 'pipeline[parquet]'\n"


def test_the_tables_benchmark_runs(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_tables.py"), "--quick", "--tmp",
                             str(tmp_path), "--out", str(tmp_path / "results")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    cases = {c["case"]: c for c in json.loads((tmp_path / "results" / "bench_tables.json").read_text())["cases"]}
    assert {"pyarrow read", "build", "build workers=2", "big: build"} <= set(cases)
    assert cases["build"]["rows"] == 3000 and "| build |" in result.stdout


def test_columns_given_where_the_prefix_goes_are_named_as_such(tmp_path: Path) -> None:
    """``build_parquet(inputs, out, ["x", "y"])`` made the list the shards' prefix, and crashed."""
    pq.write_table(pa.table({"x": [1.0] * 20, "y": list(range(20))}), tmp_path / "t.parquet")
    with pytest.raises(TypeError, match=r"prefix must be a str \(the shards' name before -000000\.tar\), got "
                                        r"\['x', 'y'\]: give the options after it by name \(columns=\.\.\."):
        pipeline.build_parquet(tmp_path / "t.parquet", tmp_path / "out", ["x", "y"])
    assert not (tmp_path / "out").exists()


def test_a_dataset_partitioned_into_folders_is_pointed_at_its_files(tmp_path: Path) -> None:
    pq.write_to_dataset(pa.table({"x": [1, 2, 3], "year": [2020, 2021, 2021]}), tmp_path / "data",
                        partition_cols=["year"], basename_template="part-{i}.parquet")
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"{tmp_path / 'data'}: no Parquet (.parquet) files in this folder; its subfolders hold 2 "
            f"({tmp_path / 'data' / 'year=2020' / 'part-0.parquet'}, ...), a partitioned dataset?: give the files "
            f"themselves; a value in a folder's name (year=2020) is in no file, so it is not built")):
        pipeline.build_parquet(tmp_path / "data", tmp_path / "out", quiet=True)
    files = sorted((tmp_path / "data").glob("*/*.parquet"))
    pipeline.build_parquet(files, tmp_path / "out", quiet=True)
    assert read_back(tmp_path / "out")[1] == {"x": [1, 2, 3]}


def test_files_in_a_folders_subfolders_are_named_in_a_warning_and_writers_own_files_are_skipped(tmp_path: Path) -> None:
    """Spark's output: part files at the top, a partition below, ``_SUCCESS``, a hidden file being written."""
    (tmp_path / "spark" / "year=2020").mkdir(parents=True)
    pq.write_table(pa.table({"y": np.arange(10)}), tmp_path / "spark" / "part-0.parquet")
    pq.write_table(pa.table({"y": np.arange(10, 20)}), tmp_path / "spark" / "year=2020" / "part-0.parquet")
    (tmp_path / "spark" / "_SUCCESS").write_bytes(b"")
    (tmp_path / "spark" / ".part-1.parquet").write_bytes(b"PAR1 half written")
    (tmp_path / "spark" / "_metadata.parquet").write_bytes(b"not rows")
    with pytest.warns(UserWarning, match=re.escape(
            f"{tmp_path / 'spark'}: 1 Parquet (.parquet) file(s) are read in it, not the 1 in its subfolders "
            f"({tmp_path / 'spark' / 'year=2020' / 'part-0.parquet'}, ...): give those too")):
        pipeline.build_parquet(tmp_path / "spark", tmp_path / "out", quiet=True)
    assert [int(v) for v in read_back(tmp_path / "out")[1]["y"]] == list(range(10))


def test_files_whose_column_types_differ_are_told_how_to_make_them_alike(tmp_path: Path) -> None:
    """pandas writes an int column with a gap as double: a casting option cannot help (it casts
    what is read), so the message says what does."""
    pq.write_table(pa.table({"y": pa.array([1, 2], pa.int64())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"y": pa.array([1.0, 3.0], pa.float64())}), tmp_path / "b.parquet")
    with pytest.raises(SampleError, match=re.escape(
            f"column 'y' is double in {tmp_path / 'b.parquet'} but int64 in {tmp_path / 'a.parquet'}; every file "
            f"needs the same column types (--dtype casts what is read, after this check): write the files again "
            f"with one type (pandas: df['y'].astype(...); pyarrow: table.cast(schema))")):
        pipeline.build_parquet(tmp_path, tmp_path / "out", dtypes={"y": "float64"}, quiet=True)
