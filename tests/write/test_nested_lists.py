"""Lists of lists of numbers (``datasets``' ``Array2D``/``Array3D``, Parquet lists of lists): one
array a sample, one dimension a depth; a row whose lists of one depth differ in length is an
error naming the file, the column and the row. Before, such columns were refused with "convert
it first"."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import pipeline
from pipeline import SampleError, make_loader
from tests.helpers import read_back


def _saved_dataset(folder: Path, rows: int) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    import datasets  # in the test extra; optional for users

    rng = np.random.default_rng(0)
    grids = rng.standard_normal((rows, 4, 3)).astype(np.float32)
    cubes = rng.integers(0, 255, (rows, 2, 3, 2), dtype=np.uint8)
    tracks = [rng.standard_normal((1 + n % 5, 2)).astype(np.float32) for n in range(rows)]  # first dimension free
    features = datasets.Features({"grid": datasets.Array2D((4, 3), "float32"),
                                  "cube": datasets.Array3D((2, 3, 2), "uint8"),
                                  "track": datasets.Array2D((None, 2), "float32"), "y": datasets.Value("int64")})
    data = {"grid": list(grids), "cube": list(cubes), "track": tracks, "y": list(range(rows))}
    datasets.Dataset.from_dict(data, features=features).save_to_disk(str(folder), num_shards=2)
    return grids, tracks, cubes


def test_datasets_array2d_and_array3d_columns_build_one_array_a_sample(tmp_path: Path) -> None:
    grids, tracks, cubes = _saved_dataset(tmp_path / "saved", 300)
    # in this process `datasets` is imported, so pyarrow reads the columns as its extension types
    pipeline.build_arrow(tmp_path / "saved", tmp_path / "out", shard_samples=70, quiet=True)
    index = pipeline.load_index(tmp_path / "out")
    assert (index.fields["grid"].shape, index.fields["cube"].shape) == ((4, 3), (2, 3, 2))
    assert index.fields["track"].varies and index.fields["cube"].dtype == "uint8"
    _, fields = read_back(tmp_path / "out")
    assert np.stack(fields["grid"]).tobytes() == grids.tobytes()
    assert np.stack(fields["cube"]).tobytes() == cubes.tobytes()
    assert all(np.array_equal(got, want) for got, want in zip(fields["track"], tracks, strict=True))
    batch = next(iter(make_loader(tmp_path / "out", batch_size=32, shuffle=False)))
    assert batch["grid"].shape == (32, 4, 3) and torch.equal(batch["grid"][5], torch.from_numpy(grids[5]))
    # the command line's process has not imported `datasets`: the columns are lists of lists there
    run = subprocess.run([sys.executable, "-m", "pipeline", "build", "arrow", str(tmp_path / "saved"),
                          str(tmp_path / "cli"), "--shard-samples", "70", "--quiet"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert [s.sha256 for s in pipeline.load_index(tmp_path / "cli").shards] == [s.sha256 for s in index.shards]


def test_an_empty_row_of_an_array2d_with_a_free_first_dimension_keeps_its_other_sizes(tmp_path: Path) -> None:
    """An Array2D((None, 3)) row without boxes came back of shape (0, 0), as datasets gives it
    (0, 3): its field was (None, None), and a batch's rows did not join."""
    import datasets

    features = datasets.Features({"boxes": datasets.Array2D((None, 3), "float32")})
    rows = [[], [[1, 2, 3]], [[4, 5, 6], [7, 8, 9]]]
    datasets.Dataset.from_dict({"boxes": rows}, features=features).save_to_disk(str(tmp_path / "saved"))
    pipeline.build_arrow(tmp_path / "saved", tmp_path / "out", quiet=True)
    assert pipeline.load_index(tmp_path / "out").fields["boxes"].shape == (None, 3)
    boxes = next(iter(make_loader(tmp_path / "out", num_workers=0, batch_size=3, shuffle=False)))["boxes"]
    assert [tuple(box.shape) for box in boxes] == [(0, 3), (1, 3), (2, 3)]
    assert torch.cat(boxes).tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


def _lists_of_lists(rows: list) -> pa.Array:
    return pa.array(rows, pa.list_(pa.list_(pa.float32())))


def test_parquet_lists_of_lists_read_from_inside_row_groups_keep_every_row(tmp_path: Path) -> None:
    """Windows that start inside a row group slice the lists: offsets that do not start at 0."""
    rows = [[[float(n), n + 0.5]] * (1 + n % 3) for n in range(500)]
    pq.write_table(pa.table({"x": _lists_of_lists(rows)}), tmp_path / "t.parquet", row_group_size=128)
    pipeline.build_parquet(tmp_path / "t.parquet", tmp_path / "out", shard_samples=45, quiet=True)
    _, fields = read_back(tmp_path / "out")
    assert [x.shape for x in fields["x"][:4]] == [(1, 2), (2, 2), (3, 2), (1, 2)]
    assert all(x.tolist() == want for x, want in zip(fields["x"], rows, strict=True))


def test_a_row_of_lists_of_different_lengths_is_an_error_naming_it(tmp_path: Path) -> None:
    rows = [[[1.0, 2.0], [3.0, 4.0]]] * 10
    rows[7] = [[1.0, 2.0], [3.0]]
    pq.write_table(pa.table({"y": list(range(10)), "x": _lists_of_lists(rows)}), tmp_path / "j.parquet")
    with pytest.raises(SampleError, match=re.escape(
            f"{tmp_path / 'j.parquet'}: column 'x', row 7 (counting from 0 in the file): its lists hold "
            f"1 and 2 items, so they make no array; give the lists of each depth of a row one length, or leave the "
            f"column out with --columns")):
        pipeline.build_parquet(tmp_path / "j.parquet", tmp_path / "out", quiet=True)
    pipeline.build_parquet(tmp_path / "j.parquet", tmp_path / "out", columns=["y"], quiet=True)


def test_nulls_in_lists_of_lists_are_named_or_filled(tmp_path: Path) -> None:
    rows = [[[1.0, 2.0]], None, [[3.0, None]], [], [[5.0, 6.0], [7.0, 8.0]]]
    pq.write_table(pa.table({"x": _lists_of_lists(rows)}), tmp_path / "n.parquet")
    with pytest.raises(SampleError, match=r"n\.parquet: column 'x' has nulls, the first at rows 1, 2 \(counting"):
        pipeline.build_parquet(tmp_path / "n.parquet", tmp_path / "out", quiet=True)
    pipeline.build_parquet(tmp_path / "n.parquet", tmp_path / "out", fill={"x": -1}, quiet=True)
    _, fields = read_back(tmp_path / "out")
    assert [x.tolist() for x in fields["x"]] == [[[1.0, 2.0]], [], [[3.0, -1.0]], [], [[5.0, 6.0], [7.0, 8.0]]]
    assert [x.shape for x in fields["x"]] == [(1, 2), (0, 0), (1, 2), (0, 0), (2, 2)]


def test_array2d_of_one_shape_packs_as_fixed_size_arrays_do(tmp_path: Path) -> None:
    """An Array2D whose every dimension is fixed is one array of all rows: 'auto' packs it."""
    import datasets  # in the test extra; optional for users

    grids = np.random.default_rng(1).standard_normal((2048, 4, 3)).astype(np.float32)
    features = datasets.Features({"grid": datasets.Array2D((4, 3), "float32"), "y": datasets.ClassLabel(names=["a", "b"])})
    datasets.Dataset.from_dict({"grid": list(grids), "y": [n % 2 for n in range(2048)]}, features=features).save_to_disk(
        str(tmp_path / "saved"))
    index = pipeline.build_arrow(tmp_path / "saved", tmp_path / "out", quiet=True)
    assert index.pack == 4 and index.fields["grid"].shape == (4, 3)  # 2,048 rows keep 512 records
    assert index.metadata == {"classes": ["a", "b"]}
    _, fields = read_back(tmp_path / "out")
    assert np.stack(fields["grid"]).tobytes() == grids.tobytes()


def _claimed(rows: list, shape: list) -> pa.Table:
    """A table whose metadata says, as ``datasets`` writes it, that column ``x`` is an Array2D of ``shape``."""
    features = {"x": {"shape": shape, "dtype": "float32", "_type": "Array2D"}}
    return pa.table({"x": _lists_of_lists(rows)}).replace_schema_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})})


def test_a_row_of_another_shape_than_its_array2d_feature_is_named(tmp_path: Path) -> None:
    rows = [[[1.0, 2.0], [3.0, 4.0]]] * 6
    rows[4] = [[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]]
    pq.write_table(_claimed(rows, [2, 2]), tmp_path / "w.parquet")
    with pytest.raises(SampleError, match=re.escape(
            f"{tmp_path / 'w.parquet'}: column 'x', row 4 (counting from 0 in the file): its shape is (2, 3), where "
            f"the column's datasets feature says (2, 2); mend that row, or leave the column out with --columns")):
        pipeline.build_parquet(tmp_path / "w.parquet", tmp_path / "out", quiet=True)


def test_a_null_array2d_row_is_filled_with_copies_of_the_fill(tmp_path: Path) -> None:
    rows = [[[float(n), n + 0.5]] * 3 for n in range(6)]
    rows[2] = None
    pq.write_table(_claimed(rows, [3, 2]), tmp_path / "n.parquet", row_group_size=4)
    with pytest.raises(SampleError, match=r"column 'x' has nulls, the first at row 2 "):
        pipeline.build_parquet(tmp_path / "n.parquet", tmp_path / "out", quiet=True)
    pipeline.build_parquet(tmp_path / "n.parquet", tmp_path / "out", fill={"x": 7}, shard_samples=3, quiet=True)
    _, fields = read_back(tmp_path / "out")
    assert [x.shape for x in fields["x"]] == [(3, 2)] * 6
    assert fields["x"][2].tolist() == [[7.0, 7.0]] * 3 and fields["x"][5].tolist() == [[5.0, 5.5]] * 3


def test_nulls_of_array2d_columns_are_counted_as_the_command_line_counts_them(tmp_path: Path) -> None:
    """With datasets imported, the column is an extension type: its nulls were said "0 null, at rows 1"."""
    import datasets  # in the test extra; optional for users

    rows = [[[1.0, 2.0], [3.0, 4.0]], [[1.0, None], [3.0, 4.0]], None]
    datasets.Dataset.from_dict({"a": rows}, features=datasets.Features({"a": datasets.Array2D((2, 2), "float32")})
                               ).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(SampleError, match=r"column 'a' has nulls, the first at rows 1, 2 \(counting"):
        pipeline.build_arrow(tmp_path / "saved", tmp_path / "out", quiet=True)


def test_a_null_list_inside_a_row_is_refused_even_with_a_fill(tmp_path: Path) -> None:
    """A fill cannot stand for a list of unknown length: before, "lists hold 0 and 2 items", or
    the row was stored as [[]] without a word."""
    for name, rows in (("pair", [[[1.0, 2.0]], [[1.0, 2.0], None]]), ("alone", [[[1.0, 2.0]], [None]])):
        pq.write_table(pa.table({"x": _lists_of_lists(rows)}), tmp_path / f"{name}.parquet")
        with pytest.raises(SampleError, match=re.escape(
                f"{tmp_path / f'{name}.parquet'}: column 'x', row 1 (counting from 0 in the file): a list in it is "
                f"null, which a fill cannot stand for (a list of unknown length); mend that row")):
            pipeline.build_parquet(tmp_path / f"{name}.parquet", tmp_path / name, fill={"x": 0}, quiet=True)


def test_a_null_row_is_empty_or_filled_whatever_values_its_offsets_span() -> None:
    """Arrow lets a null slot span values: they made a null row "hold 1 and 3 items"."""
    from pipeline.write.sources.table_columns import RAGGED, SHAPED, to_column

    inner = pa.ListArray.from_arrays(pa.array([0, 2, 4, 5, 8, 10], pa.int32()),
                                     pa.array(np.arange(10, dtype=np.float32)))
    rows = pa.ListArray.from_arrays(pa.array([0, 1, 4, 5], pa.int32()), inner, mask=pa.array([False, True, False]))
    assert [x.shape for x in to_column(rows, RAGGED, -1.0)] == [(1, 2), (0, 0), (1, 2)]
    shaped = to_column(rows, SHAPED, -1.0, (1, 2))
    assert shaped.tolist() == [[[0.0, 1.0]], [[-1.0, -1.0]], [[8.0, 9.0]]]


def test_array_dimensions_of_size_0_build(tmp_path: Path) -> None:
    import datasets  # in the test extra; optional for users

    datasets.Dataset.from_dict({"a": [np.zeros((0, 3), np.float32)] * 4},
                               features=datasets.Features({"a": datasets.Array2D((0, 3), "float32")})
                               ).save_to_disk(str(tmp_path / "saved"))
    pipeline.build_arrow(tmp_path / "saved", tmp_path / "out", quiet=True)
    assert [x.shape for x in read_back(tmp_path / "out")[1]["a"]] == [(0, 3)] * 4
    pq.write_table(_claimed([[[], []], None, [[], []]], [2, 0]), tmp_path / "z.parquet")
    pipeline.build_parquet(tmp_path / "z.parquet", tmp_path / "z", fill={"x": 0}, quiet=True)
    assert [x.shape for x in read_back(tmp_path / "z")[1]["x"]] == [(2, 0)] * 3


def test_files_whose_datasets_features_differ_are_refused_naming_both(tmp_path: Path) -> None:
    """The first file's class names and shapes stood for all: a label meant one class in one file,
    another in the next; a row of the second file's shape was 'to mend' mid-build."""
    import datasets  # in the test extra; optional for users

    (tmp_path / "labels").mkdir()
    for name, classes in (("a", ["cat", "dog"]), ("b", ["dog", "cat"])):
        datasets.Dataset.from_dict({"y": [0, 1]}, features=datasets.Features({"y": datasets.ClassLabel(names=classes)})
                                   ).to_parquet(str(tmp_path / "labels" / f"{name}.parquet"))
    with pytest.raises(SampleError, match=re.escape(
            f"{tmp_path / 'labels' / 'b.parquet'}: its datasets features give class names ['dog', 'cat'], "
            f"{tmp_path / 'labels' / 'a.parquet'} ['cat', 'dog'] (number the classes alike: "
            f"Dataset.align_labels_with_mapping); every file needs the same")):
        pipeline.build_parquet(tmp_path / "labels", tmp_path / "out", quiet=True)
    (tmp_path / "shapes").mkdir()
    pq.write_table(_claimed([[[1.0, 2.0]]], [1, 2]), tmp_path / "shapes" / "a.parquet")
    pq.write_table(_claimed([[[1.0, 2.0, 3.0]]], [1, 3]), tmp_path / "shapes" / "b.parquet")
    with pytest.raises(SampleError, match=re.escape("its datasets features give array shapes {'x': (1, 3)}, ")):
        pipeline.build_parquet(tmp_path / "shapes", tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()
