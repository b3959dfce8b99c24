"""``--dtype`` casts: a cast that would change an integer is refused like any other that changes
a value, and every refusal names the row of the input where the value is, whatever shard,
part or split of the build meets it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import SampleError
from pipeline.write.casting import cast_column
from pipeline.write.part import Part
from pipeline.write.splits import validation_rows
from tests.helpers import read_back


def refusal(tmp_path: Path, arrays: dict, dtypes: dict, **options) -> str:
    """The message of the error a build of ``arrays`` cast to ``dtypes`` stops with."""
    with pytest.raises(SampleError) as caught:
        pipeline.write_shards(tmp_path / "bad", arrays, dtypes=dtypes, quiet=True, overwrite=True, **options)
    return str(caught.value)


def test_an_integer_that_a_float_would_round_is_refused_naming_field_row_and_value(tmp_path: Path) -> None:
    x = np.arange(10, dtype=np.int64)
    x[7] = 2**24 + 1
    assert refusal(tmp_path, {"x": x}, {"x": "float32"}) == (
        "arrays, field 'x', row 7: value 16777217 would become 16777216.0 as float32, which holds integers "
        "exactly only up to 2**24: cast it to a wider float (float64) or keep int64")
    big = np.array([0, 1, 2**62 + 1], dtype=np.int64)
    assert refusal(tmp_path, {"x": big}, {"x": "float64"}) == (
        "arrays, field 'x', row 2: value 4611686018427387905 would become 4.611686018427388e+18 as float64, which "
        "holds integers exactly only up to 2**53: keep int64")
    top = np.array([5, np.iinfo(np.int64).max], dtype=np.int64)  # rounds up to 2**63, which int64 cannot hold
    assert refusal(tmp_path, {"x": top}, {"x": "float64"}) == (
        "arrays, field 'x', row 1: value 9223372036854775807 would become 9.223372036854776e+18 as float64, which "
        "holds integers exactly only up to 2**53: keep int64")
    assert refusal(tmp_path, {"x": np.array([[1, 2], [3, 2049]], np.int16)}, {"x": "float16"}) == (
        "arrays, field 'x', row 1: value 2049 would become 2048.0 as float16, which holds integers exactly only "
        "up to 2**11: cast it to a wider float (float64) or keep int16")
    assert refusal(tmp_path, {"x": np.array([2**53 + 1], np.uint64)}, {"x": "float64"}) == (
        "arrays, field 'x', row 0: value 9007199254740993 would become 9007199254740992.0 as float64, which "
        "holds integers exactly only up to 2**53: keep uint64")


def test_integers_that_a_float_holds_exactly_are_cast(tmp_path: Path) -> None:
    exact = np.array([0, 2**24, -(2**24), 2**30, 3, -7], dtype=np.int64)
    index = pipeline.write_shards(tmp_path / "f32", {"x": exact}, dtypes={"x": "float32"}, quiet=True)
    assert index.fields["x"].dtype == "float32"
    assert [float(v) for v in read_back(tmp_path / "f32")[1]["x"]] == [0.0, 16777216.0, -16777216.0, 2.0**30,
                                                                         3.0, -7.0]
    wide = np.arange(-5, 5, dtype=np.int32)  # every int32 fits float64: nothing to check
    pipeline.write_shards(tmp_path / "f64", {"x": wide}, dtypes={"x": "float64"}, quiet=True)
    assert [float(v) for v in read_back(tmp_path / "f64")[1]["x"]] == list(map(float, range(-5, 5)))


def test_a_refused_value_is_named_by_its_row_in_the_input_in_any_shard_part_or_split(tmp_path: Path) -> None:
    x = np.zeros(1000)
    x[737] = 0.5
    why = "value 0.5 is not a whole number; it cannot be stored as int8 (store it as a float)"
    assert refusal(tmp_path, {"x": x}, {"x": "int8"}, shard_samples=100) == f"arrays, field 'x', row 737: {why}"
    assert refusal(tmp_path, {"x": x}, {"x": "int8"}, shard_samples=100, part=Part(1, 2)) == \
        f"arrays, field 'x', row 737: {why}"  # part 1 writes rows 500 to 999
    split = "validation" if 737 in validation_rows(1000, 0.3, 4) else "train"
    for part in (None, Part(1, 2)):  # a window of a split starts at a row of the input inside the split
        assert refusal(tmp_path, {"x": x}, {"x": "int8"}, shard_samples=100, validation=0.3, seed=4, part=part) == \
            f"arrays [{split}], field 'x', row 737: {why}"


def test_values_of_a_list_column_are_named_by_their_own_rows() -> None:
    values = [np.ones(2), np.array([[1.0], [2.5]]), np.ones(3)]
    with pytest.raises(SampleError) as caught:
        cast_column(values, np.dtype("int8"), "files, field 'x'", lambda row: f"files, field 'x', row {row + 40}")
    assert str(caught.value) == ("files, field 'x', row 41: value 2.5 is not a whole number; it cannot be stored "
                                 "as int8 (store it as a float)")
    cast = cast_column([np.float64(3.0), np.ones((2, 2))], np.dtype("int8"), "files, field 'x'", str)
    assert [(type(v), v.dtype, v.shape) for v in cast] == [(np.ndarray, np.int8, ()), (np.ndarray, np.int8, (2, 2))]


@pytest.mark.parametrize("options", [{}, {"validation": 3, "seed": 2}, {"workers": 2, "shard_samples": 2}])
def test_a_refused_value_of_a_table_is_named_by_its_file_and_its_row_there(tmp_path: Path, options: dict) -> None:
    """Rows of several files count in each file, as the null errors count them, not across all."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    files = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    pq.write_table(pa.table({"x": [1.0, 2.0, 3.0]}), files[0])
    pq.write_table(pa.table({"x": [4.0, 5.0, 6.0, 7.5, 8.0]}), files[1], row_group_size=2)
    with pytest.raises(SampleError) as caught:
        pipeline.build_parquet(files, tmp_path / "out", dtypes={"x": "int64"}, quiet=True, **options)
    assert str(caught.value) == (f"{files[1]}, field 'x', row 3 (counting from 0 in the file): value 7.5 is not a "
                                 f"whole number; it cannot be stored as int64 (store it as a float)")


def test_files_of_two_dtypes_are_refused_with_the_cast_that_joins_them(tmp_path: Path) -> None:
    """Two preprocessing runs, one that saved float64: the error says which --dtype stores both."""
    torch = pytest.importorskip("torch")
    (tmp_path / "data").mkdir()
    for n in range(4):
        torch.save(torch.full((3,), n + 0.5, dtype=torch.float64 if n == 0 else torch.float32),
                   tmp_path / "data" / f"id-{n}.pt")
    labels, partition = {f"id-{n}": n for n in range(4)}, {"train": [f"id-{n}" for n in range(4)]}
    with pytest.raises(pipeline.SampleError, match=re.escape(
            "sample 'id-1': field 'x' has dtype float32, earlier samples float64; a field needs one dtype: cast the "
            "values as you write them (a ShardWriter's), or build with --dtype x=float64 (dtypes=)")):
        pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", quiet=True)
    pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", dtypes={"x": "float64"},
                                quiet=True, resume=True)
    assert [v.tolist() for v in read_back(tmp_path / "out" / "train")[1]["x"]] == [[n + 0.5] * 3 for n in range(4)]


def test_a_refused_value_of_a_sample_file_is_named_by_its_id_and_file(tmp_path: Path) -> None:
    """Named by its row (``row 2``) before: the one name a user of one file per sample lacks."""
    torch = pytest.importorskip("torch")
    (tmp_path / "data").mkdir()
    for n in range(4):
        torch.save(torch.full((2,), 300.0 if n == 2 else 1.0), tmp_path / "data" / f"id-{n}.pt")
    labels, partition = {f"id-{n}": 0 for n in range(4)}, {"train": [f"id-{n}" for n in range(4)]}
    with pytest.raises(pipeline.SampleError, match=re.escape(
            f"train ({tmp_path / 'data'}): ID 'id-2', field 'x', file id-2.pt: value 300.0 does not fit in int8 "
            f"(-128 to 127)")):
        pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", dtypes={"x": "int8"},
                                    quiet=True)


def test_values_that_are_no_numbers_are_named_in_words_with_what_to_do(tmp_path: Path) -> None:
    """An image folder's encoded images or a text field cast to a number: the error showed NumPy's
    internal dtype (``|S643``) and said nothing of what to do."""
    from tests.images import image_folder

    image_folder(tmp_path / "photos", {"cat": 2, "dog": 2})
    with pytest.raises(SampleError, match=re.escape(
            "field 'image': its values are bytes (encoded files or images), which cannot be cast to uint8: a cast is "
            "of numbers; leave this field out of --dtype (dtypes=) (images are decoded as they are read: "
            "make_loader(..., images={field: Images(size)}))")):
        pipeline.build_imagefolder(tmp_path / "photos", tmp_path / "out", dtypes={"image": "uint8"}, quiet=True)
    message = refusal(tmp_path, {"x": np.zeros(4), "name": np.array(["a", "b", "c", "d"])}, {"name": "int64"})
    assert message.endswith("field 'name': its values are text, which cannot be cast to int64: a cast is of numbers; "
                            "leave this field out of --dtype (dtypes=)"), message
