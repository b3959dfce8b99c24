"""Gathering a unit's rows in emission order: into shared memory, exactly NumPy's rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.stream.batching import gather


def test_rows_gathered_into_shared_memory_are_numpys_take() -> None:
    rng = np.random.default_rng(0)
    columns = {"x": rng.random((500, 3, 4), dtype=np.float32), "y": rng.integers(0, 9, 500),
               "b": rng.random(500) > 0.5, "u": rng.integers(0, 255, (500, 7), dtype=np.uint8)}
    for index in (rng.permutation(500), rng.integers(0, 500, 800), np.array([499, 0, 0]), np.array([], np.int64)):
        out = gather(columns, index, shared=True)
        for name, column in columns.items():
            assert isinstance(out[name], torch.Tensor) and out[name].is_shared()
            assert np.array_equal(out[name].numpy(), np.take(column, index, axis=0)), name


@pytest.mark.parametrize("row", [500, -1])
def test_a_row_out_of_the_columns_is_an_error_not_a_clipped_row(row: int) -> None:
    columns = {"x": np.arange(1000, dtype=np.float32).reshape(500, 2)}
    with pytest.raises(IndexError, match=rf"rows {min(row, 3)}\.\.{max(row, 3)} gathered from 500"):
        gather(columns, np.array([3, row]), shared=True)
