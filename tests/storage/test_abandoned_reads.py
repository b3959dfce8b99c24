"""Reads nobody will take any more (a loop broke off, a loader stopped its workers) give up
their retries, against a server (nginx behind a proxy) that refuses every request."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
import time

import pytest
import torch.utils.data._utils

from pipeline import make_loader
from tests.helpers import wait_for
from tests.storage.conftest import all_ids
from tests.storage.servers import FaultProxy, port_of


@pytest.fixture
def refusing_later(nginx: str, fast_retries, monkeypatch):
    """A proxy to nginx, and retries that would go on for minutes once it refuses."""
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "1000")
    monkeypatch.setenv("PIPELINE_RETRY_DEADLINE", "600")
    proxy = FaultProxy(port_of(nginx), {})
    yield proxy
    proxy.close()


def test_the_reads_of_a_loop_that_broke_off_stop_retrying(refusing_later: FaultProxy, total_samples: int) -> None:
    """A loop breaks off while the server refuses every request: the reads it started ahead give
    up at their next failure, rather than retry on behind its back for minutes (holding the
    threads the next epoch reads with, and the interpreter's exit, which waits for them). Under
    skip, too, where giving up must not count as losing the samples."""
    proxy = refusing_later
    loader = make_loader(f"{proxy.url}/data/", num_workers=0, batch_size=16, shuffle_buffer=300, on_error="skip")
    batches = iter(loader)
    first = next(batches)["i"].tolist()
    proxy.fail_after = 0  # every request refused from now on: the reads ahead retry
    assert wait_for(lambda: proxy.counts["503"] >= 3)
    del batches  # the loop breaks off
    assert wait_for(lambda: not any(t.name == "read-ahead" for t in threading.enumerate()), seconds=30)
    refused = proxy.counts["503"]
    time.sleep(0.3)
    assert proxy.counts["503"] == refused
    assert (loader.stats()["skipped_pieces"], loader.stats()["replaced_samples"]) == (0, 0)
    proxy.fail_after = None  # the server mended: the rest of the epoch comes whole
    assert sorted(first + all_ids(loader)) == list(range(total_samples))


def test_workers_stopped_while_their_reads_retry_exit_on_their_own(refusing_later: FaultProxy,
                                                                   total_samples: int, monkeypatch) -> None:
    """A worker's reads retry on after the loader has stopped it, unless told: the loop's
    ``break`` took PyTorch's wait for each (5 s; here 60 s, so that a worker slow to exit on a busy
    machine is not taken for one that waited for it), then its SIGTERM."""
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 60.0)
    proxy = refusing_later
    loader = make_loader(f"{proxy.url}/data/", num_workers=2, batch_size=16, shuffle_buffer=300)
    before = set(multiprocessing.active_children())
    batches = iter(loader)
    first = next(batches)["i"].tolist()
    workers = [child for child in multiprocessing.active_children() if child not in before]
    assert len(workers) == 2
    proxy.fail_after = 0
    assert wait_for(lambda: proxy.counts["503"] >= 6)
    began = time.monotonic()
    del batches
    assert time.monotonic() - began < 30 and [worker.exitcode for worker in workers] == [0, 0]
    proxy.fail_after = None
    assert sorted(first + all_ids(loader)) == list(range(total_samples))


#: A training script that ends while its loader, still referenced, reads ahead: it prints the
#: first batch's ids, then returns once told (a line on its stdin).
_ENDS_MID_EPOCH = """
import sys
from pipeline import make_loader
loader = make_loader(sys.argv[1], num_workers=0, batch_size=16, shuffle_buffer=300)
batches = iter(loader)
print(sorted(next(batches)["i"].tolist()), flush=True)
sys.stdin.readline()
"""


def test_a_script_that_ends_while_its_reads_ahead_retry_exits_at_once(refusing_later: FaultProxy) -> None:
    """Its interpreter's exit waits for the reader threads' pool: reads retrying for minutes
    against a server that refuses them held the exit for as long (up to the retry deadline)."""
    proxy = refusing_later
    script = subprocess.Popen([sys.executable, "-c", _ENDS_MID_EPOCH, f"{proxy.url}/data/"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert script.stdout.readline().startswith("[")
        proxy.fail_after = 0
        assert wait_for(lambda: proxy.counts["503"] >= 3)
        began = time.monotonic()
        _, said = script.communicate("end\n", timeout=30)
        took = time.monotonic() - began
    finally:
        script.kill()
        script.wait()
    assert script.returncode == 0, said
    # (a held exit lasts until the retry deadline, 600 s, and ends in communicate's timeout; a loaded
    # machine takes seconds to end any Python process with torch loaded: 6.3 s measured)
    assert took < 20 and "Traceback" not in said
