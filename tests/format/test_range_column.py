"""RangeColumn under the reader threads of one process, and across a fork: a slow block holds up
only its own readers, a block is fetched once however many threads want it, a failed fetch
reaches each of them, and a child forked during a fetch reads on."""

from __future__ import annotations

import functools
import multiprocessing
import pickle
import sys
import threading
from typing import Callable

import numpy as np
import pytest

from pipeline.format.shard_table import RangeColumn
from pipeline.storage import SourceError
from tests.helpers import wait_for

VALUES = np.arange(64, dtype="<u4") * 7
PER_BLOCK = 16  # 64-byte blocks of 4-byte records
WAIT_S = 30


class Storage:
    """The bytes of a column, read by range; a range may be held until released, or fail once."""

    def __init__(self) -> None:
        self.data = VALUES.tobytes()
        self.calls: list[tuple[int, int]] = []
        self.hold_at: int | None = None  # reads starting at this byte wait for `release`
        self.held = threading.Event()
        self.release = threading.Event()
        self.fail_at: int | None = None  # the next read starting here fails

    def read(self, start: int, stop: int) -> bytes:
        self.calls.append((start, stop))
        if start == self.hold_at:
            self.held.set()
            assert self.release.wait(WAIT_S), "the held read was never released"
        if start == self.fail_at:
            self.fail_at = None
            raise SourceError("s3://bucket/set/index.bin", start, "connection reset")
        return self.data[start:stop]


def column(storage: Storage) -> RangeColumn:
    return RangeColumn(storage.read, 0, np.dtype("<u4"), len(VALUES), block_bytes=PER_BLOCK * 4)


def in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            out.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def waits_on_a_fetch(thread: threading.Thread) -> bool:
    """Whether ``thread`` sleeps on a condition in a future's result (the fetch of another thread)."""
    frame = sys._current_frames().get(thread.ident)
    names = set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return "result" in names and "wait" in names


def wait_until_waiting(thread: threading.Thread) -> None:
    assert wait_for(lambda: waits_on_a_fetch(thread), WAIT_S), "the second reader never waited for the first one's fetch"


def second_reader_waits(storage: Storage, reads: RangeColumn, first: tuple[int, int],
                        second: tuple[int, int]) -> tuple[object, object]:
    """What reads of ``first`` and of ``second`` give, the second made while the first one's fetch
    is held, and let go once the second waits for it."""
    first_thread, first_out = in_thread(lambda: reads.read(*first))
    assert storage.held.wait(WAIT_S)
    second_thread, second_out = in_thread(lambda: reads.read(*second))
    wait_until_waiting(second_thread)
    storage.release.set()
    first_thread.join(WAIT_S)
    second_thread.join(WAIT_S)
    return first_out[0], second_out[0]


def test_a_slow_block_holds_up_only_the_readers_of_that_block() -> None:
    storage = Storage()
    storage.hold_at = 0
    reads = column(storage)
    slow, slow_out = in_thread(lambda: reads.read(0, 4))
    assert storage.held.wait(WAIT_S)
    other, other_out = in_thread(lambda: reads.read(PER_BLOCK, PER_BLOCK + 4))
    other.join(WAIT_S)
    assert not other.is_alive(), "a read of block 1 waited for the fetch of block 0"
    np.testing.assert_array_equal(other_out[0], VALUES[PER_BLOCK:PER_BLOCK + 4])
    storage.release.set()
    slow.join(WAIT_S)
    np.testing.assert_array_equal(slow_out[0], VALUES[:4])


def test_threads_wanting_one_cold_block_fetch_it_once() -> None:
    storage = Storage()
    storage.hold_at = 0
    first, second = second_reader_waits(storage, column(storage), (0, 4), (2, 10))
    np.testing.assert_array_equal(first, VALUES[:4])
    np.testing.assert_array_equal(second, VALUES[2:10])
    assert storage.calls == [(0, PER_BLOCK * 4)]


def test_a_failed_fetch_reaches_its_waiters_and_the_next_read_tries_again() -> None:
    storage = Storage()
    storage.hold_at = storage.fail_at = 0
    reads = column(storage)
    first, second = second_reader_waits(storage, reads, (0, 4), (0, 4))
    for error in (first, second):
        assert isinstance(error, SourceError) and "index.bin at byte 0: connection reset" in str(error)
    assert first is not second  # each thread's own: one would carry the stacks of both
    np.testing.assert_array_equal(reads.read(0, 4), VALUES[:4])
    assert storage.calls == [(0, PER_BLOCK * 4)] * 2


def test_an_interrupted_fetch_is_taken_over_by_a_waiting_thread() -> None:
    storage = Storage()
    storage.hold_at = 0
    read = storage.read

    def interrupted_once(start: int, stop: int) -> bytes:
        data = read(start, stop)
        if len(storage.calls) == 1:
            raise KeyboardInterrupt
        return data
    reads = RangeColumn(interrupted_once, 0, np.dtype("<u4"), len(VALUES), block_bytes=PER_BLOCK * 4)
    first, second = second_reader_waits(storage, reads, (0, 4), (0, 4))
    assert isinstance(first, KeyboardInterrupt)
    np.testing.assert_array_equal(second, VALUES[:4])
    assert storage.calls == [(0, PER_BLOCK * 4)] * 2 and reads._fetches == {}


def _read_both_blocks(reads: RangeColumn, answers: multiprocessing.Queue) -> None:
    reads._read_range = Storage().read  # the child's own storage: the parent's holds block 0
    answers.put((reads.read(0, 4).tolist(), reads.read(PER_BLOCK, PER_BLOCK + 4).tolist()))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
def test_a_child_forked_during_a_fetch_reads_every_block() -> None:
    """The parent's reader thread holds the column's lock (old code) or a fetch under way when
    the child is forked; the child, which has no such thread, must read on."""
    storage = Storage()
    storage.hold_at = 0
    reads = column(storage)
    slow, _ = in_thread(lambda: reads.read(0, 4))
    assert storage.held.wait(WAIT_S)
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    child = context.Process(target=_read_both_blocks, args=(reads, answers))
    child.start()
    try:
        assert answers.get(timeout=WAIT_S) == (VALUES[:4].tolist(), VALUES[PER_BLOCK:PER_BLOCK + 4].tolist())
    finally:
        child.join(WAIT_S)
        if child.is_alive():
            child.kill()
        storage.release.set()
        slow.join(WAIT_S)
    assert child.exitcode == 0


def _slice(data: bytes, start: int, stop: int) -> bytes:
    return data[start:stop]


def test_a_column_pickles_without_its_blocks_or_fetches() -> None:
    reads = RangeColumn(functools.partial(_slice, VALUES.tobytes()), 0, np.dtype("<u4"), len(VALUES),
                        block_bytes=PER_BLOCK * 4)
    reads.read(0, 20)
    copy = pickle.loads(pickle.dumps(reads))
    assert copy._blocks == {} and copy._fetches == {}
    np.testing.assert_array_equal(copy.read(0, 20), VALUES[:20])
