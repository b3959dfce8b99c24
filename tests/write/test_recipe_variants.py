"""The classic recipes' files as they are found: joblib batches padded each to its own length,
and one file per sample saved as a view of a larger tensor (``torch.save(x[i])`` writes all of
``x``)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import joblib
import numpy as np
import pytest
import torch

import pipeline
from pipeline.cli_values import shard_bytes
from tests.helpers import read_back


def test_numbered_files_of_samples_padded_to_each_batchs_length_build_as_a_field_that_varies(tmp_path: Path) -> None:
    """A read across two files joined their batches with np.concatenate: NumPy's own error, no
    file named, and a build that depended on where shards ended (shard_samples=4: built)."""
    folder = tmp_path / "batches"
    folder.mkdir()
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((4, width)) for width in (3, 4, 5)]
    for n, batch in enumerate(batches):
        joblib.dump(batch, folder / f"x_{n}.job")
        joblib.dump(np.arange(4), folder / f"y_{n}.job")
    for name, options in (("default", {}), ("by-file", {"shard_samples": 4})):
        index = pipeline.build_joblib(folder, tmp_path / name, quiet=True, **options)
        assert index.fields["x"].shape == (None,)
        stored = read_back(tmp_path / name)[1]["x"]
        assert [np.asarray(v).tolist() for v in stored] == [row.tolist() for batch in batches for row in batch], name


def test_sample_files_that_hold_more_than_their_samples_are_told_the_shard_samples_that_fills_shards(
        tmp_path: Path) -> None:
    """torch.save(x[i]) writes all of x: shards cut by the files' sizes came out 40 of 24 KB
    where shard_bytes asked for one, without a word."""
    batch = torch.randn(200, 100)
    ids = [f"s{n:03d}" for n in range(200)]
    for saved, sample in (("views", lambda n: batch[n]), ("clones", lambda n: batch[n].clone())):
        (tmp_path / saved).mkdir()
        for n, name in enumerate(ids):
            torch.save(sample(n), tmp_path / saved / f"{name}.pt")
    build = dict(labels=dict.fromkeys(ids, 0), partition={"train": ids}, shard_bytes=64 << 10, quiet=True)
    with pytest.warns(UserWarning, match=r"shards average [\d,]+ bytes, under a quarter of shard_bytes=65,536: .* "
                                         r"give shard_samples=(\d+) and shard_bytes=None") as caught:
        pipeline.build_sample_files(tmp_path / "views", out_dir=tmp_path / "small", **build)
    fitting = int(re.search(r"shard_samples=(\d+)", str(caught[0].message)).group(1))
    advised = re.search(r"--shard-samples \d+ --shard-bytes (\w+)\)$", str(caught[0].message)).group(1)
    assert shard_bytes(advised) is None  # (the command line it advises runs, with no size limit, as in Python)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipeline.build_sample_files(tmp_path / "clones", out_dir=tmp_path / "full", **build)
        fitted = pipeline.build_sample_files(tmp_path / "views", out_dir=tmp_path / "fitted",
                                             **{**build, "shard_samples": fitting, "shard_bytes": None})
    assert len(fitted["train"].shards) == -(-200 // fitting)
    assert all(48 << 10 < shard.bytes <= 64 << 10 for shard in fitted["train"].shards[:-1])  # about shard_bytes
