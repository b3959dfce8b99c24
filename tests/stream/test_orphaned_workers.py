"""A training process killed (SIGKILL, the out-of-memory killer) while its workers were blocked
sending it messages larger than the pipe holds: the workers exit, rather than wait at their exit
for ever to send what they had queued, holding their memory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import start_script, wchan_names_functions
from tests.stream.shardsets import text_shards

SCRIPT = textwrap.dedent("""
    import multiprocessing, os, signal, sys
    sys.path.insert(0, os.getcwd())
    from pipeline import make_loader
    from tests.helpers import worker_blocked_writing

    loader = make_loader(sys.argv[1], num_workers=2, batch_size=64, shuffle_buffer=1024, pin_memory=False)
    batches = iter(loader)
    next(batches)
    workers = [worker.pid for worker in multiprocessing.active_children()]
    worker_blocked_writing(workers)
    print(*workers, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie its new parent has not reaped counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not wchan_names_functions(), reason="finds the writing worker by its wait channel in /proc")
def test_workers_of_a_killed_training_process_exit(tmp_path: Path) -> None:
    assert workers_left_after_the_kill(tmp_path, SCRIPT, workers=2) == []


def workers_left_after_the_kill(tmp_path: Path, script: str, workers: int, reaped: bool = True) -> list[int]:
    """The workers of ``script`` (which prints their pids, then kills itself) still there a minute
    after it was killed (PyTorch's watchdog looks every 5 s); ``reaped``: once the test, its
    parent, has reaped it (else it stays a zombie meanwhile)."""
    text = text_shards(tmp_path / "text")
    run = start_script(tmp_path, script, text, stderr=subprocess.DEVNULL)
    try:
        pids = [int(pid) for pid in run.stdout.readline().split()]
        assert len(pids) == workers
        if reaped:
            run.wait(timeout=60)
            assert run.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 60
        while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [pid for pid in pids if not gone(pid)]
    finally:  # (a worker that waits for ever is not left behind, nor the script unreaped)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=60)


KILLED_AS_WORKERS_START = textwrap.dedent("""
    import multiprocessing, os, signal, sys, threading, time
    sys.path.insert(0, os.getcwd())
    from pipeline import make_loader

    loader = make_loader(sys.argv[1], num_workers=1, batch_size=64, worker_init_fn=lambda worker: time.sleep(2))
    threading.Thread(target=next, args=(iter(loader),), daemon=True).start()  # (forks the worker: 2 s of start)
    while not multiprocessing.active_children():
        time.sleep(0.01)
    print(*[worker.pid for worker in multiprocessing.active_children()], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_worker_still_starting_when_the_training_process_is_killed_exits(tmp_path: Path) -> None:
    """PyTorch's watchdog takes the worker's parent as its loop begins: a training process killed
    while the worker started left init its parent, which the watchdog then watched for ever."""
    assert workers_left_after_the_kill(tmp_path, KILLED_AS_WORKERS_START, workers=1) == []


KILLED_UNDER_FORKSERVER = textwrap.dedent("""
    import multiprocessing, os, signal, sys
    sys.path.insert(0, os.getcwd())
    from pipeline import make_loader

    if __name__ == "__main__":
        loader = make_loader(sys.argv[1], num_workers=2, batch_size=64, multiprocessing_context="forkserver")
        batches = iter(loader)
        next(batches)
        print(*[p.pid for p in multiprocessing.active_children()], flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("reaped", [True, False])
def test_workers_started_by_a_forkserver_exit_when_the_training_process_is_killed(tmp_path: Path,
                                                                                 reaped: bool) -> None:
    """Their parent is the server, which each worker keeps alive (it holds the end of the pipe by
    which the server sees its clients go): PyTorch's watchdog watched the server, and the
    workers, the server and their memory stayed for ever. A killed training process its parent
    has not reaped yet (a zombie) is gone too."""
    assert workers_left_after_the_kill(tmp_path, KILLED_UNDER_FORKSERVER, workers=2, reaped=reaped) == []
