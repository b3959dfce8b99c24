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


def skip_queue_joins_once_orphaned() -> None:
    """In a worker, before its first message: its queues' exit waits are skipped once the
    process that started it is gone (set in this process only)."""
    parent = os.getppid()
    # (if the parent is itself a worker, this is its own: its parent gone too, the wait is skipped)
    join: Callable[[Any], None] = multiprocessing.queues.Queue._finalize_join

    def join_unless_orphaned(thread_ref: Any) -> None:
        if os.getppid() != parent:
            return  # no reader left: the feeding thread, a daemon, ends with the process
        join(thread_ref)

    multiprocessing.queues.Queue._finalize_join = staticmethod(join_unless_orphaned)  # type: ignore[method-assign]
