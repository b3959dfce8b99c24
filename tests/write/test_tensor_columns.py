"""Arrow's fixed-shape tensor columns (``arrow.fixed_shape_tensor``, as pyarrow's
``FixedShapeTensorArray`` and tools built on it write them): one array a sample, in the type's
shape, packed as fixed-size lists are. Before, such columns were refused with "convert it first"."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import pipeline
from pipeline import SampleError
from tests.helpers import read_back


def _tensors(values: np.ndarray) -> pa.Array:
    return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(values))


def test_tensor_columns_build_one_array_a_sample_in_their_shape_and_pack(tmp_path: Path) -> None:
    grids = np.random.default_rng(0).standard_normal((2048, 2, 3)).astype(np.float32)
    table = pa.table({"grid": _tensors(grids), "y": pa.array(np.arange(2048) % 5)})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=500)
    feather.write_feather(table, tmp_path / "t.arrow")
    for name, build in (("t.parquet", pipeline.build_parquet), ("t.arrow", pipeline.build_arrow)):
        index = build(tmp_path / name, tmp_path / name.replace(".", "_"), quiet=True)
        assert index.fields["grid"].shape == (2, 3) and index.fields["grid"].dtype == "float32"
        assert index.pack > 1  # every row has one shape: 'auto' packs rows, as for fixed-size lists
        _, fields = read_back(tmp_path / name.replace(".", "_"))
        assert np.stack(fields["grid"]).tobytes() == grids.tobytes()
        assert [int(y) for y in fields["y"]] == [n % 5 for n in range(2048)]


def test_null_tensors_are_named_or_filled_with_copies_of_the_fill(tmp_path: Path) -> None:
    cubes = np.arange(5 * 2 * 2 * 2, dtype=np.int16).reshape(5, 2, 2, 2)
    storage = pa.array([row.ravel().tolist() for row in cubes], pa.list_(pa.int16(), 8),
                       mask=np.array([False, False, True, False, False]))
    tensors = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.int16(), (2, 2, 2)), storage)
    pq.write_table(pa.table({"cube": tensors}), tmp_path / "n.parquet")
    with pytest.raises(SampleError, match=r"n\.parquet: column 'cube' has nulls, the first at row 2 \(counting"):
        pipeline.build_parquet(tmp_path / "n.parquet", tmp_path / "out", quiet=True)
    pipeline.build_parquet(tmp_path / "n.parquet", tmp_path / "out", fill={"cube": -1}, quiet=True)
    got = np.stack(read_back(tmp_path / "out")[1]["cube"])
    assert got.shape == (5, 2, 2, 2) and (got[2] == -1).all()
    assert np.delete(got, 2, axis=0).tobytes() == np.delete(cubes, 2, axis=0).tobytes()


def test_tensors_stored_in_a_permuted_order_are_refused_with_the_way_out(tmp_path: Path) -> None:
    """pyarrow and the format disagree on what a permuted tensor's shape means: no guess."""
    tensors = pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((3, 4, 2), np.float32).transpose(0, 2, 1))
    assert tensors.type.permutation == [1, 0]
    pq.write_table(pa.table({"x": tensors}), tmp_path / "p.parquet")
    with pytest.raises(SampleError, match=re.escape(
            "its tensors are stored in the order of permutation [1, 0]; write them in row-major order "
            "(numpy.ascontiguousarray before pyarrow.FixedShapeTensorArray.from_numpy_ndarray)")):
        pipeline.build_parquet(tmp_path / "p.parquet", tmp_path / "out", quiet=True)


def test_lists_of_tensors_are_refused_naming_the_column(tmp_path: Path) -> None:
    tensors = _tensors(np.zeros((4, 2, 3), np.float32))
    pq.write_table(pa.table({"x": pa.ListArray.from_arrays(pa.array([0, 2, 4], pa.int32()), tensors)}),
                   tmp_path / "l.parquet")
    with pytest.raises(SampleError, match=r"l\.parquet: column 'x' has type list<element: extension<arrow\.fixed_shape_"
                                          r"tensor.*>>, which shards cannot store"):
        pipeline.build_parquet(tmp_path / "l.parquet", tmp_path / "out", quiet=True)


def test_files_whose_tensor_shapes_differ_are_refused_naming_both(tmp_path: Path) -> None:
    """Both store fixed-size lists of 6 floats: only the tensor shape tells (2, 3) from (3, 2)."""
    (tmp_path / "in").mkdir()
    for name, shape in (("a", (2, 3)), ("b", (3, 2))):
        pq.write_table(pa.table({"x": _tensors(np.zeros((4, *shape), np.float32))}), tmp_path / "in" / f"{name}.parquet")
    with pytest.raises(SampleError, match=r"column 'x' is extension<arrow\.fixed_shape_tensor.*shape=\[3,2\].* in "
                                          r".*b\.parquet but .*shape=\[2,3\].* in .*a\.parquet; every file needs the "
                                          r"same column types"):
        pipeline.build_parquet(tmp_path / "in", tmp_path / "out", quiet=True)
