"""A DataLoader worker whose training process is gone (killed: SIGKILL, the out-of-memory killer)
exits, rather than wait for ever to send the messages it had queued.

PyTorch's worker notices the death (its watchdog looks every few seconds) and returns. At its
exit, multiprocessing waits for the thread that feeds each of its queues to write what is left.
A worker's messages cross a pipe whose reading end the worker holds too (a forked child
inherits it), so with nobody reading, a worker that had queued more than the pipe holds (a unit
of text fields is megabytes) waits at its exit for ever, and keeps its memory. Here that wait
is skipped when the process that started the worker is gone: what is left can never be read.
"""

from __future__ import annotations

import multiprocessing.queues
import os
from typing import Any, Callable

import torch.utils.data._utils.worker as torch_worker


def training_gone(training: int, parent: bool) -> bool:
    """Whether the training process (pid ``training``) is gone: this worker's parent no longer
    (``parent``: a worker started with fork or spawn), or no process of that pid any more (a
    worker of forkserver's, whose parent, the server, outlives the training process: each
    worker holds the end of a pipe that keeps the server alive)."""
    if parent:
        return os.getppid() != training
    try:
        os.kill(training, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # (a process of another user's, under the pid it had)
        return True
    try:  # a zombie (killed, and its parent has not reaped it) is gone too
        with open(f"/proc/{training}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):  # (no /proc: the pid is all there is to go by)
        return False


def watch_the_training_process(training: int, parent: bool) -> None:
    """In a worker: PyTorch's watchdog, which ends the worker's loop once its parent is gone,
    takes the parent's pid when that loop begins, after this worker's start: a training process
    killed in between (a worker slow to start on a loaded machine) left the worker's parent
    init, which the watchdog then watched, and the worker waited for indexes from nobody for
    ever. Its parent is not the training process at all under forkserver, and its workers
    outlived a killed training process for ever. This watchdog watches the training process."""
    base = torch_worker.ManagerWatchdog

    class TrainingProcessWatchdog(base):  # type: ignore[misc, valid-type]
        def is_alive(self) -> bool:
            if not self.manager_dead:
                self.manager_dead = training_gone(training, parent)
            return not self.manager_dead

    if os.name == "posix":  # (elsewhere PyTorch watches a handle of its parent's process)
        torch_worker.ManagerWatchdog = TrainingProcessWatchdog  # type: ignore[misc]


def skip_queue_joins_once_orphaned(training: int, parent: bool) -> None:
    """In a worker, before its first message: its queues' exit waits are skipped once the
    training process (``training``, see :func:`training_gone`) is gone (set in this process only)."""
    join: Callable[[Any], None] = multiprocessing.queues.Queue._finalize_join

    def join_unless_orphaned(thread_ref: Any) -> None:
        if training_gone(training, parent):
            return  # no reader left: the feeding thread, a daemon, ends with the process
        join(thread_ref)

    multiprocessing.queues.Queue._finalize_join = staticmethod(join_unless_orphaned)  # type: ignore[method-assign]
