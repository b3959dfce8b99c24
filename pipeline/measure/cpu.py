"""The CPU time of a process tree (a training process and its DataLoader workers), or of a
server beside it, read from ``/proc``.

Why: on a machine whose cores the loader shares with a storage server, wall time alone cannot
tell a slow client from a busy server; the CPU seconds of each side say where an epoch went,
and how fast the loader could be at most while the server takes its share of the cores.
"""

from __future__ import annotations

import os
import resource
from typing import Collection

from .memory import process_tree

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User and system seconds one process has run so far, all its threads together (0 once
    it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the name may hold spaces and ')'
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime and stime, fields 14 and 15 of stat


def tree_cpu_seconds(root: int, skip: Collection[int] = ()) -> float:
    """User and system seconds the tree of ``root`` (but for ``skip`` and theirs) has run so far:
    its live processes, and, when ``root`` is this process, its children that ended and were
    waited for (a loader's workers of an epoch). The difference of two readings is what the tree
    spent between them."""
    live = sum(process_cpu_seconds(pid) for pid in process_tree(root, skip))
    if root != os.getpid():
        return live
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return live + ended.ru_utime + ended.ru_stime
