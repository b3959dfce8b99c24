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


def watch_the_training_process(training: int) -> None:
    """In a worker whose parent is the training process (``training``, its pid before the fork):
    PyTorch's watchdog, which ends the worker's loop once its parent is gone, takes the parent's
    pid when that loop begins, after this worker's start: a training process killed in between
    (a worker slow to start on a loaded machine) left the worker's parent init, which the watchdog
    then watched, and the worker waited for indexes from nobody for ever."""
    base = torch_worker.ManagerWatchdog

    class TrainingProcessWatchdog(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.manager_pid = training

    if os.name == "posix":  # (elsewhere PyTorch watches a handle of its parent's process)
        torch_worker.ManagerWatchdog = TrainingProcessWatchdog  # type: ignore[misc]


def skip_queue_joins_once_orphaned(training: int | None = None) -> None:
    """In a worker, before its first message: its queues' exit waits are skipped once the
    process that started it (``training``, where known from before the fork) is gone (set in
    this process only)."""
    parent = os.getppid() if training is None else training
    # (if the parent is itself a worker, this is its own: its parent gone too, the wait is skipped)
    join: Callable[[Any], None] = multiprocessing.queues.Queue._finalize_join

    def join_unless_orphaned(thread_ref: Any) -> None:
        if os.getppid() != parent:
            return  # no reader left: the feeding thread, a daemon, ends with the process
        join(thread_ref)

    multiprocessing.queues.Queue._finalize_join = staticmethod(join_unless_orphaned)  # type: ignore[method-assign]
