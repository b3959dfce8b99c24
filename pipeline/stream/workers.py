"""DataLoader workers that fail: errors relayed with their type and fields, deaths told apart.

Two things go wrong in a worker, and PyTorch reports both badly:

- **An exception in the worker.** PyTorch rebuilds it in the main process from its formatted
  traceback (``Caught SourceError in DataLoader worker process 0. Original Traceback...``), so
  our errors lose their fields (``url``, ``offset``) and the line that matters comes last.
  Instead, the worker sends a :class:`.WorkerFailure` (the pickled exception, which keeps its
  type and fields, and the worker's traceback as text) as its last message, and the loader
  raises the exception itself, the worker's traceback attached as a note.
- **A worker that dies** (SIGKILL from the out-of-memory killer, a crash): see
  :mod:`.worker_deaths`. :class:`WatchedWorkersIterator` checks that its workers live every
  :data:`WATCH_S` while it waits for a batch (PyTorch checks every 5 s), and holds the deaths
  the signal reports until the wait ends; :func:`stop_workers` takes the workers' pids out of
  the handler's watch before shutting them down, so that a second death signal cannot interrupt
  the shutdown.

And one thing goes wrong when nothing fails: **an iterator freed by the garbage collector.** A
loader in a reference cycle (an exception's traceback holds the training loop's frame, and the
loader with it) is freed by a collection, which first runs the weakref callbacks of everything
in the cycle, among them the one by which each of the iterator's multiprocessing queues stops
the thread that feeds its pipe, and only then ``__del__``: DataLoader's shutdown then puts its
stop message on queues that send nothing any more, and waits 5 s per worker before killing
them, in whatever thread the collection ran. :class:`WatchedWorkersIterator` keeps its queues
in a table of this module until its workers are stopped, so that they are never part of such
a cycle (the iterator itself is not kept: it goes when its loader and loop let go of it).

Nor when a script ends with its loader alive (persistent workers, as ``make_loader`` starts
them): multiprocessing's exit handler would terminate the workers (SIGTERM), and their
temporary folders (``/tmp/pymp-*``, see :mod:`.socket_folder`) would stay behind, two a run
with two workers. The workers still running are stopped first, as a loader stops them, so that
they end as they should and their folders go (:func:`_stop_at_exit`).
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing.connection
import multiprocessing.process
import os
import sys
import time
import weakref
from typing import Any, Callable

from torch.utils.data import get_worker_info
from torch.utils.data._utils import signal_handling
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from ..storage.retry import abandon_process_reads_when, answered_hosts, take_answered_hosts
from .job_signals import handled_user_signals, ignore_job_signals, job_signals_held
from .message_buffers import ReleaseTable, WorkerBuffers, install
from .orphaned_workers import skip_queue_joins_once_orphaned, watch_the_training_process
from .shared_events import SetHere
from .socket_folder import make_worker_folders, remove_worker_folders, take_worker_folder
from .whole_messages import WholeMessages
from .worker_deaths import DEATH_CONTEXTS, WorkerError, held_deaths, workers_of

#: Seconds between two checks that the workers live while the loader waits for a batch.
WATCH_S = 0.25
#: Seconds a worker may take from its fork to its first line (a spawned one imports and unpickles
#: meanwhile) before it is taken for hung (see :meth:`WatchedWorkersIterator._check_started`).
START_S = 300.0


class LoaderWorker:
    """The ``worker_init_fn`` of a ShardLoader's workers: it makes the worker's copy of the
    dataset send each unit of the plan as one message (so that DataLoader's round robin delivers
    the units in their order), in shared memory reused once the main process releases it
    (``released``), and its errors as a :class:`.WorkerFailure`, both of which only a
    ShardLoader understands (the user's own dataset object, also usable in a plain DataLoader,
    is left as it is). It leaves what the worker inherited out of its garbage collections, then
    runs ``then``, the ``worker_init_fn`` given to the loader. Picklable when ``then`` is, for
    workers started with spawn."""

    def __init__(self, then: Callable[[int], None] | None, released: ReleaseTable) -> None:
        self.then = then
        self.released = released
        self.shutdown: Any = None  # the multiprocessing Event its iterator sets when it stops its workers
        self.started: Any = None  # a shared byte per worker, set as the worker starts (see START_S)
        self.answered: frozenset[str] = frozenset()  # the hosts that answered the training process
        self.training = 0  # the training process's pid
        self.training_is_parent = True  # whether it is the workers' parent (not under forkserver)
        self.folders: list[str] = []  # each worker's temporary folder, made by its loader (see socket_folder)
        self.armed = False  # set while its ShardLoader's iterator starts workers: any other start is refused
        self.handled_signals: tuple[int, ...] = ()  # SIGUSR1 and SIGUSR2 if the training process handles them

    def __getstate__(self) -> dict[str, Any]:
        """Handed to workers (armed), all of it; in a copy of its loader (``copy.deepcopy``, a
        pickle for another process), not what its last iterator shared with its workers, which
        the copy's first loop makes anew (an Event is copied only to the processes it starts)."""
        state = dict(self.__dict__)
        if not self.armed:
            state.update(shutdown=None, started=None, folders=[])
        return state

    def __call__(self, worker_id: int) -> None:
        if not self.armed:
            raise RuntimeError(
                "this DataLoader was made from a ShardLoader's attributes (its worker_init_fn), and its workers would "
                "send the ShardLoader's unit messages, not batches: iterate the ShardLoader itself. A framework that "
                "rebuilds the loader it is given (Hugging Face Trainer as it resumes, Accelerate's prepare) needs the "
                "recipes of the README's section on PyTorch Lightning, Accelerate and Trainer")
        # (armed, its iterator has set what follows: see WatchedWorkersIterator.__init__)
        self.started[worker_id] = 1
        ignore_job_signals(self.handled_signals)
        take_worker_folder(self.folders[worker_id])
        # What the worker inherited from the training process (its model, a labels dict) is
        # left out of the worker's garbage collections: a collection writes to every object it
        # visits, which copies each page of them into the worker (copy-on-write) and costs CPU
        # in a worker that allocates many objects (a request's headers, over S3: 10% of its CPU)
        gc.freeze()
        abandon_process_reads_when(self.shutdown)  # a read that retries when the loader stops its workers gives up
        take_answered_hosts(self.answered)  # as a forked worker inherits them (a spawned one does not)
        watch_the_training_process(self.training, self.training_is_parent)
        skip_queue_joins_once_orphaned(self.training, self.training_is_parent)
        info = get_worker_info()
        if info is not None:
            info.dataset.relay_errors = True  # type: ignore[union-attr]
            info.dataset.unit_messages = True  # type: ignore[union-attr]
            if info.dataset.finishing.plain:  # type: ignore[union-attr]
                # not under transforms: a transform may hide a buffer in an object of its own,
                # which no walk finds and DataLoader's pinning does not copy
                install(WorkerBuffers(self.released, worker_id))
        if self.then is not None:
            self.then(worker_id)


#: The queues of each worker iterator whose workers run, by ``id`` of the iterator: held here
#: (see the module docstring) from the start of its workers to their stop.
_QUEUES: dict[int, list[Any]] = {}


#: The iterators whose workers run (not kept alive for it): stopped at exit.
_RUNNING: "weakref.WeakSet[WatchedWorkersIterator]" = weakref.WeakSet()


class WatchedWorkersIterator(_MultiProcessingDataLoaderIter):
    """DataLoader's iterator over worker processes, its wait for a batch cut into slices of
    :data:`WATCH_S`, each ending in PyTorch's check that the workers live (a ``timeout`` given
    to the loader is kept: it is passed in). Its queues are held in :data:`_QUEUES`, and it is
    in :data:`_RUNNING`, until its workers are stopped: through class attributes, which the
    interpreter's finalization, when a loader left alive by a script goes, does not clear as it
    clears module names."""

    _held_queues = _QUEUES
    _running = _RUNNING
    _contexts = DEATH_CONTEXTS
    _finalizing = staticmethod(sys.is_finalizing)
    _getpid = staticmethod(os.getpid)
    _remove_folders = staticmethod(remove_worker_folders)

    def __init__(self, loader: Any) -> None:
        self._abandon_reads = self._started = None
        self._owner = os.getpid()
        self._forked = time.monotonic()
        self._folders: list[str] = []
        context = loader.multiprocessing_context or multiprocessing.get_context()
        start_method = context.get_start_method()
        armed = isinstance(loader.worker_init_fn, LoaderWorker)
        if armed:  # handed to the workers it starts
            self._folders = loader.worker_init_fn.folders = make_worker_folders(loader.num_workers)
            self._abandon_reads = loader.worker_init_fn.shutdown = context.Event()
            self._started = loader.worker_init_fn.started = context.Array("b", loader.num_workers, lock=False)
            loader.worker_init_fn.answered = answered_hosts()
            loader.worker_init_fn.training = os.getpid()
            loader.worker_init_fn.handled_signals = handled_user_signals()
            # (forkserver's workers are the server's children)
            loader.worker_init_fn.training_is_parent = start_method in ("fork", "spawn")
        loader._starting = self  # cut in what follows (Ctrl-C pressed twice), it is the loader's to stop
        if armed:  # (its workers take it armed: forked, or pickled as they start)
            loader.worker_init_fn.armed = True
        try:
            with job_signals_held(start_method):  # (a worker inherits it, and lifts it once its handlers are set)
                super().__init__(loader)
        finally:
            if armed:
                loader.worker_init_fn.armed = False
        loader._starting = None
        # set here without their lock, which a worker killed at the wrong moment keeps (see shared_events)
        self._workers_done_event = SetHere(self._workers_done_event)
        if self._abandon_reads is not None:
            self._abandon_reads = SetHere(self._abandon_reads)
        self._whole_messages.workers = self._workers
        self._running.add(self)
        self._held_queues[id(self)] = [*self._index_queues, self._worker_result_queue]
        self._contexts.update((worker.pid, weakref.WeakMethod(loader.death_context)) for worker in self._workers)

    @property
    def _worker_result_queue(self) -> Any:
        try:
            return self.__dict__["_results"]
        except KeyError:
            raise AttributeError("_worker_result_queue") from None

    @_worker_result_queue.setter
    def _worker_result_queue(self, results: Any) -> None:
        """Read so that a message a dead worker left cut short blocks nothing (see whole_messages):
        set as PyTorch makes the queue, before its pinning thread reads it."""
        self._whole_messages = WholeMessages(results, WATCH_S)
        results.get = self._whole_messages.get
        self.__dict__["_results"] = results

    def _get_data(self) -> Any:
        try:
            return super()._get_data()
        except RuntimeError as exc:
            if not (self._timeout > 0 and str(exc).startswith("DataLoader timed out")):
                raise
            batches = unit_batches(self._dataset)
            raise RuntimeError(f"{exc}: no unit of {batches} batches came from the workers in that time (timeout= is "
                               f"a batch's, {self._timeout / batches:g} s; a worker sends a unit's batches at once)"
                               ) from None

    def _try_get_data(self, timeout: float = WATCH_S) -> tuple[bool, Any]:
        """PyTorch's wait for a batch, with deaths the SIGCHLD handler reports held until it
        ends: raised in its middle, one would cut short what it does when a receive fails (it
        opens ten temporary files to see whether file descriptors ran out: one interrupted
        between being made and being wrapped is left in the temporary folder), and the wait
        finds a dead worker itself."""
        held_deaths.depth += 1
        try:
            got = super()._try_get_data(timeout)
        finally:
            held_deaths.depth -= 1
            held, held_deaths.error = held_deaths.error, None
        if held is not None:  # (an error the wait raised itself, about the same death, goes first)
            try:
                raise held
            finally:  # not kept in this frame, which its traceback holds: a cycle would keep the
                del held  # iterator alive until a collection, maybe in a worker forked later
        if not got[0]:
            if self._shutdown:  # by another thread (a loop begun there): nothing more comes, and PyTorch would wait on
                raise RuntimeError("the workers of this loop were stopped in another thread while it waited for a "
                                   "batch")
            self._check_started()
        return got

    def _check_started(self) -> None:
        """A worker alive but not started :data:`START_S` after its fork hangs in it, and would
        keep the loop waiting for ever: on Python 3.11.0-3.11.7 and 3.12.0, a fork at the instant
        another thread makes itself a Python thread state (a ``torch.distributed`` thread freeing
        a Python tensor, say) leaves the child waiting on a lock no thread of it holds (CPython
        gh-112275)."""
        if self._started is None or all(self._started) or time.monotonic() - self._forked < START_S:
            return
        worker = list(self._started).index(0)
        raise WorkerError(
            f"DataLoader worker {worker} (pid {self._workers[worker].pid}) has not started {START_S:.0f} s after its "
            f"fork: it hangs in it. Python {sys.version.split()[0]}: 3.11.0-3.11.7 and 3.12.0 hang a child forked "
            f"as another thread frees a Python object (a tensor a torch.distributed collective held, say; CPython "
            f"gh-112275): keep such tensors alive, or use a Python with the fix. {WorkerError.advice}")

    def owned_here(self) -> bool:
        """Whether its workers are this process's, not a forked child's copy of its parent's
        iterator, whose workers (and the events and queues it shares with them) are not its own
        to use or stop. (Through class attributes, which the interpreter's finalization keeps.)"""
        return self.__dict__.get("_owner", self._getpid()) == self._getpid()

    def _shutdown_workers(self) -> None:
        if not self.owned_here():
            return
        if "_workers_status" not in self.__dict__:  # cut in its __init__ (Ctrl-C pressed twice as workers start):
            if self.__dict__.get("_worker_pids_set"):  # PyTorch's shutdown would fail on what is missing
                signal_handling._remove_worker_pids(id(self))  # (else its SIGCHLD handler raises for them later)
                self._worker_pids_set = False
            for worker in self.__dict__.get("_workers", ()):
                worker.kill()
                worker.join(timeout=5)
            for queue in self.__dict__.get("_index_queues", ()):
                queue.cancel_join_thread()
                queue.close()
            self._remove_own_folders()
            return
        try:
            # a worker waiting for a read that retries sees no shutdown; as the interpreter ends,
            # the Event's module is gone, and multiprocessing's exit handlers end the workers
            if self._abandon_reads is not None and not self._finalizing():
                self._abandon_reads.set()
            super()._shutdown_workers()
        finally:
            self._running.discard(self)
            self._held_queues.pop(id(self), None)
            for worker in getattr(self, "_workers", ()):  # (not workers_of(): module names may be gone by now)
                self._contexts.pop(worker.pid, None)
            self._remove_own_folders()

    def _remove_own_folders(self) -> None:
        """Remove the workers' temporary folders, once (the second call, maybe as the interpreter
        finalizes, when module names may be gone, finds none)."""
        folders, self._folders = self.__dict__.get("_folders"), []
        if folders:
            self._remove_folders(folders, self.__dict__.get("_workers", ()))


def unit_batches(dataset: Any) -> int:
    """About the batches of a unit, which a worker sends as one message: a DataLoader waits for
    a message where it means to wait for a batch (its ``timeout``)."""
    return max(-(-dataset.shuffle_buffer // dataset.batch_size), 1)


def _unwatch(iterator: Any) -> None:
    """Take the workers of ``iterator`` out of PyTorch's SIGCHLD watch (which raises on every
    signal, from any child, for as long as a dead worker stays unreaped)."""
    if getattr(iterator, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False


def _stop_at_exit() -> None:
    """Stop the workers still running as the interpreter exits (see the module docstring).
    Registered after multiprocessing's exit handler (imported above), so run before it. Those
    of a forked child's copies of its parent's loaders are its parent's to stop."""
    for iterator in list(_RUNNING):
        try:
            if iterator.owned_here():
                stop_workers(iterator)
        except Exception:  # noqa: BLE001 - at exit, what was not stopped here multiprocessing terminates
            continue


def _leave_the_parents_workers() -> None:
    """In a child forked from the training process (``os.fork``): the workers of the loaders it
    copied are its parent's, and are taken out of the children it inherited, which
    multiprocessing's exit handler terminates as the child ends (the parent's loop then died of
    a worker "killed by signal: Terminated"); at the fork, as the copies may be gone by then."""
    for iterator in list(_RUNNING):
        multiprocessing.process._children.difference_update(workers_of(iterator))  # type: ignore[attr-defined]


os.register_at_fork(after_in_child=_leave_the_parents_workers)
atexit.register(_stop_at_exit)


def stop_workers(iterator: Any) -> None:
    """Stop the worker processes of ``iterator`` now (left to garbage collection after an
    error, the DataLoader waits seconds per worker for them to notice)."""
    _unwatch(iterator)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    for worker in workers_of(iterator):  # stopped means gone: a shutdown cut short by an error (it marks
        try:  # itself done first, and a second call returns at once) would leave workers running
            if worker.is_alive():
                worker.kill()
            worker.join(timeout=5)  # (killed, it is gone at once, but a loaded machine may take a second to end it)
        except (ValueError, AssertionError):  # a closed process object, or one this process did not start
            continue
