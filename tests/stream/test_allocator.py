"""glibc's mmap threshold, fixed in the workers that read remote shards."""

from __future__ import annotations

import ctypes
import os
import platform

from pipeline.stream.allocator import fix_mmap_threshold


def test_the_mmap_threshold_is_fixed_once_a_process_where_the_c_library_is_glibc() -> None:
    glibc = platform.libc_ver()[0] == "glibc"
    assert fix_mmap_threshold(os.getpid()) is glibc
    assert fix_mmap_threshold(os.getpid()) is glibc and fix_mmap_threshold.cache_info().hits >= 1
    if glibc:
        assert ctypes.CDLL("libc.so.6").mallopt(-3, 128 << 10) == 1
