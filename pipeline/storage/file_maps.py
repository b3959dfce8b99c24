"""Ranges of local files as views of one mapping a file, for the reads of one unit."""

from __future__ import annotations

import os
import threading

from .opener import check_range, local_path, map_file


class FileMaps:
    """Read-only views of local files' pages, each from one mapping of its whole file.

    Why: a mapping made for each range read was one a piece until the unit the piece went
    into was gathered: a unit of thousands of small pieces (a small source drawn many times in a
    mix) made as many mappings (each held a descriptor then: see :mod:`.page_maps`). Made for one
    unit and let go of after it: a mapping kept longer would keep every page read through it in
    the process's resident memory.

    A file replaced since it was mapped (a cache's copy downloaded again) is mapped again: each
    read compares the file's status with the mapping's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # (a unit's pieces may be read by several threads)
        self._maps: dict[str, tuple[memoryview, tuple[int, ...]]] = {}

    def range(self, url: str, start: int, stop: int) -> memoryview:
        """Bytes ``[start, stop)`` of the local file ``url``, checked as ``map_range`` checks them."""
        check_range(url, start, stop)
        try:
            now = _identity(os.stat(local_path(url)))
        except OSError:
            now = None  # (the mapping's open names the failure)
        with self._lock:
            mapped = self._maps.get(url)
            if mapped is None or mapped[1] != now:
                whole, status = map_file(url, start)
                mapped = self._maps[url] = (whole, _identity(status))
        check_range(url, start, stop, len(mapped[0]))
        return mapped[0][start:stop]


def _identity(status: os.stat_result) -> tuple[int, ...]:
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns
