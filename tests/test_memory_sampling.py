"""The soak benchmark's memory breakdown: a process's RSS split into what it holds (anonymous
pages) and what it maps (files, shared memory), so that a slope can be told for what it is."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from pipeline.measure.memory import rss_bytes, rss_parts

MB = 1 << 20


def test_rss_parts_tell_held_memory_from_mapped_files_and_sum_to_the_rss(tmp_path: Path) -> None:
    pid = os.getpid()
    before = rss_parts(pid)
    held = np.ones(64 * MB // 8)  # written: every page resident and private
    after_alloc = rss_parts(pid)
    assert after_alloc["anon"] - before["anon"] >= 60 * MB

    path = tmp_path / "mapped.bin"
    path.write_bytes(os.urandom(32 * MB))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        checksum = sum(mapped[i] for i in range(0, len(mapped), mmap.PAGESIZE))  # fault in every page
        after_map = rss_parts(pid)
        mapped_growth = (after_map["file"] + after_map["shmem"]) - (after_alloc["file"] + after_alloc["shmem"])
        assert mapped_growth >= 30 * MB, (after_alloc, after_map, checksum)
        assert after_map["anon"] - after_alloc["anon"] < 8 * MB
        assert abs(sum(rss_parts(pid).values()) - rss_bytes(pid)) < 4 * MB
    del held


def test_a_gone_process_has_no_memory() -> None:
    assert rss_parts(2**22 + 12345) == {"anon": 0, "file": 0, "shmem": 0}
