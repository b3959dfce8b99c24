"""ForkSafeLock: held by a thread of the parent when a child is forked, or when it is pickled,
it is free in the child and in the copy."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading

import pytest

from pipeline.fork_safe import ForkSafeLock

WAIT_S = 30


def _take(lock: ForkSafeLock, answers: multiprocessing.Queue) -> None:
    with lock:
        answers.put("taken")


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
def test_a_lock_held_by_another_thread_at_a_fork_is_free_in_the_child() -> None:
    lock, held, release = ForkSafeLock(), threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(WAIT_S)
    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(WAIT_S)
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    child = context.Process(target=_take, args=(lock, answers))
    child.start()
    try:
        assert answers.get(timeout=WAIT_S) == "taken"
        assert not lock._lock.acquire(blocking=False), "the parent's lock is still its holder's"
    finally:
        child.join(WAIT_S)
        if child.is_alive():
            child.kill()
        release.set()
        holder.join(WAIT_S)
    assert child.exitcode == 0
    with lock:  # let go of by its holder, as ever
        pass


def test_a_pickled_lock_is_a_new_one_free() -> None:
    lock = ForkSafeLock()
    with lock:
        copy = pickle.loads(pickle.dumps(lock))
    assert isinstance(copy, ForkSafeLock) and copy is not lock
    with copy:
        assert not copy._lock.acquire(blocking=False)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_the_thread_that_forks_under_the_lock_lets_go_of_it_in_the_child() -> None:
    lock = ForkSafeLock()
    with lock:
        pid = os.fork()
        if pid == 0:  # the child leaves the block as its parent does, then takes the lock again
            code = 1
            try:
                lock.__exit__(None, None, None)
                with lock:
                    code = 0
            finally:
                os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
