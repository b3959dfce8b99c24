"""Reading back every sample of a shard set (the ground truth of the tests), and waiting for a
condition that a thread or a process brings about."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import pipeline


def read_back(out_dir: Path) -> tuple[list[str], dict[str, list]]:
    """Every sample of the index in ``out_dir``, in order: the keys and each field's values."""
    keys: list[str] = []
    fields: dict[str, list] = {}
    index = pipeline.load_index(out_dir)
    for key, sample in pipeline.iter_samples(Path(out_dir) / "index.json", index):
        keys.append(key)
        for name, value in sample.items():
            fields.setdefault(name, []).append(value)
    return keys, fields


def command_line(pid: int) -> str:
    """The command line of ``pid`` (its arguments joined by NULs), or "" once it has ended."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
        return ""


def child_pids(pid: int) -> list[int]:
    """The live child processes of ``pid`` (DataLoader workers, for instance), from ``/proc``."""
    children = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:  # the process has ended
        return []
    for task in tasks:
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:  # a thread that has just ended
            continue
    return sorted(children)


def started_since(before: set[int]) -> list[int]:
    """Children of this process started since ``before`` (its children then) was taken: a
    loader's workers, not the servers other tests started."""
    return [pid for pid in child_pids(os.getpid()) if pid not in before]


def index_content(index: pipeline.DatasetIndex) -> tuple:
    """Everything an index says, as plain values (for comparing two indexes)."""
    shards = [(s.url, s.samples, s.records, s.bytes, s.sha256, [int(o) for o in s.offsets]) for s in index.shards]
    return index.fields, index.pack, index.part, shards


def wait_for(condition: Callable[[], bool], seconds: float = 10) -> bool:
    """Whether ``condition()`` holds within ``seconds``, looking every 20 ms."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()
