"""Samples of gigabytes: what a record may hold, refused where readers would refuse it."""

from __future__ import annotations

import os
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import SampleError


def sparse_bytes(path: Path, size: int) -> np.memmap:
    """``size`` zero bytes that take no room on disk, nor in memory until read."""
    with open(path, "wb") as file:
        file.truncate(size)
    return np.memmap(path, dtype=np.uint8, mode="r")


def test_a_record_over_4_gib_is_refused_when_written_naming_its_key_and_field(tmp_path: Path) -> None:
    """Two arrays of 2.2 GB made a record of 4.4 GB, written without a word, that every reader
    then refused ('member of 4494967363 bytes exceeds the limit'): a build could not mend it."""
    half = sparse_bytes(tmp_path / "half", 2_200_000_000)
    with pipeline.ShardWriter(tmp_path / "out", overwrite=True) as writer:
        with pytest.raises(SampleError, match=re.escape("record '000000000000', field 'b': the record reaches "
                                                        "4,400,000,") + r"\d{3} bytes, beyond the 4,294,967,296 \(4 GiB\)"
                                              r" a record may hold; store the data in several samples"):
            writer.write({"a": half, "b": half, "y": 1})
        writer.write({"a": half[:10], "b": half[:10], "y": 2})
    assert [sample["y"] for _, sample in pipeline.iter_samples(tmp_path / "out")] == [2]


def test_an_array_over_4_gib_is_a_sample_error_not_a_struct_error(tmp_path: Path) -> None:
    """msgpack's extension header holds 32 bits of length: struct.error from deep inside, no key
    nor field named, and a traceback from the command line."""
    whole = sparse_bytes(tmp_path / "whole", (4 << 30) + (1 << 20))
    with pytest.raises(SampleError, match=r"record '000000000000', field 'x': the record reaches 4,29\d,\d{3},\d{3} "
                                          r"bytes, beyond"):
        pipeline.write_shards(tmp_path / "out", {"x": whole[None]}, quiet=True)
    assert not os.path.exists(tmp_path / "out" / "index.json")


def test_a_short_write_goes_on_without_a_copy_of_what_is_left(tmp_path: Path, monkeypatch) -> None:
    """Linux writes less than 2 GiB a call, so a sample of more made a short write, finished
    by joining the rest into one copy: a 2.2 GB sample took 6.5 GB to write. Here each call
    writes at most 1 MiB, as Linux its 2 GiB."""
    real_writev = os.writev

    def capped_writev(fd: int, buffers) -> int:
        room, views = 1 << 20, []
        for part in buffers:
            views.append(memoryview(part)[:room])
            room -= len(views[-1])
        return real_writev(fd, views)

    monkeypatch.setattr(os, "writev", capped_writev)
    data = np.random.default_rng(0).integers(0, 255, (3, 8 << 20), dtype=np.uint8)
    tracemalloc.start()
    try:
        with pipeline.ShardWriter(tmp_path / "out") as writer:
            for i, row in enumerate(data):
                writer.write({"x": row, "i": i})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak  # (no copy of a record's 8 MiB)
    for i, (_, sample) in enumerate(pipeline.iter_samples(tmp_path / "out")):
        assert sample["i"] == i and np.array_equal(sample["x"], data[i])
    assert pipeline.verify(tmp_path / "out") == []
