"""``verify`` on damaged shard sets: every cut, every changed byte and a repeated key is a
problem naming the shard (and the record and byte when the reader gets that far)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline
from pipeline.format.records import iter_records
from pipeline.format.tar import BLOCK
from tests.format.crafted import FUZZ, with_checksum


def build(folder: Path, samples: int, width: int) -> Path:
    """One shard of ``samples`` unpacked records with an index."""
    with pipeline.ShardWriter(folder, "part", shard_samples=samples) as writer:
        for i in range(samples):
            writer.write({"i": i, "x": np.full(width, i, np.float32)})
    return folder


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("verify") / "set", samples=6, width=4)


@pytest.fixture
def damaged(built: Path, tmp_path: Path) -> Path:
    """A copy of the set, for one test to damage."""
    return Path(shutil.copytree(built, tmp_path / "copy"))


def test_a_shard_cut_at_every_block_boundary_is_a_problem(damaged: Path) -> None:
    shard = damaged / "part-000000.tar"
    whole = shard.read_bytes()
    assert pipeline.verify(damaged) == []
    for cut in range(0, len(whole), BLOCK):
        shard.write_bytes(whole[:cut])
        assert [str(p) for p in pipeline.verify(damaged)] == [
            f"{shard}: size is {cut} bytes, the index says {len(whole)}"]


@pytest.fixture(scope="module")
def larger(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("verify-large") / "set", samples=40, width=600)


@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_a_larger_shard_cut_anywhere_or_with_a_byte_changed_is_a_problem(larger: Path, data) -> None:
    shard = larger / "part-000000.tar"
    whole = shard.read_bytes()
    try:
        if data.draw(st.booleans(), "cut"):
            shard.write_bytes(whole[:data.draw(st.integers(0, len(whole) - 1), "at")])
        else:
            changed = bytearray(whole)
            changed[data.draw(st.integers(0, len(whole) - 1), "at")] ^= 1 << data.draw(st.integers(0, 7), "bit")
            shard.write_bytes(bytes(changed))
        (problem,) = pipeline.verify(larger)
        assert str(problem).startswith(f"{shard}: ") or str(problem).startswith(f"{shard} record ")
    finally:
        shard.write_bytes(whole)


def test_a_repeated_record_key_is_a_problem(damaged: Path) -> None:
    shard = damaged / "part-000000.tar"
    data = bytearray(shard.read_bytes())
    offsets = [r.offset for r in iter_records(io.BytesIO(bytes(data)), "s")]
    first_key = bytes(data[offsets[0]:offsets[0] + 100])
    data[offsets[3]:offsets[3] + 100] = first_key  # record 3 now has the name of record 0
    data[offsets[3]:offsets[3] + BLOCK] = with_checksum(data[offsets[3]:offsets[3] + BLOCK])
    shard.write_bytes(bytes(data))
    (problem,) = pipeline.verify(damaged)
    assert str(problem) == (f"{shard} record 3 (byte {offsets[3]}): record key '000000000000' "
                            f"appears twice (first at byte {offsets[0]}): the members of a sample must be next to "
                            f"each other (tar --sort=name puts them so)")
