"""Columns of strings beside arrays: file names, IDs, class names, as NumPy or pandas holds them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.format.errors import SampleError
from tests.helpers import read_back

ROWS = 3000
NAMES = np.array([f"é{i}" * (i % 5) for i in range(ROWS)])  # of several widths, the empty one among them


def samples_by_x(location: Path, fields: list[str]) -> dict[int, tuple]:
    """Every sample of a shard set, by its ``x``: the values of ``fields``, as the loader gives them."""
    got: dict[int, tuple] = {}
    for batch in pipeline.make_loader(location, batch_size=128, num_workers=2, drop_last=False):
        assert all(isinstance(batch[field], list) for field in fields)
        for row, x in enumerate(batch["x"].tolist()):
            assert int(x) not in got
            got[int(x)] = tuple(batch[field][row] for field in fields)
    return got


def test_string_columns_of_every_kind_are_written_as_their_values_in_splits_built_by_workers(tmp_path: Path) -> None:
    columns = {"x": np.arange(ROWS, dtype=np.float32), "name": NAMES,
               "raw": np.array([f"b{i}".encode() for i in range(ROWS)]),  # S: bytes
               "obj": np.array([f"o{i}" for i in range(ROWS)], dtype=object),  # a pandas column's .values
               "listed": [f"l{i}" for i in range(ROWS)]}
    pipeline.write_shards(tmp_path / "out", columns, validation=0.1, workers=2, shard_samples=500, quiet=True)
    fields = ["name", "raw", "obj", "listed"]
    train, validation = (samples_by_x(tmp_path / "out" / split, fields) for split in ("train", "validation"))
    assert (len(train), len(validation)) == (2700, 300) and not train.keys() & validation.keys()
    assert {**train, **validation} == {i: (NAMES[i], f"b{i}".encode(), f"o{i}", f"l{i}") for i in range(ROWS)}


@pytest.mark.parametrize("pack", ["1", "auto"])
def test_a_npy_file_of_strings_builds_from_the_command_line(tmp_path: Path, pack: str) -> None:
    np.save(tmp_path / "x.npy", np.arange(ROWS, dtype=np.float32))
    np.save(tmp_path / "names.npy", NAMES)
    build = subprocess.run([sys.executable, "-m", "pipeline", "build", "arrays", str(tmp_path / "out"), "--array",
                            f"x={tmp_path / 'x.npy'}", "--array", f"name={tmp_path / 'names.npy'}", "--pack", pack,
                            "--quiet"], capture_output=True, text=True)
    assert (build.returncode, build.stderr) == (0, "")
    assert pipeline.load_index(tmp_path / "out").pack == (1 if pack == "1" else ROWS // 512)
    assert samples_by_x(tmp_path / "out", ["name"]) == {i: (NAMES[i],) for i in range(ROWS)}


def pd_values_of_arrays() -> np.ndarray:
    """What ``frame["x"].values`` is for a Parquet column of lists read by pandas: arrays as objects."""
    column = np.empty(4, dtype=object)
    column[:] = [np.zeros(2), np.ones(2), np.zeros(2), np.ones(2)]
    return column


@pytest.mark.parametrize("column, told", [
    (np.array([["a", "b"]] * 4), "a 2-d array of strings or objects; give one string a row (a 1-d array), or join "
                                 "each row's strings into one"),
    (np.array(["a", None, "c", "d"], dtype=object), "row 1 is NoneType None, where a column of objects may hold only "
                                                     "str, or only bytes"),
    (["a", "b", 3, "d"], "row 2 is int 3, where a column of objects may hold only str, or only bytes"),  # not '3'
    (np.array([b"a", "b", b"c", b"d"], dtype=object), "row 1 is str 'b', where a column of objects may hold only "
                                                        "str, or only bytes"),
    (np.array([1.5, 2, 3, 4], dtype=object), "row 0 is float 1.5, where a column of objects may hold only str, or "
                                              "only bytes; give numbers as an array of numbers"),
    (np.array([b"a", "b", b"c", b"d"], dtype=object), "row 1 is str 'b', where a column of objects may hold only "
                                                        "str, or only bytes; make them all bytes (encode the str, or "
                                                        "decode the bytes)"),
    (pd_values_of_arrays(), "row 0 is ndarray array([0., 0.]), where a column of objects "
                                                         "may hold only str, or only bytes; give arrays of one shape as "
                                                         "one array (np.stack(values)), and arrays of several shapes "
                                                         "with pipeline.ShardWriter, a sample at a time"),
    (np.array(["2020-01-01"] * 4, dtype="datetime64[ms]"), "unsupported array dtype datetime64[ms] (supported: bool, "
                                                          "int8-64, uint8-64, float16/32/64); store times as numbers: "
                                                          "values.astype('int64') (ms since 1970)"),
])
def test_a_column_that_is_not_one_string_a_row_is_refused_naming_the_row(tmp_path: Path, column: object,
                                                                         told: str) -> None:
    with pytest.raises(SampleError, match=f"^field 'n' \\(in memory\\): {re.escape(told)}"):
        pipeline.write_shards(tmp_path / "out", {"x": np.arange(4), "n": column}, quiet=True)
    assert not (tmp_path / "out").exists()


def test_a_build_reads_long_texts_of_objects_in_chunks_of_their_size_not_of_their_pointers() -> None:
    """A pandas column of documents: reads sized by 8-byte pointers would take gigabytes at once."""
    from pipeline.write.run import _CHUNK_BYTES, chunk_rows_for
    from pipeline.write.sources.arrays import ArraySource

    texts = np.array(["word " * 2000] * 5000, dtype=object)  # 10 kB each
    source = ArraySource({"x": np.arange(5000, dtype=np.float32), "text": texts})
    assert _CHUNK_BYTES // 2 <= chunk_rows_for(source, 1) * 10_004 <= _CHUNK_BYTES


def test_inspect_shows_texts_with_their_spaces_and_arrays_on_one_line() -> None:
    """Shown values were split on whitespace and joined again: 'a  b' read as 'a b'."""
    from pipeline.format.summary import _show

    assert _show("a  b") == "'a  b'" and _show("trail  ") == "'trail  '" and _show("x\ny") == "'x\\ny'"
    shown = _show(np.arange(40, dtype=np.int64).reshape(4, 10), width=60)
    assert "\n" not in shown and shown.startswith("int64[4, 10] [[ 0  1  2")


@pytest.mark.parametrize("pack", [1, 2])
def test_numpy_strings_taken_one_by_one_are_written_as_str_and_bytes(tmp_path: Path, pack: int) -> None:
    """names[i] of an array of strings is a np.str_, a str: refused as "unsupported array dtype
    <U1" one a record, and packed, its dtype (str32, str64) changed with its length."""
    names, blobs = np.array(["a", "bb", "ccc"]), np.array([b"x", b"yy", b"zzz"])
    with pipeline.ShardWriter(tmp_path / "out", pack=pack) as writer:
        for name, blob in zip(names, blobs):
            writer.write({"name": name, "blob": blob})
    index = pipeline.load_index(tmp_path / "out")
    assert {name: spec.dtype for name, spec in index.fields.items()} == {"name": "str", "blob": "bytes"}
    values = read_back(tmp_path / "out")[1]
    assert values == {"name": ["a", "bb", "ccc"], "blob": [b"x", b"yy", b"zzz"]}
    assert [type(value) for value in values["name"] + values["blob"]] == [str] * 3 + [bytes] * 3
    assert pipeline.decode_record(pipeline.encode_sample({"name": names[0]})) == {"name": "a"}
