"""ShardWriter.write one sample at a time: what it costs a sample, and that its shards are those
write_columns writes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import ShardWriter


def _python_calls(write, samples: list) -> int:
    calls = 0

    def profile(frame, event, arg) -> None:
        nonlocal calls
        calls += event == "call"

    sys.setprofile(profile)
    try:
        for sample in samples:
            write(sample)
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("pack", [1, 64])
def test_a_sample_like_the_one_before_costs_few_python_calls(tmp_path: Path, pack: int) -> None:
    # a loop of write() is how many users build shards, and pack=1 (the default) is what samples of
    # varied shapes need: its cost was ~140 Python calls a sample (the field types found and merged
    # anew, three RowBlocks, a dtype's name made in Python, each record's parts hashed and written
    # one by one), several times write_columns' cost a sample
    x = np.ones((600, 16), np.float32)
    samples = [{"x": x[i], "y": i, "s": "a" * (i % 3)} for i in range(600)]
    with ShardWriter(tmp_path, pack=pack) as writer:
        _python_calls(writer.write, samples[:64])  # (the first samples set the schema up)
        calls = _python_calls(writer.write, samples[64:576]) / 512
    assert calls < {1: 90, 64: 45}[pack], f"{calls:.0f} Python calls a sample"


@pytest.mark.parametrize("pack", [1, 3])
def test_shards_written_a_sample_at_a_time_are_those_of_write_columns(tmp_path: Path, pack: int) -> None:
    x = np.random.default_rng(0).random((100, 5), dtype=np.float32)
    with ShardWriter(tmp_path / "columns", pack=pack, shard_samples=40) as writer:
        writer.write_columns({"x": x, "y": x[:, :2].astype(np.int16)})
    with ShardWriter(tmp_path / "samples", pack=pack, shard_samples=40) as writer:
        for row in range(100):
            writer.write({"x": x[row], "y": x[row, :2].astype(np.int16)})
    for name in ("shard-000000.tar", "shard-000001.tar", "shard-000002.tar", "index.json"):
        assert (tmp_path / "samples" / name).read_bytes() == (tmp_path / "columns" / name).read_bytes(), name


def test_a_column_of_numbers_in_a_sequence_that_cannot_be_sliced_is_written(tmp_path: Path) -> None:
    """A deque of Python numbers was kept as given, then sliced as shards and records took its
    rows: "sequence index must be integer, not 'slice'"."""
    from collections import deque

    with ShardWriter(tmp_path, pack=2, shard_samples=2) as writer:
        writer.write_columns({"y": deque([1, 2, 3, 4, 5])})
    index = pipeline.load_index(tmp_path)
    assert index.shards.samples.tolist() == [2, 2, 1]
    assert [int(y) for batch in pipeline.make_loader(tmp_path, batch_size=5, shuffle=False) for y in batch["y"]] \
        == [1, 2, 3, 4, 5]
