"""Retry counts that are right, one retry budget per read, and connection pools that a failed or
abandoned read leaves clean: against nginx, SeaweedFS, the fault proxy and a scripted server."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Iterator

import pytest

from pipeline import SourceError, make_loader
from pipeline.storage import open_stream, read_range
from pipeline.storage.errors import CutShort
from tests.storage.conftest import all_ids, read_into, upload_folder
from tests.storage.servers import FaultProxy, make_bucket, port_of

warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")
SHARDS = "part-{000000..000008}.tar"


class Count:
    """A retry sink for direct reads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value = 0

    def retried(self) -> None:
        with self.lock:
            self.value += 1

    def requested(self) -> None:
        pass


class ScriptedServer:
    """HTTP/1.1 with keep-alive on 127.0.0.1, serving one object; request number ``n`` (from 0)
    is answered as ``script(n)`` says: ``ok`` (the range asked for), ``503`` (with a short body,
    keeping the connection), ``200`` (the whole object, Range ignored), ``cut`` (half the range,
    then the connection drops) or ``drop`` (the headers of the range, then the connection drops)."""

    def __init__(self, body: bytes, script: Callable[[int], str]) -> None:
        self.body, self.script = body, script
        self.requests = self.connections = 0
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/blob"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the client may hang up on an unread body
            pending = b""
            while True:
                while b"\r\n\r\n" not in pending:
                    data = conn.recv(65536)
                    if not data:
                        return
                    pending += data
                head, _, pending = pending.partition(b"\r\n\r\n")
                with self.lock:
                    number, self.requests = self.requests, self.requests + 1
                if not self._answer(conn, self.script(number), head):
                    return

    def _answer(self, conn: socket.socket, mode: str, head: bytes) -> bool:
        """Send one response; False when the connection is to drop."""
        size = len(self.body)
        asked = re.search(rb"(?i)range: bytes=(\d+)-(\d*)", head)
        start = int(asked.group(1)) if asked else 0
        stop = int(asked.group(2)) + 1 if asked and asked.group(2) else size
        if mode == "503":
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 12\r\n\r\nunavailable\n")
            return True
        if mode == "200":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + self.body)
            return True
        part = self.body[start:stop]
        conn.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\n\r\n"
                     % (start, stop - 1, size, len(part)))
        sent = {"ok": len(part), "cut": len(part) // 2, "drop": 0}[mode]
        conn.sendall(part[:sent])
        return mode == "ok"

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def blob() -> bytes:
    return bytes(range(256)) * 1024  # 256 KiB: more than an unused body is drained for


@pytest.fixture
def scripted(blob: bytes) -> Iterator[Callable[[Callable[[int], str]], ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(script: Callable[[int], str]) -> ScriptedServer:
        servers.append(ScriptedServer(blob, script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def counts_bucket(s3_env: str, web_root: Path, foreign_folder: str) -> str:
    make_bucket("counts")
    upload_folder(web_root / "data", "counts", "train")
    upload_folder(web_root / foreign_folder, "counts", "foreign")
    return "counts"


def _many_quick_retries(monkeypatch) -> None:
    """Enough attempts that no read runs out (so that every 503 is retried), short waits, and a
    read timeout no answer of a loaded machine reaches (the proxy runs in this process's threads;
    a read that timed out would be a retry that is no 503)."""
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "20")
    monkeypatch.setenv("PIPELINE_RETRY_DELAY", "0.002")
    monkeypatch.setenv("PIPELINE_READ_TIMEOUT", "60")


def _epoch_counts(loader, proxy: FaultProxy, total: int) -> tuple[int, int]:
    """Play one epoch (every sample once); its retries by the loader and 503s by the proxy. The
    loader counts every request the proxy answered, too."""
    before, refused, answered = loader.stats(), proxy.counts["503"], sum(proxy.counts.values())
    assert all_ids(loader) == list(range(total))
    after = loader.stats()
    assert after["requests"] - before["requests"] == sum(proxy.counts.values()) - answered > 0
    return after["retries"] - before["retries"], proxy.counts["503"] - refused


@pytest.mark.parametrize(("kind", "workers"), [("indexed", 0), ("indexed", 2), ("foreign", 0), ("foreign", 2),
                                               ("cached", 2)])
def test_over_http_each_503_counts_one_retry(nginx: str, foreign_folder: str, total_samples: int, fast_retries,
                                             monkeypatch, tmp_path: Path, kind: str, workers: int) -> None:
    _many_quick_retries(monkeypatch)
    proxy = FaultProxy(port_of(nginx), {"503": 0.2 if kind == "indexed" else 0.5}, seed=workers)
    try:
        source = f"{proxy.url}/{foreign_folder}/{SHARDS}" if kind == "foreign" else f"{proxy.url}/data/"
        options = {"cache_dir": tmp_path / "cache"} if kind == "cached" else {}
        loader = make_loader(source, num_workers=workers, batch_size=64, shuffle_buffer=300, **options)
        retries, refused = _epoch_counts(loader, proxy, total_samples)
    finally:
        proxy.close()
    assert refused >= 3 and retries == refused, (retries, proxy.counts)


@pytest.mark.parametrize("kind", ["indexed", "foreign"])
def test_over_s3_each_503_counts_one_retry_and_botocore_adds_none(
        counts_bucket: str, seaweedfs: str, total_samples: int, fast_retries, monkeypatch, kind: str) -> None:
    _many_quick_retries(monkeypatch)
    proxy = FaultProxy(port_of(seaweedfs), {"503": 0.2 if kind == "indexed" else 0.5}, seed=5)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    try:
        source = f"s3://{counts_bucket}/foreign/{SHARDS}" if kind == "foreign" else f"s3://{counts_bucket}/train"
        loader = make_loader(source, num_workers=2, batch_size=64, shuffle_buffer=300)
        retries, refused = _epoch_counts(loader, proxy, total_samples)
    finally:
        proxy.close()
    assert refused >= 3 and retries == refused, (retries, proxy.counts)


@pytest.mark.parametrize("train_workers", [0, 2])
def test_two_datasets_count_their_own_retries_and_new_workers_add_to_the_count(
        nginx: str, total_samples: int, fast_retries, monkeypatch, train_workers: int) -> None:
    """Train and validation read at once (in one process, with 0 workers); each epoch of train
    starts new workers (with 2)."""
    _many_quick_retries(monkeypatch)
    train_proxy = FaultProxy(port_of(nginx), {"503": 0.2}, seed=1)
    val_proxy = FaultProxy(port_of(nginx), {"503": 0.3}, seed=2)
    try:
        # the retries of opening the index count too: every 503 each proxy serves is one
        train = make_loader(f"{train_proxy.url}/data/", num_workers=train_workers, persistent_workers=False,
                            batch_size=64, shuffle_buffer=300)
        val = make_loader(f"{val_proxy.url}/data/", num_workers=0, batch_size=64, shuffle_buffer=300)
        val_batches: Iterator = iter(())
        counts = []
        for _ in range(2):
            ids = []
            for batch in train:
                ids += batch["i"].tolist()
                if next(val_batches, None) is None:  # a validation epoch ended: start the next
                    val_batches = iter(val)
            assert sorted(ids) == list(range(total_samples))
            counts.append(train.stats()["retries"])
            assert counts[-1] == train_proxy.counts["503"]
        assert counts[1] > counts[0] > 0
        assert val.stats()["retries"] == val_proxy.counts["503"] > 0
    finally:
        train_proxy.close()
        val_proxy.close()


def test_a_server_that_always_refuses_gets_exactly_the_attempts(scripted, fast_retries, monkeypatch) -> None:
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "4")
    server, count = scripted(lambda n: "503"), Count()
    with pytest.raises(SourceError, match=r"blob at byte 0: request failed 4 times, last: HTTP 503"):
        read_range(server.url, 0, 1000, stats=count)
    assert (server.requests, count.value) == (4, 3)


def test_resumes_and_refused_reconnects_share_one_budget(scripted, fast_retries, monkeypatch) -> None:
    """Every other request is cut before its first byte, the others refused: each resume would
    retry its reconnect on its own were the retries nested."""
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "5")
    server, count = scripted(lambda n: "drop" if n % 2 == 0 else "503"), Count()
    with pytest.raises(SourceError, match=r"blob at byte 0: request failed 5 times"):
        read_range(server.url, 0, 1000, stats=count)
    assert (server.requests, count.value) == (5, 4)


def test_a_deadline_ends_a_run_of_failures(scripted, fast_retries, monkeypatch) -> None:
    """1,000 attempts 0.05 s apart and more would take minutes; the deadline ends them within 2 s
    (bounds wide enough for a machine that stalls the test for seconds)."""
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "1000")
    monkeypatch.setenv("PIPELINE_RETRY_DELAY", "0.05")
    monkeypatch.setenv("PIPELINE_RETRY_DEADLINE", "2")
    server = scripted(lambda n: "503")
    began = time.monotonic()
    with pytest.raises(SourceError, match=r"failed \d+ times in \d+\.\ds \(retry deadline 2s\), last: HTTP 503") as err:
        read_range(server.url, 0, 1000)
    assert time.monotonic() - began < 30 and 2 <= server.requests < 1000
    assert f"failed {server.requests} times" in str(err.value)


@pytest.mark.parametrize("read", [read_range, read_into])
def test_cuts_that_make_progress_do_not_use_up_the_budget(scripted, blob: bytes, fast_retries, monkeypatch,
                                                          read) -> None:
    """Each cut resumed from the byte reached, into a new bytes object or the reader's buffer."""
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "2")
    server, count = scripted(lambda n: "cut" if n < 5 else "ok"), Count()
    assert read(server.url, 0, len(blob), stats=count) == blob
    assert (server.requests, count.value) == (6, 5)


@pytest.mark.parametrize("presigned", ["1", "0"])
def test_over_s3_botocore_makes_no_attempt_of_its_own(counts_bucket: str, seaweedfs: str, fast_retries,
                                                      monkeypatch, presigned: str) -> None:
    """Nor does the presigned path: every 503 is one of our retries, through either."""
    monkeypatch.setenv("PIPELINE_S3_PRESIGNED", presigned)
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "3")
    proxy = FaultProxy(port_of(seaweedfs), {}, fail_after=0)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    count = Count()
    try:
        with pytest.raises(SourceError, match=r"part-000000\.tar at byte 0: request failed 3 times, last: S3 503"):
            read_range(f"s3://{counts_bucket}/train/part-000000.tar", 0, 1000, stats=count)
    finally:
        proxy.close()
    assert (proxy.counts["503"], count.value) == (3, 2)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_keeps_the_policy_of_its_construction(nginx: str, fast_retries, monkeypatch, workers: int) -> None:
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "3")
    monkeypatch.setenv("PIPELINE_READ_TIMEOUT", "60")  # (503s only: see _many_quick_retries)
    proxy = FaultProxy(port_of(nginx), {})
    try:
        loader = make_loader(f"{proxy.url}/data/", num_workers=workers, batch_size=64, shuffle_buffer=300)
        monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "50")  # too late for the loader
        proxy.fail_after = 0  # from now on, every request is refused
        with pytest.raises(Exception, match=r"request failed 3 times, last: HTTP 503"):
            all_ids(loader)
    finally:
        proxy.close()
    if workers == 0:  # no read left half done: each made 3 requests and 2 retries
        assert 3 * loader.stats()["retries"] == 2 * proxy.counts["503"] > 0


# -- pools: the request after a failed or abandoned one needs no retry -----------------------


@pytest.fixture
def one_attempt(monkeypatch) -> None:
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "1")


def test_after_a_416_or_a_404_the_next_request_on_the_pool_succeeds(nginx: str, web_root: Path, one_attempt) -> None:
    url = f"{nginx}/data/part-000003.tar"
    local = (web_root / "data" / "part-000003.tar").read_bytes()
    assert read_range(url, 0, 100) == local[:100]  # a pooled connection
    kept = []  # errors kept, as a caller may: they hold their frames, and the responses in them
    for bad_url, start, status in ((url, len(local) + 10, "416"), (f"{nginx}/data/nope.tar", 0, "404")):
        with pytest.raises(SourceError, match=f"HTTP {status}") as error:
            read_range(bad_url, start, start + 10)
        kept.append(error)
        assert read_range(url, 1000, 5000) == local[1000:5000]


def test_after_an_abandoned_stream_the_next_request_on_the_pool_succeeds(nginx: str, web_root: Path,
                                                                         one_attempt) -> None:
    url = f"{nginx}/data/part-000003.tar"
    local = (web_root / "data" / "part-000003.tar").read_bytes()
    stream = open_stream(url)
    assert stream.read(len(local) // 2) == local[:len(local) // 2]
    stream.close()  # half read
    assert read_range(url, 10, 3000) == local[10:3000]


@pytest.mark.parametrize("first", ["503", "200"])
def test_an_unused_response_leaves_no_body_on_its_connection(scripted, blob: bytes, one_attempt, first: str) -> None:
    """A short unused body (a 503's) is read off, and its connection serves the next request;
    a long one (a whole object where a range was asked for) closes its connection."""
    server = scripted(lambda n: first if n == 0 else "ok")
    with pytest.raises(SourceError, match="HTTP 503" if first == "503" else "does not honour Range") as error:
        read_range(server.url, 100, 2000)
    assert read_range(server.url, 100, 2000) == blob[100:2000]  # with the error (and its frames) still held
    assert error.value and server.connections == (1 if first == "503" else 2)


def _cut_then_clean(url: str, data: bytes, stop_cutting: Callable[[], None]) -> None:
    cut, after = Count(), Count()
    assert read_range(url, 0, 60_000, stats=cut) == data[:60_000]
    stop_cutting()
    assert read_range(url, 5, 50_000, stats=after) == data[5:50_000]
    assert cut.value >= 1 and after.value == 0


def test_after_a_cut_the_next_request_needs_no_retry(scripted, nginx: str, web_root: Path, blob: bytes,
                                                     fast_retries) -> None:
    server = scripted(lambda n: "cut" if n == 0 else "ok")
    _cut_then_clean(server.url, blob, lambda: None)
    proxy = FaultProxy(port_of(nginx), {"cut": 1.0})
    try:
        _cut_then_clean(f"{proxy.url}/data/part-000000.tar", (web_root / "data" / "part-000000.tar").read_bytes(),
                        lambda: setattr(proxy, "faults", {}))
    finally:
        proxy.close()



def test_an_object_shorter_than_the_range_asked_is_cut_short_at_once(nginx: str, web_root: Path, caplog) -> None:
    """nginx answers a range past the end with the bytes there are and the object's size: that
    is a short object, not a cut to resume (which was retried, logged, then refused as a 416)."""
    whole = (web_root / "data" / "part-000002.tar").read_bytes()
    (web_root / "short").mkdir(exist_ok=True)
    (web_root / "short" / "part.tar").write_bytes(whole[:5000])
    count = Count()
    with pytest.raises(CutShort, match=r"short/part\.tar at byte 5000: ends at byte 5000, expected data up to byte "
                                       r"8192$"):
        read_range(f"{nginx}/short/part.tar", 1000, 8192, stats=count)
    assert count.value == 0 and not [r for r in caplog.records if "retrying" in r.getMessage()
                                     or "resuming" in r.getMessage()]
    assert read_range(f"{nginx}/short/part.tar", 1000, 5000) == whole[1000:5000]


def test_the_object_size_is_read_from_content_range_only_where_it_is_given() -> None:
    from pipeline.storage.http import object_size

    assert [object_size(header) for header in ("bytes 0-99/1234", "bytes */1234", "bytes 0-99/*", None, "",
                                               "bytes 0-99/\xb2")] == [1234, 1234, None, None, None, None]
