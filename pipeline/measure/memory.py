"""The memory of a process tree (a training process and its DataLoader workers), sampled from
``/proc`` while it runs.

RSS counts a page shared by several processes (shared-memory batches, the page cache of a
mapped shard, the copy-on-write pages of a forked worker) once per process; PSS splits it
between them, so the PSS of a tree sums to what it really holds. Both are reported: RSS is
cheap to read, PSS is the one to budget with.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Collection

_PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 1e6


def process_tree(root: int, skip: Collection[int] = ()) -> list[int]:
    """``root`` and all its descendants (parents read from ``/proc/PID/stat``), but for those
    in ``skip`` and theirs."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])  # the name may hold spaces and ')'
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in skip:
            continue
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def rss_bytes(pid: int) -> int:
    """Resident bytes of one process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError):
        return 0


def pss_bytes(pid: int) -> int:
    """Proportional set size of one process (0 once it is gone, or where the kernel has no
    ``smaps_rollup``)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_parts(pid: int) -> dict[str, int]:
    """Resident bytes of one process by kind (``/proc/PID/status``): ``anon`` (heaps, stacks,
    copy-on-write pages), ``file`` (mapped libraries and files, faulted in as code and data are
    first touched) and ``shmem`` (shared memory); zeros once it is gone. Why: growth in ``file``
    is pages of libraries a process has only now run, which the kernel can drop and take back;
    growth in ``anon`` is memory the process holds."""
    fields = {"RssAnon:": "anon", "RssFile:": "file", "RssShmem:": "shmem"}
    parts = dict.fromkeys(fields.values(), 0)
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition("\t")
                if name in fields:
                    parts[fields[name]] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return parts


class TreeMemory(threading.Thread):
    """Samples the summed RSS (and, with ``pss``, PSS) of a process tree every ``interval``
    seconds until stopped (leaving out the processes in ``skip`` and their descendants: servers
    a benchmark started, say): peaks, the most processes seen, and a timeline of (time, RSS MB)."""

    def __init__(self, root: int, pss: bool = False, interval: float = 0.05, skip: Collection[int] = ()) -> None:
        super().__init__(daemon=True)
        self.root, self.pss, self.interval, self.skip = root, pss, interval, skip
        self.peak_rss = self.peak_pss = self.peak_processes = 0
        self.timeline: list[tuple[float, float]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            pids = process_tree(self.root, self.skip)
            rss = sum(rss_bytes(p) for p in pids)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_processes = max(self.peak_processes, len(pids))
            if self.pss:
                self.peak_pss = max(self.peak_pss, sum(pss_bytes(p) for p in pids))
            self.timeline.append((time.time(), round(rss / MB, 1)))
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
