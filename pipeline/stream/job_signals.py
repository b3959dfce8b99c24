"""A job's signals are the training process's to handle, not its DataLoader workers'.

A scheduler that stops or preempts a job signals its whole process group: Slurm's ``scancel``
and time limit, ``torchrun`` passing on its own SIGTERM, ``kill -- -PGID`` send SIGTERM to
every process, workers included; Slurm's ``--signal`` sends SIGUSR1 or SIGUSR2 ahead of the
limit. The training process handles it (the usual way: a handler sets a flag, and the loop
saves a checkpoint after its step and exits). A worker killed by it, though, was a dead worker:
an error raised in the training process while it handled that very signal, and before it could
save. So workers take these signals and do nothing: SIGTERM always, SIGUSR1 and SIGUSR2 where
the training process handles them in Python (a worker started with spawn or forkserver has no
handler of its own, and one forked has a copy of the training process's; a C handler, such as
``faulthandler``'s, is left as it is). A handler that does nothing, not an ignored signal: a
program a transform runs is reset to the default on ``exec``, and stops when told. Workers
still end: the loader stops them (its shutdown, then SIGKILL for one that does not end, see
:mod:`.socket_folder`), and they exit when the training process is gone (see
:mod:`.orphaned_workers`).

A signal that comes as workers start, before they have their handlers, would still end them: the
training process holds the job's signals blocked while it starts them (:func:`job_signals_held`),
a worker inherits that mask (through ``fork`` and ``exec``), and unblocks them once its handlers
are set; a signal that came meanwhile is delivered then, to each process's handler.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from multiprocessing import forkserver, resource_tracker
from typing import Any, Iterator

#: Signals whose default action (ending the process) would end a worker.
_USER_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
JOB_SIGNALS = (signal.SIGTERM, *_USER_SIGNALS)


@contextmanager
def job_signals_held(start_method: str) -> Iterator[None]:
    """In the training process, while it starts workers: the job's signals blocked in this
    thread (pending, and delivered once the block ends). The processes multiprocessing shares
    with every other user of this one (forkserver's server, the resource tracker) are started
    first, outside the block: inherited, it would hold for them and all they start (a Pool's
    workers that its terminate() could not stop). Under forkserver, workers are the server's
    children, and not covered as they start."""
    if start_method in ("spawn", "forkserver"):
        resource_tracker.ensure_running()
    if start_method == "forkserver":
        forkserver.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, JOB_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def handled_user_signals() -> tuple[int, ...]:
    """Of SIGUSR1 and SIGUSR2, those the training process handles in Python."""
    return tuple(int(number) for number in _USER_SIGNALS if callable(signal.getsignal(number)))


def ignore_job_signals(handled: tuple[int, ...]) -> None:
    """In a DataLoader worker: do nothing on SIGTERM, nor on those of ``handled`` (see
    :func:`handled_user_signals`) that nothing handles here; then unblock them."""
    signal.signal(signal.SIGTERM, _ignored)  # (PyTorch's handler: exit quietly if the parent sent it, else die)
    for number in handled:
        if signal.getsignal(number) == signal.SIG_DFL:
            signal.signal(number, _ignored)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, JOB_SIGNALS)


def _ignored(signum: int, frame: Any) -> None:
    """The job's signal, in a worker: the training process decides what to do about it."""
