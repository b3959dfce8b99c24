"""A resume keeps a finished shard only when its fields are the source's: the same names (none
more: a field dropped from the source since) and arrays of the same rank (an array reshaped since);
rows of arrays are known by position only, so the structure is all that tells such a shard apart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pipeline


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("stopped_with", ["an extra field", "another rank"])
def test_a_resume_rewrites_shards_whose_fields_are_not_the_sources(tmp_path: Path, stopped_with: str) -> None:
    v = np.arange(300 * 3, dtype=np.float32).reshape(300, 3)
    now = {"v": v}
    before = {"v": v, "w": np.arange(300)} if stopped_with == "an extra field" else {"v": v.reshape(300, 3, 1)}
    options = dict(pack=10, shard_samples=100, quiet=True)
    pipeline.write_shards(tmp_path / "whole", now, **options)
    pipeline.write_shards(tmp_path / "out", before, **options)
    for path in (tmp_path / "out").glob("index*"):
        path.unlink()  # killed just before the index was written
    pipeline.write_shards(tmp_path / "out", now, resume=True, **options)
    assert files(tmp_path / "out") == files(tmp_path / "whole")
    assert pipeline.verify(tmp_path / "out") == []
