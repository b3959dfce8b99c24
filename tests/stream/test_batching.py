"""Gathering a unit's rows in emission order: into shared memory, exactly NumPy's rows."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from pipeline.stream.batching import gather, to_torch


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


def test_a_list_column_of_read_only_arrays_becomes_tensors_of_their_own(tmp_path) -> None:
    """Samples of different shapes come as a list of tensors; their arrays are read-only views of
    the shard's bytes, which a tensor must not share (PyTorch warns of it, once a program)."""
    ragged = [np.arange(n, dtype=np.int64) for n in (2, 1, 3)]
    for array in ragged:
        array.flags.writeable = False
    out = to_torch({"l": [*ragged, None], "s": [b"a", b"b", b"c", b"d"]})
    assert [t.tolist() for t in out["l"][:3]] == [[0, 1], [0], [0, 1, 2]] and out["l"][3] is None
    assert out["s"] == [b"a", b"b", b"c", b"d"]
    out["l"][0][0] = 7  # its own memory: the shard's bytes are untouched
    assert ragged[0][0] == 0
    script = ("import warnings, numpy as np; from pipeline.stream.batching import to_torch\n"
              "a = np.arange(3); a.flags.writeable = False\n"
              "warnings.simplefilter('error'); to_torch({'l': [a]})")
    assert subprocess.run([sys.executable, "-c", script], capture_output=True, text=True).returncode == 0


def test_arrays_in_a_dict_field_become_tensors_of_their_own(tmp_path) -> None:
    """A dict field's arrays are views of the bytes read: converted as they were, PyTorch warned
    (once a program: hence a program of its own) that their tensors share read-only memory."""
    script = ("import warnings, numpy as np, pipeline, sys\n"
              "with pipeline.ShardWriter(sys.argv[1]) as w:\n"
              "    for i in range(8): w.write({'meta': {'a': np.arange(3) + i, 'n': i}})\n"
              "warnings.simplefilter('error')\n"
              "batch = next(iter(pipeline.make_loader(sys.argv[1], batch_size=4, shuffle=False)))\n"
              "assert [m['a'].tolist() for m in batch['meta']] == [[i, i + 1, i + 2] for i in range(4)]\n"
              "batch['meta'][0]['a'][0] = 7\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "s")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
