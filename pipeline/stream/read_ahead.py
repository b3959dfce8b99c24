"""Reading the next units in a thread while the caller works on the current one, and stopping
that thread before the interpreter exits.

Why the stop at exit: a daemon thread that wants the GIL back while the interpreter finalizes is
ended where it stands (``pthread_exit``). Inside PyTorch's C++ (freeing a tensor releases the
GIL) that ending aborts the whole process ("terminate called without an active exception"),
after a training script returned 0: a script that stops mid-epoch and exits at once, while its
read-ahead thread is still finishing, died so about one run in ten. So every reading thread is
kept in a table until the main thread sees it ended (what it read with is freed there, never by
the thread as it ends), and at exit each is asked to stop and waited for, a few seconds at most
(a read under way when the loop stopped must not hold up the exit for long).
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
from typing import Callable, Iterator, TypeVar

from ..storage.retry import abandoned_when

T = TypeVar("T")
R = TypeVar("R")
EXIT_WAIT_S = 5.0  # how long the exit waits, in all, for reads under way
_END = object()  # what the reading thread sends after the last result


class _Reader:
    """The thread of one ``read_ahead`` and what it reads with."""

    def __init__(self, items: Iterator[T], read: Callable[[T], R], depth: int) -> None:
        self.items, self.read = items, read
        self.slots = threading.Semaphore(depth)  # reads started (or done) that the caller has not taken yet
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self.stopped = threading.Event()
        # a daemon: a read under way when the caller stops (a break, an error) ends on its own
        # while the caller goes on, and no read starts after it
        self.thread = threading.Thread(target=self._run, name="read-ahead", daemon=True)

    def _run(self) -> None:
        try:
            with abandoned_when(self.stopped):  # a read under way when the caller stops gives up its retries
                for item in self.items:
                    self.slots.acquire()
                    if self.stopped.is_set():
                        break
                    self.results.put((True, self.read(item)))
                else:
                    self.results.put((True, _END))
        except BaseException as exc:  # noqa: BLE001 - raised in the caller, where the result would be
            self.results.put((False, exc))
        if self.stopped.is_set():  # put after the caller's stop emptied the queue
            self._drop_results()

    def stop(self) -> None:
        """No read starts after this, and what was read but not taken is freed now (by the
        caller, and by the thread for a read it ends after this): a unit read ahead must not
        wait in the queue until the table lets go of its reader."""
        self.stopped.set()
        self.slots.release()  # wakes a reader waiting for a slot, to see that it is stopped
        self._drop_results()

    def _drop_results(self, empty: type[Exception] = queue.Empty) -> None:
        """(``empty`` bound here: a generator left to the interpreter's end stops its reader
        after the module's globals are gone.)"""
        while True:
            try:
                self.results.get_nowait()
            except empty:
                return


_readers: list[_Reader] = []  # started ones the main thread has not yet seen ended


def _started(reader: _Reader) -> None:
    _readers[:] = [r for r in _readers if r.thread.is_alive()]  # the ended ones are freed here
    reader.thread.start()  # (a thread that cannot start, under a limit of threads, is not one to stop at exit)
    _readers.append(reader)


@atexit.register
def _stop_readers() -> None:
    """Runs before the interpreter finalizes: stop every reading thread and wait for it."""
    for reader in _readers:
        reader.stop()
    deadline = time.monotonic() + EXIT_WAIT_S
    for reader in _readers:
        reader.thread.join(max(deadline - time.monotonic(), 0))
    _readers.clear()


def read_ahead(items: Iterator[T], read: Callable[[T], R], depth: int) -> Iterator[R]:
    """``read(item)`` of each item, in order, with the next ``depth`` reads running meanwhile in a
    thread of their own (none when ``depth`` is 0). Why: the caller's work on a unit (gathering
    it, handing it over, or, without workers, the training step) overlaps the reading of the
    next: reads and checks, NumPy's copies and the network release the GIL. An error of a read
    is raised where its result would have been, after every unit before it."""
    if depth <= 0:
        yield from map(read, items)
        return
    reader = _Reader(items, read, depth)
    _started(reader)
    try:
        while True:
            ok, value = reader.results.get()
            if not ok:
                raise value
            if value is _END:
                return
            reader.slots.release()
            yield value
            value = None  # hold no unit while the next one is read
    finally:
        reader.stop()
