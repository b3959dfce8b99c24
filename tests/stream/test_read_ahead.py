"""Reading the next unit while the current one is gathered: the same batches, errors in their
place, and nothing read on behind a loop that stopped."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

from pipeline import ShardDataset, make_loader
from pipeline.stream import read_ahead as read_ahead_module
from pipeline.stream.read_ahead import EXIT_WAIT_S, read_ahead
from tests.stream.shardsets import random_sizes, uneven_shards

pytestmark = pytest.mark.filterwarnings("ignore:.*suggested max number of worker")


def test_results_come_in_order_and_an_error_after_every_result_before_it() -> None:
    def read(n: int) -> int:
        if n == 3:
            raise KeyError(n)
        time.sleep(0.001 * (5 - n))  # later reads finish sooner: the order is the items'
        return n * n

    out = []
    with pytest.raises(KeyError):
        for value in read_ahead(iter(range(6)), read, depth=2):
            out.append(value)
    assert out == [0, 1, 4]
    assert list(read_ahead(iter(range(4)), lambda n: -n, depth=0)) == [0, -1, -2, -3]


def test_reads_run_in_a_thread_of_their_own_and_stop_when_the_loop_does() -> None:
    started: list[tuple[int, str]] = []

    def read(n: int) -> int:
        started.append((n, threading.current_thread().name))
        return n

    reads = read_ahead(iter(range(100)), read, depth=1)
    assert next(reads) == 0
    reads.close()
    time.sleep(0.05)
    assert {n for n, _ in started} <= {0, 1}  # the one read ahead at most, nothing after the close
    assert all(name.startswith("read-ahead") for _, name in started)


def test_what_was_read_ahead_is_freed_when_the_loop_stops_after_the_thread_ended() -> None:
    """The last units read ahead, their thread ended: a loop that stops frees them at once, not
    when the next read_ahead lets go of the ended thread."""
    class Unit:
        pass

    made: list[weakref.ref] = []

    def read(n: int) -> Unit:
        unit = Unit()
        made.append(weakref.ref(unit))
        return unit

    reads = read_ahead(iter(range(3)), read, depth=3)
    first = next(reads)
    read_ahead_module._readers[-1].thread.join(10)  # every item read, the end sent
    reads.close()
    del first
    assert len(made) == 3 and all(ref() is None for ref in made)


def test_a_read_under_way_when_the_loop_stops_holds_up_the_exit_a_few_seconds_at_most() -> None:
    script = ("import time\nfrom pipeline.stream.read_ahead import read_ahead\n"
              "reads = read_ahead(iter(range(5)), lambda n: time.sleep(0 if n == 0 else 60) or n, depth=1)\n"
              "assert next(reads) == 0\nreads.close()\n")  # the read of item 1 would take a minute
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert time.perf_counter() - started < EXIT_WAIT_S + 20


# A read in PyTorch's C++ code (the GIL released) as the interpreter finalizes; the slow teardown
# gives it time to want the GIL back then, which ends the thread inside C++: the process aborted
# ("terminate called without an active exception") after the script had ended without an error.
EXIT_DURING_A_READ = """
import threading, time, torch
from pipeline.stream.read_ahead import EXIT_WAIT_S, read_ahead

reading = threading.Event()

def read(n):
    if n == 1:
        reading.set()
        torch.ones(1500, 1500) @ torch.ones(1500, 1500)
    return torch.zeros(10)

class SlowTeardown:
    def __del__(self, sleep=time.sleep):
        sleep(1)

torch.set_num_threads(1)
slow = SlowTeardown()
reads = read_ahead(iter(range(10)), read, 1)
next(reads)
reading.wait()
{stop}
"""


@pytest.mark.parametrize("stop", ["pass", "reads.close()", "del reads"])
def test_a_script_that_exits_while_a_read_is_under_way_exits_cleanly(stop: str) -> None:
    run = subprocess.run([sys.executable, "-c", EXIT_DURING_A_READ.format(stop=stop)], capture_output=True,
                         text=True, timeout=120)
    assert (run.returncode, run.stderr) == (0, "")


def test_a_reading_thread_that_cannot_start_is_an_error_of_the_loop_only() -> None:
    """Under a limit of threads (a container's), the thread's start fails: the loop gets the error,
    and the exit no second one about a thread that never ran."""
    script = ("import threading\nfrom pipeline.stream.read_ahead import read_ahead\n"
              "threading.stack_size(1 << 40)\n"  # a stack no system gives: the next thread cannot start
              "try:\n    list(read_ahead(iter(range(3)), lambda n: n, depth=1))\n"
              "except RuntimeError as exc:\n    print(exc)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout, run.stderr) == (0, "can't start new thread\n", "")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return uneven_shards(tmp_path_factory.mktemp("ahead"), random_sizes(6, 200, 900, seed=8), pack=8)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_batches_do_not_depend_on_how_far_ahead_a_worker_reads(shards: Path, workers: int) -> None:
    def batches(depth: int) -> list[np.ndarray]:
        loader = make_loader(shards, num_workers=workers, batch_size=40, shuffle_buffer=300, read_ahead=depth, seed=3)
        return [batch["i"].numpy().copy() for batch in loader]

    plain = batches(0)
    for depth in (1, 3):
        ahead = batches(depth)
        assert len(ahead) == len(plain) and all((a == b).all() for a, b in zip(ahead, plain))


@pytest.mark.parametrize("value", [-1, 1.5, "2"])
def test_a_read_ahead_that_is_no_count_is_refused(shards: Path, value) -> None:
    with pytest.raises(ValueError, match=re.escape(f"read_ahead must be an integer >= 0 (units read ahead), or None "
                                                   f"for its default, got {value!r}")):
        ShardDataset(shards, read_ahead=value)
