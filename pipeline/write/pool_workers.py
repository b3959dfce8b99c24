"""The processes of a local build's pool: spawned, gone with their build, quiet on Ctrl-C.

A terminal's Ctrl-C reaches every process of the foreground group: the build, which stops and
says how to finish (:mod:`pipeline.interrupts`), and its pool's workers. A worker interrupted
while it starts (importing NumPy, say) or while it waits for work would print a traceback of
its own, pages of them above the build's one line. So a worker starts with SIGINT blocked (a
signal mask survives the spawn's exec), and then takes Ctrl-C only while it runs a task
(:func:`interruptible_task`): the task raises KeyboardInterrupt, which the pool hands to the
build as the task's outcome, and the shard it was writing stays a temporary file, which a
resumed build removes. An idle worker lets it pass: the build, interrupted too, shuts its pool
down, and the worker ends as it would at the build's end.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from contextlib import contextmanager
from multiprocessing import resource_tracker
from multiprocessing.context import SpawnContext, SpawnProcess
from types import FrameType
from typing import Iterator

from ..interrupts import interrupt


@contextmanager
def ctrl_c_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread while the block runs: the processes it starts (spawned or
    forked) and the threads it starts keep it blocked, a signal mask surviving exec. A press in
    the meantime goes to a thread that takes it (the main thread, once it unblocks)."""
    resource_tracker.ensure_running()  # its own first start unblocks SIGINT: that comes first
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class _QuietStartProcess(SpawnProcess):
    """A spawned process that starts with SIGINT blocked, until :func:`start_worker` runs."""

    def start(self) -> None:
        with ctrl_c_blocked():
            super().start()


class _QuietStartContext(SpawnContext):
    Process = _QuietStartProcess


def pool_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context of a build's pool (spawn: the build may hold threads, which a
    fork would copy mid-work)."""
    return _QuietStartContext()


class _Tasks:
    running = 0  # tasks this worker runs now (0 or 1: a pool worker runs one at a time)


def start_worker(parent: int) -> None:
    """The pool's initializer: take Ctrl-C only in a task (one pressed while starting, held until
    now, passes), and end with the build (:func:`exit_with_parent`). A build that ignores SIGINT
    (started with ``nohup``, or in the background of a script) has workers that ignore it too."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # inherited through the spawn's exec
        signal.signal(signal.SIGINT, _interrupt_task)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    exit_with_parent(parent)


def _interrupt_task(signum: int, frame: FrameType | None) -> None:
    if _Tasks.running:
        interrupt(signum, frame)


@contextmanager
def interruptible_task() -> Iterator[None]:
    """Run a task of the build: in a pool worker, Ctrl-C interrupts it (see the module
    docstring); elsewhere nothing changes."""
    _Tasks.running += 1
    try:
        yield
    finally:
        _Tasks.running -= 1


def exit_with_parent(parent: int, every: float = 0.5) -> None:
    """Make this pool worker exit once the build that started it is gone (killed by SIGKILL, say,
    which gives it no chance to stop its pool): else it would go on writing shards under the
    names a resumed build writes too, then wait forever for work. A daemon thread watches the
    parent's pid; the shard being written stays a temporary file, which a resume removes."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
