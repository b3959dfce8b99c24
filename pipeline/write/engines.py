"""What runs the tasks of a planned build: this process, a local process pool, or a Dask cluster.

Every engine is a ``concurrent.futures.Executor`` (none at all for a build in this process), so
the build submits the same tasks and gathers the same results whatever runs them, and a Dask
build writes the very shards a single process writes. Tasks are safe to run again: a shard is
written under a temporary name and renamed when complete, and the index is written by the
coordinator from the results, so a task that Dask retries after a failure, or reruns after
its worker died, leaves nothing half-written that an index could name.
"""

from __future__ import annotations

import logging
import os
import socket
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator

from ..interrupts import held_ctrl_c
from .pool_workers import ctrl_c_blocked, pool_context, start_worker
from .portable import AbsolutePathsExecutor

ENGINES = ("local", "dask")
#: Times Dask runs a failed task again before the build fails (a worker that dies is handled
#: by Dask's own ``allowed-failures`` instead).
DASK_RETRIES = 2
#: How long a scheduler's address may take to accept a connection before a build refuses it.
_SCHEDULER_TIMEOUT_S = 10


@dataclass(frozen=True)
class Workers:
    """The executor of a build (``None``: run the tasks here, one after another) and how many
    tasks it runs at once, which sets how finely the build is cut into tasks."""

    executor: Executor | None
    slots: int
    elsewhere: bool = False  # the workers of a running cluster: in folders of their own, maybe on other machines


def check_engine(engine: str, scheduler: str | None = None, executor: Executor | None = None) -> None:
    """Refuse a combination that cannot run (before a build touches its output)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r} (choose from {', '.join(ENGINES)})")
    if engine == "dask":
        if executor is not None:
            raise ValueError("give an executor or engine='dask', not both")
        try:
            import distributed  # noqa: F401
        except ImportError:
            raise ImportError("engine 'dask' needs the dask and distributed packages: "
                              "pip install 'pipeline[dask]'") from None
        if scheduler is not None:
            _check_scheduler(scheduler)
    elif scheduler is not None:
        raise ValueError("a scheduler address needs engine='dask' (--engine dask)")


def _check_scheduler(address: str) -> None:
    """Refuse a scheduler address that is not one, or that nothing answers at: Dask's client
    would wait 30 s, then fail after the build made its output folder and plan."""
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        kind, location = parse_address(address)
        host, port = parse_host_port(location) if kind in ("tcp", "tls") else (None, None)
    except ValueError as exc:
        raise ValueError(f"scheduler {address!r} is not a Dask scheduler's address ({exc}): give it as "
                         f"tcp://HOST:PORT (8786 by default)") from None
    if host is None:  # another transport (inproc, ucx): Dask's client says what it finds
        return
    try:
        socket.create_connection((host, port), timeout=_SCHEDULER_TIMEOUT_S).close()
    except OSError as exc:
        raise ValueError(f"no Dask scheduler answers at {address} ({exc.strerror or exc}): start one there "
                         f"(dask scheduler), or give the address it prints; nothing was written") from None


@contextmanager
def open_workers(engine: str = "local", workers: int = 1, scheduler: str | None = None,
                 executor: Executor | None = None) -> Iterator[Workers]:
    """The workers of a build, released (pool shut down, cluster closed) on exit.

    ``engine="local"``: ``executor`` if given, else ``workers`` spawned processes (none when
    ``workers <= 1``). ``engine="dask"``: a client of the cluster at ``scheduler``, or of a
    cluster of ``workers`` processes started on this machine for the build. The caller has
    called :func:`check_engine` first, before the build touched its output.
    """
    if engine == "dask":
        with _dask_workers(scheduler, workers) as found:
            yield found
    elif executor is not None:
        yield Workers(executor, max(workers, 1))
    elif workers <= 1:
        yield Workers(None, 1)
    else:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=pool_context(), initializer=start_worker,
                                   initargs=(os.getpid(),))
        try:
            yield Workers(pool, workers)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def _dask_workers(scheduler: str | None, workers: int) -> Iterator[Workers]:
    from distributed import Client, LocalCluster
    from distributed.utils import LoopRunner

    from .dask_quiet import NANNY_KILLED, QuietCancelledTasks, Without

    with ExitStack() as stack:
        if scheduler is None:
            # a terminal's Ctrl-C reaches the local cluster's worker processes too, which print pages of
            # tracebacks (cut while importing, or waiting for work): they are started from the cluster's loop
            # thread, and inherit its mask, so that thread starts with SIGINT blocked. The build alone takes
            # Ctrl-C, and closes the cluster, which stops its workers
            loop = LoopRunner()
            with ctrl_c_blocked():
                loop.start()
            stack.callback(loop.stop)
            killed = Without(NANNY_KILLED)  # (see dask_quiet: removed once the cluster is closed)
            logging.getLogger("distributed.nanny").addFilter(killed)
            stack.callback(logging.getLogger("distributed.nanny").removeFilter, killed)
        # cut while it starts, a cluster is left half-started, which distributed's exit handler then fails to
        # close, printing its traceback after the build's "interrupted" line: Ctrl-C waits for the start (twice,
        # it cuts at once), then closes what started
        with held_ctrl_c(second_at_once=True):
            if scheduler is None:
                cluster = stack.enter_context(LocalCluster(
                    n_workers=max(workers, 1), threads_per_worker=1, processes=True, host="127.0.0.1",
                    dashboard_address=":0", loop=loop.loop))  # any free port: 8787 may be another cluster's
                client = stack.enter_context(Client(cluster))
                client.register_plugin(QuietCancelledTasks())
            else:
                client = stack.enter_context(Client(scheduler))
        slots = sum(client.nthreads().values())
        executor = client.get_executor(retries=DASK_RETRIES, pure=False)
        # a running cluster's workers work in folders of their own: relative paths would name other files
        if scheduler is None:
            yield Workers(executor, max(slots, 1))
        else:
            yield Workers(AbsolutePathsExecutor(executor), max(slots, 1), elsewhere=True)
