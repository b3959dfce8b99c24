"""``on_error="skip"`` stands in for damaged pieces, not for a lost server: when nginx stops
answering mid-epoch (a proxy in front of it refuses every request), the epoch ends with an error
instead of filling itself with repeats of the rows read before, a piece per retry budget, for as
long as the epoch lasts."""

from __future__ import annotations

import pytest

from pipeline import SourceError, make_loader
from pipeline.storage.errors import RetriesSpent
from pipeline.stream.lost_storage import LOST_AFTER_SHARDS, LostStorage
from tests.storage.servers import FaultProxy, port_of

LOST = r"reads of \d+ shards of this set in a row failed so, none read between them: the storage does not answer\. " \
       r"on_error='skip' stands in for damaged pieces, not for a lost server"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_server_lost_mid_epoch_ends_it_under_skip(nginx: str, fast_retries, monkeypatch, workers: int) -> None:
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "2")
    proxy = FaultProxy(port_of(nginx), {})
    try:
        loader = make_loader(f"{proxy.url}/data/", num_workers=workers, batch_size=16, shuffle_buffer=300,
                             on_error="skip")
        batches = iter(loader)
        delivered = len(next(batches)["i"])
        proxy.fail_after = 0  # the server is gone from now on
        with pytest.raises(SourceError, match=LOST):
            for batch in batches:
                delivered += len(batch["i"])
        assert delivered < loader.dataset.samples // 2
    finally:
        proxy.close()


def _spent(shard: int) -> RetriesSpent:
    return RetriesSpent(f"http://h/part-{shard}.tar", 0, "request failed 2 times, last: HTTP 503")


def test_only_reads_of_several_shards_in_a_row_that_spent_their_retries_count_as_a_lost_server() -> None:
    lost = LostStorage()
    for shard in (1, 1, 2):  # a shard's pieces count once
        lost.failed(_spent(shard), source=0, shard=shard)
    lost.failed(SourceError("http://h/part-3.tar", 0, "HTTP 404 not found"), source=0, shard=3)  # a missing shard
    lost.failed(_spent(4), source=1, shard=4)  # another source's server
    lost.read(0)  # a good read: the server answers
    for shard in range(LOST_AFTER_SHARDS - 1):
        lost.failed(_spent(shard), source=0, shard=shard)
    with pytest.raises(SourceError, match=r"part-7\.tar at byte 0: request failed 2 times, last: HTTP 503; " + LOST):
        lost.failed(_spent(7), source=0, shard=7)
