"""pandas columns become fields with their values unchanged: a gap of a nullable column is refused
naming the column and its rows (pandas' own ``to_numpy`` makes it a NaN, an ``Int64`` label column
float64), and a nullable column without gaps keeps its NumPy dtype."""

from __future__ import annotations

import re
from pathlib import Path

import joblib
import numpy as np
import pytest

import pipeline
from pipeline import SampleError
from tests.helpers import read_back

pd = pytest.importorskip("pandas")

GAPS = {"Int64": [1, None, 3, None], "Float64": [1.5, None, 3.0, None], "boolean": [True, None, False, None],
        "string": ["a", None, "c", None], "category": ["a", None, "c", None]}


@pytest.mark.parametrize("dtype", sorted(GAPS))
def test_a_gap_in_a_nullable_column_is_refused_naming_the_field_and_its_rows(tmp_path: Path, dtype: str) -> None:
    frame = pd.DataFrame({"f": pd.array([0.5, 1.5, 2.5, 3.5]), "y": pd.Series(GAPS[dtype], dtype=dtype)})
    why = "a field needs a value in every sample" if dtype in ("string", "category") else \
        "pandas would make it a NaN, changing the column's values (and an integer column's type)"
    with pytest.raises(SampleError, match=re.escape(
            f"field 'y': 2 missing values ({dtype}), at rows 1, 3 (counting from 0): fill them "
            f"(frame['y'].fillna(VALUE)) or drop those rows (.dropna()) first; {why}")):
        pipeline.write_shards(tmp_path / "out", frame, quiet=True)
    assert not (tmp_path / "out").exists()


def test_nullable_columns_without_gaps_keep_their_numpy_dtypes_and_values(tmp_path: Path) -> None:
    frame = pd.DataFrame({"y": pd.array([3, 1, 2], dtype="Int64"), "ok": pd.array([True, False, True], dtype="boolean"),
                          "w": pd.array([0.25, 0.5, 1.0], dtype="Float64"), "name": pd.array(["a", "b", "c"],
                                                                                          dtype="string")})
    pipeline.write_shards(tmp_path / "out", frame, quiet=True)
    fields = pipeline.load_index(tmp_path / "out").fields
    assert {name: fields[name].dtype for name in ("y", "ok", "w")} == {"y": "int64", "ok": "bool", "w": "float64"}
    _, values = read_back(tmp_path / "out")
    assert [int(v) for v in values["y"]] == [3, 1, 2] and [bool(v) for v in values["ok"]] == [True, False, True]
    assert [float(v) for v in values["w"]] == [0.25, 0.5, 1.0] and values["name"] == ["a", "b", "c"]


def test_numbered_columns_are_refused_saying_to_name_the_arrays(tmp_path: Path) -> None:
    """A DataFrame of features in columns 0..N-1 was refused as if its names began with '__'."""
    frame = pd.DataFrame(np.arange(12.0).reshape(4, 3))
    def write_columns() -> None:
        with pipeline.ShardWriter(tmp_path / "cols") as writer:
            writer.write_columns(frame)

    for where, write in (("write_shards", lambda: pipeline.write_shards(tmp_path / "out", frame, quiet=True)),
                         ("write_columns", write_columns)):
        with pytest.raises(SampleError, match=re.escape(
                f"{where}: field 0: a field's name is a str, not int 0: name the arrays ({{'x': "
                f"frame.to_numpy(np.float32), 'y': labels}} for a DataFrame of numbered feature columns)")):
            write()
    pipeline.write_shards(tmp_path / "out", {"x": frame, "y": np.arange(4)}, quiet=True)
    assert np.array_equal(np.stack(read_back(tmp_path / "out")[1]["x"]), frame.to_numpy())


def test_joblib_files_of_pandas_objects_refuse_gaps_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "batches"
    folder.mkdir()
    x = pd.DataFrame({"a": pd.array([1, 2, None, 4], dtype="Int64"), "b": [0.5, 1.5, 2.5, 3.5]})
    joblib.dump([x], folder / "x_4.job")
    joblib.dump(pd.Series([0, 1, 1, 0], dtype="Int64"), folder / "y_4.job")
    with pytest.raises(SampleError, match=re.escape(
            f"{folder / 'x_4.job'}: item 0 of its list: column 'a': 1 missing value (Int64), at row 2 (counting "
            f"from 0): fill it (frame['a'].fillna(VALUE)) or drop that row (.dropna()) first")):
        pipeline.build_joblib(folder, tmp_path / "out", quiet=True)
    joblib.dump(pd.Series([0, None, 1, 0], dtype="Int64"), folder / "y_4.job")
    joblib.dump(x.fillna(3), folder / "x_4.job")
    with pytest.raises(SampleError, match=re.escape(f"{folder / 'y_4.job'}: 1 missing value (Int64), at row 1 ")):
        pipeline.build_joblib(folder, tmp_path / "out", quiet=True)
    joblib.dump(pd.Series([0, 1, 1, 0], dtype="Int64"), folder / "y_4.job")
    pipeline.build_joblib(folder, tmp_path / "out", quiet=True)  # Int64 beside float64: float64 features
    fields = pipeline.load_index(tmp_path / "out").fields
    assert (fields["x"].dtype, fields["x"].shape, fields["y"].dtype) == ("float64", (2,), "int64")
    _, values = read_back(tmp_path / "out")
    assert np.array_equal(np.stack(values["x"]), [[1, 0.5], [2, 1.5], [3, 2.5], [4, 3.5]])
    assert [int(v) for v in values["y"]] == [0, 1, 1, 0]


def test_a_frame_whose_ints_its_floats_would_round_is_refused(tmp_path: Path) -> None:
    """pandas joins an int64 column beside a float64 one as float64: 2**53 + 1 was stored as
    2**53 without a word (two files of the same columns were refused)."""
    folder = tmp_path / "batches"
    folder.mkdir()
    joblib.dump(pd.DataFrame({"ts_ns": [1_700_000_000_123_456_789, 2**53 + 1], "v": [0.5, 1.5]}), folder / "x_2.job")
    joblib.dump(np.array([0, 1]), folder / "y_2.job")
    with pytest.raises(SampleError, match=re.escape(
            f"{folder / 'x_2.job'}: a DataFrame whose columns hold arrays of float64, int64 whose values one array "
            f"would change")):
        pipeline.build_joblib(folder, tmp_path / "out", quiet=True)
    joblib.dump(pd.DataFrame({"n": [3, 2**24], "v": [0.5, 1.5]}), folder / "x_2.job")  # held exactly: built
    pipeline.build_joblib(folder, tmp_path / "out", quiet=True)
    assert np.array_equal(np.stack(read_back(tmp_path / "out")[1]["x"]), [[3, 0.5], [2**24, 1.5]])


def test_frames_that_a_dict_would_change_are_refused(tmp_path: Path) -> None:
    """Two columns of one name kept only the last; Series reordered or filtered were paired with
    other rows by position; a Series given for the mapping made fields named 0, 1, ..."""
    with pytest.raises(SampleError, match=re.escape(
            "write_shards: several columns are named 'a': a field is one column; rename them (frame.columns = "
            "[...]) or leave all but one out")):
        pipeline.write_shards(tmp_path / "out", pd.DataFrame([[1.0, 3.0], [2.0, 4.0]], columns=["a", "a"]),
                              quiet=True)
    frame = pd.DataFrame({"x": np.arange(5.0), "y": np.arange(5)})
    with pytest.raises(SampleError, match=re.escape(
            "write_shards: fields 'x' and 'y' are pandas objects with different indexes, and rows are paired by "
            "position, not by index: align them first")):
        pipeline.write_shards(tmp_path / "out", {"x": frame["x"], "y": frame["y"].iloc[::-1]}, quiet=True)
    with pytest.raises(TypeError, match=re.escape(
            "write_shards takes a mapping of field names to arrays, or a DataFrame; got a pandas Series: pass "
            "{'y': values} or values.to_frame()")):
        pipeline.write_shards(tmp_path / "out", frame["x"], quiet=True)
    assert not (tmp_path / "out").exists()
    pipeline.write_shards(tmp_path / "out", {"x": frame["x"], "y": frame["y"].to_numpy()[::-1]}, quiet=True)
    _, values = read_back(tmp_path / "out")
    assert [float(v) for v in values["x"]] == [0, 1, 2, 3, 4] and [int(v) for v in values["y"]] == [4, 3, 2, 1, 0]


def test_shard_writer_columns_take_frames_and_string_arrays_as_write_shards_does(tmp_path: Path) -> None:
    """A DataFrame's columns were written as values the index misdescribed, a set no reader took;
    a NumPy string array was refused."""
    frame = pd.DataFrame({"x": np.arange(4.0), "y": pd.array([3, 1, 2, 0], dtype="Int64")})
    with pipeline.ShardWriter(tmp_path / "out") as writer:
        writer.write_columns(frame)
        writer.write_columns({"x": frame["x"], "y": np.arange(4)})
        with pytest.raises(SampleError, match=re.escape("write_columns: several columns are named 'x'")):
            writer.write_columns(pd.DataFrame([[1.0, 2.0]], columns=["x", "x"]))
    samples = [sample for _, sample in pipeline.iter_samples(tmp_path / "out")]
    assert [(float(s["x"]), int(s["y"])) for s in samples] == [(0, 3), (1, 1), (2, 2), (3, 0), (0, 0), (1, 1), (2, 2),
                                                               (3, 3)]
    assert pipeline.verify(tmp_path / "out") == []
    with pipeline.ShardWriter(tmp_path / "text") as writer:
        writer.write_columns({"name": np.array(["a", "bc"]), "raw": np.array([b"x", b"yz"])})
    assert [sample for _, sample in pipeline.iter_samples(tmp_path / "text")] == [
        {"name": "a", "raw": b"x"}, {"name": "bc", "raw": b"yz"}]


@pytest.mark.parametrize("pack", [1, 2])
def test_shard_writer_columns_of_objects_are_written_as_their_values(tmp_path: Path, pack: int) -> None:
    """A text column of pandas (an array of str objects) made an index of dtype "object" that no
    reader took (pack 1), or was refused without a word of what to do (pack 2)."""
    with pipeline.ShardWriter(tmp_path / "out", pack=pack) as writer:
        writer.write_columns({"name": pd.Series(["cat", "dog"]), "n": np.array([1, None], object), "y": np.arange(2)})
    assert pipeline.load_index(tmp_path / "out").fields["name"].dtype == "str"
    batch = next(iter(pipeline.make_loader(tmp_path / "out", batch_size=2, shuffle=False)))
    assert batch["name"] == ["cat", "dog"] and batch["n"] == [1, None] and batch["y"].tolist() == [0, 1]


def test_booleans_beside_numbers_are_refused_as_numpys_columns_are(tmp_path: Path) -> None:
    """A nullable Int8 column beside a boolean one stored True as 1 in an int8 array; the same
    frame of NumPy columns is an array of objects, refused."""
    for ints in (pd.array([1, 2], dtype="Int8"), np.array([1, 2], np.int8)):
        frame = pd.DataFrame({"n": ints, "ok": pd.array([True, False], dtype="boolean")})
        with pytest.raises(SampleError, match=re.escape("field 'x' (in memory): a 2-d array of strings or objects")):
            pipeline.write_shards(tmp_path / "out", {"x": frame}, quiet=True)
