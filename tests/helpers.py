"""Reading back every sample of a shard set (the ground truth of the tests), and waiting for a
condition that a thread or a process brings about."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

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
    """The child processes of ``pid`` (DataLoader workers, for instance), running or ended but
    not yet reaped, from the parent each process of ``/proc`` names. (Not from the ``children``
    files of ``pid``'s threads: each lists the children its own thread started, which move to
    another thread when it ends, so that a read while a thread ends, or while another reaps a
    child, can miss children that are there: a Dask worker, started by one of Dask's threads.)"""
    children = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:  # (the name in parentheses may hold spaces)
            children.append(int(entry.name))
    return sorted(children)


def started_since(before: set[int]) -> list[int]:
    """Children of this process started since ``before`` (its children then) was taken: a
    loader's workers, not the servers other tests started."""
    return [pid for pid in child_pids(os.getpid()) if pid not in before]


def worker_pids(loader: Any) -> list[int]:
    """The worker processes ``loader`` runs now, as its DataLoader iterator knows them: what a
    test of its workers kills and expects stopped, rather than whatever else this process
    started meanwhile (a server, another thread's subprocess)."""
    return [worker.pid for worker in getattr(loader._iterator, "_workers", ())]


def still_children(pids: list[int]) -> list[int]:
    """Those of ``pids`` that are still children of this process: running, or ended and not
    yet reaped (a worker its loader did not stop and wait for)."""
    return sorted(set(pids) & set(child_pids(os.getpid())))


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


def _waits_in(pid: int) -> list[str]:
    """The kernel functions the threads of process ``pid`` sleep in (``/proc``'s wait channels)."""
    found = []
    for wchan in Path(f"/proc/{pid}/task").glob("*/wchan"):
        with contextlib.suppress(OSError):
            found.append(wchan.read_text().strip())
    return found


@functools.lru_cache(maxsize=None)
def wchan_names_functions() -> bool:
    """Whether ``/proc`` names the kernel function a sleeping process waits in (some kernels and
    sandboxes say ``0``): how tests find a worker blocked writing to a pipe."""
    sleeper = subprocess.Popen(["sleep", "5"])
    try:
        return wait_for(lambda: any(name not in ("", "0") for name in _waits_in(sleeper.pid)), seconds=1)
    finally:
        sleeper.kill()
        sleeper.wait()


def worker_blocked_writing(pids: list[int], seconds: float = 60) -> int:
    """The first of ``pids`` a thread of which is blocked writing to a pipe: a DataLoader worker
    in the middle of a message larger than the pipe holds (its loader reads nothing meanwhile)."""
    found: list[int] = []

    def look() -> bool:
        found[:] = [pid for pid in pids if any("pipe_write" in name for name in _waits_in(pid))]
        return bool(found)
    if not wait_for(look, seconds):
        raise SystemExit(f"no worker was blocked writing to the pipe within {seconds} s")
    return found[0]


def start_script(folder: Path, source: str, *args: Any, stderr: int = subprocess.PIPE) -> subprocess.Popen:
    """``source`` run as a script (written into ``folder``) with ``args``, from the checkout (its
    working folder: ``sys.path.insert(0, os.getcwd())`` lets it import ``tests``), in a session
    of its own: a test can then kill it and every worker it started at once."""
    script = folder / "script.py"
    script.write_text(source)
    return subprocess.Popen([sys.executable, str(script), *map(str, args)], text=True, stdout=subprocess.PIPE,
                            stderr=stderr, start_new_session=True, cwd=Path(__file__).resolve().parents[1])


def run_script(folder: Path, source: str, *args: Any, timeout: float = 120) -> tuple[int, str, str]:
    """:func:`start_script` run to its end: its exit status, standard output and error. Whatever
    happens (a hang ends in ``TimeoutExpired``), no process of it is left behind."""
    run = start_script(folder, source, *args)
    try:
        out, err = run.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
    return run.returncode, out, err


def cached_range(cache: Any, url: str, start: int, stop: int, size: int | None = None) -> bytes:
    """Bytes ``[start, stop)`` of ``url`` read from ``cache`` (a ``ShardCache``) as the loader
    reads a cached shard: its copy, held from eviction, mapped."""
    from pipeline.storage.opener import map_range

    with cache.reading(url, size) as path:
        return bytes(map_range(str(path), start, stop))
