"""DataLoader workers that die (SIGKILL from the out-of-memory killer, a crash): deaths told
apart from other errors, and explained.

PyTorch's SIGCHLD handler raises a bare ``RuntimeError`` in whatever the main thread runs: a
training step, the ``torch.save`` of a checkpoint (left half written), a ``finally`` block, a
``weakref.finalize`` callback (where it is printed and dropped). :func:`translate_worker_deaths`
raises a death only in the loader: one signalled while the main thread waits for a batch is a
:class:`WorkerError` when the wait ends, which says where the loader stood
(:data:`DEATH_CONTEXTS`) and what to do; one signalled elsewhere is left to the loader's own
watch, which finds it when the loader next waits for that worker (PyTorch's after 5 s, cut by
:class:`~.workers.WatchedWorkersIterator` to a fraction of a second); the batches already
received are delivered first. The main process may also first see a death as a broken pipe
(``ConnectionResetError`` while receiving a tensor from the dying worker).
:func:`exited_workers` tells whether an unexplained error from the loader's queue is a death.
"""

from __future__ import annotations

import multiprocessing.connection
import re
import signal
import threading
import weakref
from typing import Any

_TORCH_DEATH = "DataLoader worker (pid"


class WorkerError(RuntimeError):
    """A DataLoader worker process died: killed by a signal (the out-of-memory killer, often)
    or crashed; or it hangs in its start (see ``START_S``). The loader stops its other workers;
    its ``state_dict()`` still counts only the batches delivered, so the last checkpoint, or a
    state taken now, resumes the epoch exactly, and iterating the loader again continues it with
    new workers."""

    advice = "state_dict() (now, or from the last checkpoint) resumes the epoch exactly."

    @staticmethod
    def cause(death: str) -> str:
        """What most likely killed the worker PyTorch's ``death`` reports dead, and what to do."""
        if "Bus error" in death:  # PyTorch blames shared memory only
            return ("A bus error is memory gone from under a worker: a shard truncated or rewritten in place while "
                    "it was read (local shards are memory-mapped: replace one by renaming a new file over it), or "
                    "/dev/shm full.")
        if "exited with status" in death and "killed by signal" not in death:
            return ("A worker that exits with an error status failed in its start or its own code: its traceback "
                    "is on standard error. A worker started with spawn or forkserver imports the script and "
                    "unpickles the dataset: functions given to it (transforms) must be importable, from a module "
                    "(not a notebook's or python -c's __main__), and the script's own code must run under "
                    "if __name__ == '__main__'.")
        if any(name in death for name in ("Terminated", "User defined signal", "Hangup")):
            return ("Another process signalled it (a job's stop or preemption, a kill; workers let SIGTERM pass, "
                    "and SIGUSR1 and SIGUSR2 where the training process handles them, unless a worker_init_fn undoes "
                    "that): let the training process take such signals, save a checkpoint and exit (README: "
                    "Preemption).")
        return ("A worker killed by the system has often run out of memory: fewer workers, a smaller "
                "prefetch_factor or shuffle_buffer use less.")

    @classmethod
    def explaining(cls, death: str, context: str) -> str:
        """The message of a worker's death: PyTorch's words, where the loader stood, what to do."""
        return f"{death} {context}{cls.advice} {cls.cause(death)}"


def is_worker_death(exc: BaseException) -> bool:
    """Whether ``exc`` reports a dead DataLoader worker: ours, or PyTorch's own RuntimeError."""
    return isinstance(exc, WorkerError) or (type(exc) is RuntimeError and str(exc).startswith(_TORCH_DEATH))


#: For the pid of each running worker, its loader's ``death_context`` (a weak reference: the
#: loader is not kept alive for it), so that a death reported by the signal, in the training
#: step, says where the loader stood as one found by the loader does.
DEATH_CONTEXTS: dict[int, weakref.WeakMethod] = {}


class _HeldDeaths:
    """Deaths reported while the main thread waits for a batch (see
    :meth:`.WatchedWorkersIterator._try_get_data`): how deep in such waits it is, and the first."""

    depth = 0
    error: BaseException | None = None


held_deaths = _HeldDeaths()


def translate_worker_deaths() -> None:
    """Make the RuntimeError that PyTorch's SIGCHLD handler raises for a dead worker a
    :class:`WorkerError` raised by the loader, never in other code (see the module's docstring).
    Call after a multi-worker iterator started (PyTorch installs its handler then); the
    handler installed before keeps running first."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers belong to the main thread
    previous = signal.getsignal(signal.SIGCHLD)
    if getattr(previous, "translates_worker_deaths", False) or not callable(previous):
        return

    def handler(signum: int, frame: Any) -> None:
        try:
            previous(signum, frame)
        except RuntimeError as exc:
            if type(exc) is RuntimeError and str(exc).startswith(_TORCH_DEATH):
                if held_deaths.depth:  # raised when the wait for a batch ends, its cause without the
                    # traceback of this handler, whose frames (the one it interrupted among them) it would keep
                    held = WorkerError(WorkerError.explaining(str(exc).strip(), _death_context(str(exc))))
                    held.__cause__ = RuntimeError(str(exc))
                    held_deaths.error = held_deaths.error or held
                return  # (elsewhere: the loader's watch reports it when the loader next waits for the worker)
            raise

    handler.translates_worker_deaths = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGCHLD, handler)


def _death_context(text: str) -> str:
    """Where the loader of the worker PyTorch's ``text`` reports dead stood, if it is known."""
    try:
        found = re.search(r"\(pid (\d+)\)", text)
        context = DEATH_CONTEXTS.get(int(found.group(1))) if found else None
        loader_context = context() if context is not None else None
        return loader_context() if loader_context is not None else ""
    except Exception:  # noqa: BLE001 - in a signal handler, maybe as the interpreter exits: the message goes without
        return ""


def workers_of(iterator: Any) -> list[Any]:
    return list(getattr(iterator, "_workers", ()))


def exited_workers(iterator: Any, grace: float) -> list[int]:
    """Pids of the workers of ``iterator`` that have exited, waiting up to ``grace`` seconds
    for one to: a worker killed while sending a batch breaks the connection a moment before it
    is gone."""
    sentinels = {}
    for worker in workers_of(iterator):
        try:
            sentinels[worker.sentinel] = worker.pid
        except ValueError:  # a closed process object
            continue
    ready = multiprocessing.connection.wait(list(sentinels), timeout=grace) if sentinels else []
    return sorted(sentinels[s] for s in ready)  # type: ignore[index]


def with_signals(death: str, iterator: Any) -> str:
    """PyTorch's ``death`` message, with the signal that killed each worker it names where it
    does not say (its queue's watch reports only that a worker "exited unexpectedly"), or the
    status it exited with: an error of its own, not the system's kill."""
    for worker in workers_of(iterator):
        code = worker.exitcode if re.search(rf"\b{worker.pid}\b", death) else None
        if code is not None and code < 0 and (signal.strsignal(-code) or "?") not in death:
            death = f"{death} Worker {worker.pid} was killed by signal: {signal.strsignal(-code) or -code}."
        elif code is not None and code > 0:
            death = f"{death} Worker {worker.pid} exited with status {code}."
    return death
