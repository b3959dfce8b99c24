"""Torch tensors given to ``write_shards``: ``bfloat16``, which NumPy lacks, is stored as
``bfloat16`` (extension type 2) and streams back as ``bfloat16`` tensors, bit for bit."""

from __future__ import annotations

from pathlib import Path

import joblib
import numpy as np
import pytest
import torch

import pipeline
from pipeline import SampleError
from pipeline.format.index import FieldSpec
from tests.helpers import read_back


def streamed(out_dir: Path, workers: int = 0) -> dict[int, torch.Tensor]:
    """Field ``t`` of every sample a loader yields, by the sample's field ``i``."""
    rows = {}
    for batch in pipeline.make_loader(out_dir, num_workers=workers, shuffle=False, batch_size=16):
        assert isinstance(batch["t"], torch.Tensor) and batch["t"].dtype == torch.bfloat16  # one a batch
        rows.update(zip(batch["i"].tolist(), batch["t"]))
    return rows


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype == torch.bfloat16 and a.shape == b.shape and torch.equal(a.view(torch.int16),
                                                                                     b.view(torch.int16))


def test_a_bfloat16_tensor_builds_where_it_crashed(tmp_path: Path) -> None:
    index = pipeline.write_shards(tmp_path / "out", {"t": torch.arange(50, dtype=torch.bfloat16)}, quiet=True)
    assert (index.samples, index.pack, index.fields) == (50, 1, {"t": FieldSpec("bfloat16", ())})
    _, fields = read_back(tmp_path / "out")
    assert [float(v) for v in fields["t"]] == list(map(float, range(50)))


def test_bfloat16_tensors_stream_back_as_bfloat16_bit_for_bit(tmp_path: Path) -> None:
    t = torch.randn(70, 3, 2).to(torch.bfloat16)
    t[5, 0, 0], t[6, 1, 1] = float("inf"), float("nan")
    index = pipeline.write_shards(tmp_path / "out", {"t": t, "i": np.arange(70)}, shard_samples=20, quiet=True)
    assert (len(index.shards), index.fields["t"]) == (4, FieldSpec("bfloat16", (3, 2)))
    for workers in (0, 2):  # gathered in the main process, or in workers' shared memory
        rows = streamed(tmp_path / "out", workers)
        assert sorted(rows) == list(range(70)) and all(same_bits(rows[i], t[i]) for i in range(70))


def test_bfloat16_rows_split_and_cast_like_other_arrays(tmp_path: Path) -> None:
    t = torch.randn(40, 4).to(torch.bfloat16)
    pipeline.write_shards(tmp_path / "split", {"t": t[::2], "i": np.arange(20)}, validation=5, quiet=True)
    rows = {**streamed(tmp_path / "split" / "train"), **streamed(tmp_path / "split" / "validation")}
    assert sorted(rows) == list(range(20)) and all(same_bits(rows[i], t[::2][i]) for i in range(20))
    index = pipeline.write_shards(tmp_path / "f32", {"t": t}, dtypes={"t": "float32"}, quiet=True)
    assert index.fields["t"] == FieldSpec("float32", (4,))  # every bfloat16 is exact in float32
    assert np.stack(read_back(tmp_path / "f32")[1]["t"]).tobytes() == t.float().numpy().tobytes()


def test_bfloat16_cannot_be_packed_and_a_writer_refuses_it_before_taking_it(tmp_path: Path) -> None:
    """A ShardWriter took the first such sample, then failed every later write and its close to
    pack it: no index could be written; the error named no field."""
    refusal = (r"^sample '000000000000', field 't': a bfloat16 tensor, which a packed record cannot hold \(NumPy, "
               r"which stacks a record's samples, has no bfloat16\): write with pack=1 \(--pack 1\), or as "
               r"float32 \(tensor.float\(\)\)$")
    with pytest.raises(SampleError, match=refusal):
        pipeline.write_shards(tmp_path / "out", {"t": torch.ones(8, dtype=torch.bfloat16)}, pack=4, quiet=True)
    with pipeline.ShardWriter(tmp_path / "writer", pack=2) as writer:
        with pytest.raises(SampleError, match=refusal):
            writer.write({"t": torch.ones(2, dtype=torch.bfloat16)})
        with pytest.raises(SampleError, match=refusal):  # (a column of them: its dtype, looked at once)
            writer.write_columns({"t": torch.ones(4, 2, dtype=torch.bfloat16)})
        for value in range(3):
            writer.write({"t": torch.full((2,), float(value))})
    assert [row.tolist() for row in read_back(tmp_path / "writer")[1]["t"]] == [[0.0] * 2, [1.0] * 2, [2.0] * 2]


def _negated_view(values: torch.Tensor) -> torch.Tensor:
    """``-values`` as a lazy view: the imaginary part of a conjugated complex tensor, a float
    tensor with its negative bit set (``torch.save`` keeps it)."""
    view = torch.complex(torch.zeros_like(values), values).conj().imag
    assert view.is_neg() and torch.equal(view, -values)
    return view


def test_a_tensor_with_its_negative_bit_set_is_stored_as_the_values_it_holds(tmp_path: Path) -> None:
    """.numpy() refuses such a tensor: every converter died with a traceback naming no file."""
    values = torch.randn(6, 3)
    files = tmp_path / "files"
    files.mkdir()
    for n in range(6):
        torch.save(_negated_view(values[n]), files / f"s{n}.pt")
    ids = [f"s{n}" for n in range(6)]
    pipeline.build_sample_files(files, dict.fromkeys(ids, 0), {"train": ids}, tmp_path / "from-files", quiet=True)
    batches = tmp_path / "batches"
    batches.mkdir()
    joblib.dump([_negated_view(values[:3]), _negated_view(values[3:])], batches / "x_3.job")
    joblib.dump([np.zeros(3, np.int64)] * 2, batches / "y_3.job")
    pipeline.build_joblib(batches, tmp_path / "from-joblib", quiet=True)
    pipeline.write_shards(tmp_path / "written", {"x": _negated_view(values)}, quiet=True)
    with pipeline.ShardWriter(tmp_path / "one-by-one") as writer:
        for n in range(6):
            writer.write({"x": _negated_view(values[n])})
    for out in ("from-files/train", "from-joblib", "written", "one-by-one"):
        stored = np.stack(read_back(tmp_path / out)[1]["x"])
        assert np.array_equal(stored, -values.numpy()), out


def test_bfloat16_beside_float32_files_are_told_the_cast_that_builds_them(tmp_path: Path) -> None:
    """The advice was --dtype x=bfloat16, which the build then refused (a cast makes NumPy dtypes)."""
    files = tmp_path / "files"
    files.mkdir()
    values = torch.randn(4, 3).bfloat16()
    for n in range(4):
        torch.save(values[n] if n < 2 else values[n].float(), files / f"s{n}.pt")
    ids = [f"s{n}" for n in range(4)]
    build = dict(labels=dict.fromkeys(ids, 0), partition={"train": ids}, quiet=True)
    with pytest.raises(SampleError, match=r"field 'x' has dtype float32, earlier samples bfloat16; .* build with "
                                          r"--dtype x=float32 \(dtypes=\)"):
        pipeline.build_sample_files(files, out_dir=tmp_path / "out", **build)
    pipeline.build_sample_files(files, out_dir=tmp_path / "out", dtypes={"x": "float32"}, overwrite=True, **build)
    assert np.array_equal(np.stack(read_back(tmp_path / "out" / "train")[1]["x"]), values.float().numpy())
