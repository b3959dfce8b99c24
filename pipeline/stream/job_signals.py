"""A job's signals are the training process's to handle, not its DataLoader workers'.

A scheduler that stops or preempts a job signals its whole process group: Slurm's ``scancel``
and time limit, ``torchrun`` passing on its own SIGTERM, ``kill -- -PGID`` send SIGTERM to
every process, workers included; Slurm's ``--signal`` sends SIGUSR1 or SIGUSR2 ahead of the
limit. The training process handles it (the usual way: a handler sets a flag, and the loop
saves a checkpoint after its step and exits). A worker killed by it, though, was a dead worker:
an error raised in the training process while it handled that very signal, and before it could
save. So workers ignore these signals. They still end: the loader stops them (its shutdown,
then SIGKILL for one that does not end, see :mod:`.socket_folder`), and they exit when the
training process is gone (see :mod:`.orphaned_workers`). A handler a worker already has for
SIGUSR1 or SIGUSR2 (a forked worker's copy of the training process's own, ``faulthandler``'s)
stays.
"""

from __future__ import annotations

import signal

#: Signals whose default action (ending the process) would end a worker.
_USER_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def ignore_job_signals() -> None:
    """In a DataLoader worker: ignore SIGTERM, and SIGUSR1 and SIGUSR2 where nothing handles them."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (PyTorch's handler: exit quietly if the parent sent it, else die)
    for number in _USER_SIGNALS:
        if signal.getsignal(number) == signal.SIG_DFL:
            signal.signal(number, signal.SIG_IGN)
