"""``on_error="skip"`` stands in for damaged pieces, not for a lost server: when nginx stops
answering mid-epoch (a proxy in front of it refuses every request), the epoch ends with an error
instead of filling itself with repeats of the rows read before, a piece per retry budget, for as
long as the epoch lasts. An outage shorter than the retry deadline is skipped through."""

from __future__ import annotations

import pickle
import threading
import time

import pytest

from pipeline import SourceError, make_loader
from pipeline.storage.errors import RetriesSpent
from pipeline.stream.lost_storage import LOST_AFTER_SHARDS, LostStorage
from tests.storage.servers import FaultProxy, port_of

LOST = r"reads of \d+ shards of this set failed so for \d+s, none read between them: the storage does not answer\. " \
       r"on_error='skip' stands in for damaged pieces, not for a lost server"


@pytest.fixture
def proxy(nginx: str, monkeypatch):
    """Reads that spend their retries in about 0.3 s, and a retry deadline of 2 s."""
    monkeypatch.setenv("PIPELINE_RETRY_DELAY", "0.1")
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "3")
    monkeypatch.setenv("PIPELINE_RETRY_DEADLINE", "2")
    proxy = FaultProxy(port_of(nginx), {})
    yield proxy
    proxy.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_server_lost_mid_epoch_ends_it_under_skip(proxy: FaultProxy, workers: int) -> None:
    loader = make_loader(f"{proxy.url}/data/", num_workers=workers, batch_size=16, shuffle_buffer=300, on_error="skip")
    batches = iter(loader)
    delivered = len(next(batches)["i"])
    proxy.fail_after = 0  # the server is gone from now on
    with pytest.raises(SourceError, match=LOST):
        for batch in batches:
            delivered += len(batch["i"])
    assert delivered < loader.dataset.samples


def test_an_outage_shorter_than_the_retry_deadline_is_skipped_through(proxy: FaultProxy, monkeypatch) -> None:
    """Reads of several shards spend their retries at once (a unit's pieces are read together),
    then the server answers again: the epoch goes on, the lost pieces counted and stood in for."""
    monkeypatch.setenv("PIPELINE_RETRY_DEADLINE", "60")  # the mend comes in time however slow the machine
    loader = make_loader(f"{proxy.url}/data/", num_workers=0, batch_size=16, shuffle_buffer=300, on_error="skip")
    batches = iter(loader)
    delivered = len(next(batches)["i"])
    proxy.fail_after = 0

    def mend() -> None:  # once a read has spent its retries: a mend after a set time may come before
        deadline = time.monotonic() + 60
        while loader.stats()["skipped_pieces"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        proxy.fail_after = None
    mender = threading.Thread(target=mend, daemon=True)
    mender.start()
    delivered += sum(len(batch["i"]) for batch in batches)
    mender.join()
    assert delivered == loader.dataset.samples and loader.stats()["skipped_pieces"] > 0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _spent(shard: int) -> RetriesSpent:
    return RetriesSpent(f"http://h/part-{shard}.tar", 0, "request failed 2 times, last: HTTP 503")


def test_only_reads_of_several_shards_failing_longer_than_the_deadline_count_as_a_lost_server() -> None:
    clock = Clock()
    lost = LostStorage(deadline=10, clock=clock)
    for shard in (1, 1, 2, 3, 4):  # several shards at once: one outage
        lost.failed(_spent(shard), source=0, shard=shard)
    lost.failed(SourceError("http://h/part-3.tar", 0, "HTTP 404 not found"), source=0, shard=5)  # a missing shard
    clock.now = 20
    lost.failed(_spent(4), source=1, shard=4)  # another source's server
    lost.read(0)  # a good read: the server answers
    for shard in range(LOST_AFTER_SHARDS - 1):
        lost.failed(_spent(shard), source=0, shard=shard)
    clock.now = 31
    lost.failed(_spent(0), source=0, shard=0)  # long enough, but of 2 shards only
    lost = pickle.loads(pickle.dumps(lost))  # (as a DataLoader worker gets it: afresh)
    clock = lost.clock
    for shard in range(LOST_AFTER_SHARDS):
        lost.failed(_spent(shard), source=0, shard=shard)
    clock.now = 41.5
    with pytest.raises(SourceError, match=r"part-7\.tar at byte 0: request failed 2 times, last: HTTP 503; reads of 4 "
                                          r"shards of this set failed so for 10s, none read between them"):
        lost.failed(_spent(7), source=0, shard=7)
