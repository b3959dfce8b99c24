"""One measured run, as the build and index benchmarks take it: in a fresh process whose peak
memory belongs to that run alone, timed from durable inputs to durable outputs, on inputs read
once beforehand so that every run starts from the page cache, in a folder with room for it."""

from __future__ import annotations

import os
import resource
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from .common import _CHUNK_BYTES, MB


def _proc_status_mb(field: str) -> float | None:
    """A ``VmXXX`` line of ``/proc/self/status`` in MB (Linux), None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024 / MB


def peak_rss_mb() -> float:
    """This process's peak RSS. ``VmHWM`` rather than ``ru_maxrss``: Linux carries
    ``ru_maxrss`` across ``exec``, so a fresh child would report at least the peak of the
    process that started it."""
    hwm = _proc_status_mb("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB


def current_rss_mb() -> float | None:
    return _proc_status_mb("VmRSS")


def workers_peak_rss_mb() -> float:
    """The peak RSS of the largest child process waited for (``RUSAGE_CHILDREN``), in MB: an
    upper bound of a worker's own, since it carries the peak of this process when it forked."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / MB


def synced_seconds(work: Callable[[], Any]) -> float:
    """Seconds from a clean page cache (``sync``) to ``work`` done and durable (``sync``)."""
    os.sync()
    start = time.perf_counter()
    work()
    os.sync()
    return time.perf_counter() - start


def warm_page_cache(path: Path) -> None:
    """Sync, then read the file, or every file under the folder, once: every reader then starts
    from the page cache."""
    os.sync()
    buffer = bytearray(_CHUNK_BYTES)
    for file in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
        with open(file, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder``: what a run left on disk."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def check_free_space(folder: Path, needed: int, instead: str = "use --tmp elsewhere or smaller sizes") -> None:
    """Stop before a run that would fill the disk; ``instead`` says what to pass to fit."""
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise SystemExit(f"{folder}: {free / 1e9:.1f} GB free, this run needs ~{needed / 1e9:.1f} GB; {instead}")
