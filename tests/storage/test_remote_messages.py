"""What a user is told about remote sets: the same messages as for local ones (a shard given for
an index, a missing shard, ``verify``'s lines), and at once, naming the URL, when a host does not
exist (through our HTTP reader or through fsspec)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

import pipeline
from pipeline.cli import main
from pipeline.storage import RetryPolicy, retry
from pipeline.storage import http as http_backend
from pipeline.storage.errors import CutShort
from pipeline.storage.indexes import UnansweredIndexError
from pipeline.storage.opener import read_bytes
from tests.storage.servers import FaultProxy, FileServer, port_of, refused_port

NO_HOST = "no-such-host.invalid"  # a name that never resolves (RFC 6761)
GONE = "part-000002.tar"


def _no_such_name() -> str:
    """What this machine's resolver says of a name that does not exist."""
    try:
        socket.getaddrinfo(NO_HOST, 80)
    except socket.gaierror as exc:
        return exc.strerror
    raise AssertionError(f"{NO_HOST} resolves")


def _cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def holes(web_root: Path) -> Path:
    """A copy of the served set without one of its shards."""
    folder = Path(shutil.copytree(web_root / "data", web_root / "messages-holes"))
    (folder / GONE).unlink()
    return folder


def test_a_shard_url_given_for_an_index_says_what_to_pass(nginx: str, capsys) -> None:
    url = f"{nginx}/data/part-000000.tar"
    told = (f"error: {url} is a shard, not an index: pass its folder or index.json (or index it first: "
            f"pipeline index {url} --output DIR)\n")
    for command in ("inspect", "verify"):
        assert _cli(capsys, command, url) == (1, "", told)


def test_verify_tells_the_same_of_a_remote_set_as_of_a_local_one(nginx: str, holes: Path, capsys) -> None:
    url = f"{nginx}/messages-holes"
    local = _cli(capsys, "verify", str(holes))
    remote = _cli(capsys, "verify", url)
    assert remote == (local[0], local[1].replace(str(holes), url).replace(
        "cannot open: No such file or directory", "HTTP 404 not found"), "")
    assert remote[0] == 1 and remote[1].endswith(f"\nnot verified {url}: 1 of 9 shards failed: copy them again from where they came from, or build the set again (--overwrite)\n")
    assert f"\nFAIL {url}/{GONE}: missing file or unreadable: HTTP 404 not found\n" in remote[1]


def test_a_shard_missing_on_the_server_gets_the_hint_a_missing_local_one_gets(nginx: str, holes: Path) -> None:
    hint = ("; the shard set is missing a shard its index names ('pipeline verify' lists what is missing): restore "
            "it, or rebuild the set")
    told = {}
    for where, source in (("local", holes), ("remote", f"{nginx}/messages-holes")):
        with pytest.raises(pipeline.SourceError) as caught:
            for _ in pipeline.make_loader(source, num_workers=0, batch_size=64, shuffle=False):
                pass
        told[where] = str(caught.value)
    assert told["local"] == f"{holes / GONE} at byte 0: cannot open: No such file or directory{hint}"
    assert told["remote"] == f"{nginx}/messages-holes/{GONE} at byte 0: HTTP 404 not found{hint}"


def test_a_shard_forbidden_by_the_server_is_named_as_refused_or_missing(nginx: str, holes: Path) -> None:
    """A bucket served over HTTP that may not be listed answers 403 for a file that is not there."""
    url = f"{nginx}/private/messages-holes"
    with pytest.raises(pipeline.SourceError) as caught:
        for _ in pipeline.make_loader(url, num_workers=0, batch_size=64, shuffle=False):
            pass
    assert str(caught.value) == (f"{url}/{GONE} at byte 0: HTTP 403 forbidden; the server may not let this shard be "
                                 f"read, or it is missing (a bucket served over HTTP forbids a file that does not "
                                 f"exist): check what it may serve; 'pipeline verify' lists what is missing")
    with pytest.raises(pipeline.SourceError) as caught:  # an index asked for where there is none: told alike
        pipeline.make_loader(f"{nginx}/private/no-such-set/")
    assert str(caught.value) == (
        f"{nginx}/private/no-such-set/index.json: cannot read index file (HTTP 403 forbidden); the server may not let "
        f"it be read, or there is none (a bucket served over HTTP forbids a file that does not exist): pass an "
        f"index.json, its folder, or a URL of either (https://..., s3://bucket/prefix)")


def test_a_folders_url_without_its_slash_forbidden_by_the_server_says_no_index_nor_shard(nginx: str) -> None:
    """Without the "/", the URL may be a shard: read as one, its 403 was the error, bare
    ("... at byte 0: HTTP 403 forbidden"), and the index's, which says what to pass, was lost."""
    url = f"{nginx}/private/no-such-set"
    with pytest.raises(pipeline.SourceError) as caught:
        pipeline.make_loader(url)
    assert str(caught.value) == (
        f"{url}/index.json: cannot read index file (HTTP 403 forbidden), nor {url} as a shard (HTTP 403 forbidden); "
        f"the server may not let them be read, or neither is there (a bucket served over HTTP forbids a file that "
        f"does not exist): pass an index.json, its folder, or a URL of either (https://..., s3://bucket/prefix)")


class Counts:
    """A RetrySink that counts."""

    def __init__(self) -> None:
        self.requests = self.retries = 0

    def requested(self) -> None:
        self.requests += 1

    def retried(self) -> None:
        self.retries += 1


def test_a_host_that_does_not_resolve_fails_at_once_naming_it(capsys) -> None:
    url = f"http://{NO_HOST}/x/index.json"
    counts = Counts()
    with pytest.raises(pipeline.SourceError) as caught:
        read_bytes(url, RetryPolicy(base_delay=60), stats=counts)  # a retry would wait 30 s or more
    reason = f"host name {NO_HOST!r} does not resolve: {_no_such_name()}"
    assert (str(caught.value), counts.requests, counts.retries) == (f"{url} at byte 0: {reason}", 1, 0)
    assert _cli(capsys, "inspect", url) == (1, "", f"error: {url}: cannot read index file ({reason})\n")


def test_an_index_at_a_server_that_refuses_connections_is_that_error_not_a_shard_to_read(monkeypatch, capsys) -> None:
    """Refused is not "no index here": before, the URL was then read as a shard and its folder
    searched for an index, each after its own retries (2 minutes in tune), and the error blamed
    byte 0 of a shard."""
    monkeypatch.setenv("PIPELINE_RETRY_DELAY", "0.01")
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}/data"
        with pytest.raises(pipeline.SourceError) as caught:
            pipeline.make_loader(url, num_workers=0)
        told = str(caught.value)
        assert told.startswith(f"{url}/index.json: cannot read index file (request failed 8 times, last: ") and \
            "Connection refused" in told
        code, out, err = _cli(capsys, "tune", url, "--workers", "0", "--seconds", "0.2")
    assert (code, out, err) == (1, "", f"error: {told}\n")


def test_an_s3_endpoint_that_does_not_resolve_is_named(monkeypatch) -> None:
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{NO_HOST}:8333")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    with pytest.raises(pipeline.SourceError) as caught:
        read_bytes("s3://bucket/x/index.json", RetryPolicy(base_delay=60))  # a retry would wait 30 s or more
    assert str(caught.value) == (f"s3://bucket/x/index.json at byte 0: the S3 endpoint's host name {NO_HOST!r} "
                                 f"(AWS_ENDPOINT_URL) does not resolve: {_no_such_name()}")


def test_a_host_that_does_not_resolve_through_fsspec_is_a_source_error_naming_the_url(capsys) -> None:
    url = f"ftp://{NO_HOST}/data"
    cause = f"fsspec cannot open it: [Errno {socket.EAI_NONAME}] {_no_such_name()}"
    assert _cli(capsys, "inspect", url) == (1, "", f"error: {url}/index.json: cannot read index file ({cause})\n")
    with pytest.raises(pipeline.SourceError, match=f"^{url}: {cause}$".replace("[", r"\[").replace("]", r"\]")):
        pipeline.make_loader(url, num_workers=0)


class FlakyResolver:
    """This process's resolver, saying "no such name" of every host for its next ``outage``
    lookups (a DNS server restarting, a record being replaced), then answering again."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.outage = 0
        self.words = _no_such_name()

    def __call__(self, host: Any, *args: Any, **kwargs: Any) -> Any:
        if self.outage:
            self.outage -= 1
            raise socket.gaierror(socket.EAI_NONAME, self.words)
        return self.real(host, *args, **kwargs)


def test_a_host_that_answered_earlier_and_stops_resolving_is_retried(nginx: str, monkeypatch) -> None:
    """A name that resolved once is no typo: its resolver failing an hour into a run is
    retried like a refused connection, so that one fault does not end a job of days."""
    monkeypatch.setattr(retry, "_answered", set())  # no test before this one has read from it
    resolver = FlakyResolver(socket.getaddrinfo)
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    url = f"{nginx.replace('127.0.0.1', 'localhost')}/data/index.json"
    policy = RetryPolicy(base_delay=0.01)
    resolver.outage = 1
    counts = Counts()
    with pytest.raises(pipeline.SourceError, match="^.* at byte 0: host name 'localhost' does not resolve: "):
        read_bytes(url, policy, stats=counts)  # never answered: a typo, told at once
    assert (counts.requests, counts.retries) == (1, 0)
    whole = read_bytes(url, policy)
    http_backend._pool().clear()  # the next request needs a new connection, so a lookup
    resolver.outage = 3
    counts = Counts()
    assert read_bytes(url, policy, stats=counts) == whole
    assert (counts.requests, counts.retries, resolver.outage) == (4, 3, 0)
    http_backend._pool().clear()
    resolver.outage = policy.attempts
    with pytest.raises(pipeline.SourceError, match=rf"request failed {policy.attempts} times, last: host name "
                                                   rf"'localhost' does not resolve \(.*\), though it answered "
                                                   rf"earlier in this run$"):
        read_bytes(url, policy)



def _write_answered_hosts(worker_id: int) -> None:
    Path(os.environ["ANSWERED_HOSTS_FILE"]).write_text(json.dumps(sorted(retry._answered)))


def test_a_worker_started_with_spawn_knows_the_hosts_that_answered_the_training_process(
        nginx: str, tmp_path: Path, monkeypatch) -> None:
    """A forked worker inherits them; a spawned one starts with none, so a resolver failing at
    its first read would end the run as a typo would."""
    monkeypatch.setenv("ANSWERED_HOSTS_FILE", str(tmp_path / "answered.json"))
    url = f"{nginx.replace('127.0.0.1', 'localhost')}/data"
    loader = pipeline.make_loader(url, 1, batch_size=4, multiprocessing_context="spawn",
                                  worker_init_fn=_write_answered_hosts)
    next(iter(loader))
    assert "http://localhost" in json.loads((tmp_path / "answered.json").read_text())

def test_verify_of_a_set_whose_shard_table_cannot_be_read_checks_no_shard_against_it(nginx: str, capsys) -> None:
    """Its shards cannot be checked against a table that cannot be read: the result says so,
    not "0 of 9 shards failed" under the table's own line, as if the shards had been checked."""
    proxy = FaultProxy(port_of(nginx), {}, refuse=lambda head: head.startswith(b"GET /data/index.bin ")
                       and b"\r\nrange:" not in head.lower())  # the table's ranges are read, its whole is refused
    try:
        url = f"{proxy.url}/data"
        code, out, err = _cli(capsys, "verify", url)
    finally:
        proxy.close()
    assert (code, err) == (1, "")
    assert out == (f"FAIL {url}/index.bin: missing file or unreadable: HTTP 403 forbidden\n"
                   f"not verified {url}: its shard table cannot be read, so none of its 9 shards was checked\n")


def test_a_damaged_shard_table_on_the_server_is_blamed_not_the_shards(nginx: str, web_root: Path) -> None:
    """Read whole once per process, however many reads (and reader threads) fail at once."""
    folder = Path(shutil.copytree(web_root / "data", web_root / "messages-damaged-table"))
    table = bytearray((folder / "index.bin").read_bytes())
    records = pipeline.load_index(folder).records
    for at in range(len(table) - 4 * records, len(table), 4):  # every record's checksum
        table[at] ^= 0x10
    (folder / "index.bin").write_bytes(bytes(table))
    proxy = FaultProxy(port_of(nginx), {})
    try:
        url = f"{proxy.url}/messages-damaged-table"
        for workers in (0, 0, 2):
            with pytest.raises(pipeline.IndexFormatError, match=rf"^{url}/index.bin: sha256 [0-9a-f]{{64}} differs "
                                                                rf"from the index's [0-9a-f]{{64}}: the shard table is "
                                                                rf"damaged.*is corrupt.*; copy it again with index.json, "
                                                                rf"or re-index its shards(\nRaised in DataLoader worker|$)"):
                for _ in pipeline.make_loader(url, num_workers=workers, batch_size=64, on_error="skip"):
                    pass
    finally:
        proxy.close()
    whole_reads = [head for head in proxy.heads if head.startswith(b"GET /messages-damaged-table/index.bin ")
                   and b"\r\nrange:" not in head.lower()]
    assert 2 <= len(whole_reads) <= 3  # this process's, then a worker's (or two)


def test_a_shard_emptied_on_the_server_is_cut_short_at_once_as_a_local_one_is(nginx: str, web_root: Path) -> None:
    """nginx answers a range of an empty file with the whole of it (200, no bytes): that was
    taken for a connection cut, retried 8 times (25 s), and told as 'connection closed'."""
    folder = Path(shutil.copytree(web_root / "data", web_root / "messages-emptied"))
    os.truncate(folder / GONE, 0)
    told = {}
    for where, source in (("local", folder), ("remote", f"{nginx}/messages-emptied")):
        with pytest.raises(pipeline.SourceError) as caught:
            for _ in pipeline.make_loader(source, num_workers=0, batch_size=64, shuffle=False):
                pass
        told[where] = str(caught.value).replace(str(folder), "SET").replace(f"{nginx}/messages-emptied", "SET")
        assert caught.type is CutShort, told[where]
        assert re.fullmatch(rf"SET/{GONE} at byte 0: ends at byte 0, expected data up to byte \d+: 'pipeline verify "
                            r"SET' lists every shard that fails; .*", told[where]), told[where]


def test_an_index_file_larger_than_any_index_is_refused_unread(tmp_path: Path, monkeypatch) -> None:
    """A server that sends more than an index file can hold (an endless answer, another file) is
    stopped at the limit, with an error naming the URL: not read on until memory runs out."""
    (tmp_path / "index.json").write_text(json.dumps({"version": 2, "padding": "x" * 5000}))
    monkeypatch.setattr("pipeline.storage.indexes.INDEX_FILE_LIMIT", 1000)
    with FileServer(tmp_path) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_port}/index.json"
        with pytest.raises(UnansweredIndexError,
                           match=rf"{re.escape(url)}: cannot read index file \(is larger than 1000 bytes, more than "
                                 rf"any file this is read as"):
            pipeline.make_loader(url, num_workers=0)
        server.shutdown()
