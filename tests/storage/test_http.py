"""Streaming from nginx on 127.0.0.1, directly and through a proxy that breaks connections."""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import numpy as np
import pytest

import pipeline
from pipeline import SourceError, make_loader
from pipeline.cli import main
from pipeline.storage import open_stream, read_range
from pipeline.storage.buffers import process_pool
from pipeline.storage.opener import join, parent
from pipeline.stream import idle_trim
from tests.helpers import wait_for
from tests.storage.conftest import all_ids, play, read_into
from tests.storage.servers import LOCKED_USER, FaultProxy, FileServer, ForwardProxy, port_of

warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")


def test_ranges_and_streams_are_byte_exact(nginx: str, web_root: Path, through) -> None:
    local = (web_root / "data" / "part-000003.tar").read_bytes()
    url = f"{nginx}/data/part-000003.tar"

    def check() -> None:
        assert read_range(url, 1000, 70_000) == local[1000:70_000]
        assert read_into(url, 1000, 70_000) == local[1000:70_000]
        with open_stream(url) as stream:
            assert stream.read() == local
    through(check)


def test_missing_object_and_short_object_are_named_errors(nginx: str, web_root: Path, through) -> None:
    size = (web_root / "data" / "part-000000.tar").stat().st_size

    def check() -> None:
        # (urllib3's reads see the object's size in the 206 response; obstore's meet the 416 of a resume)
        short = rf"part-000000\.tar at byte {size}: " + (
            rf"ends at byte {size}, expected data up to byte {size + 100}$"
            if os.environ["PIPELINE_OBSTORE"] == "never" else r"HTTP 416 .*shorter than expected")
        with pytest.raises(SourceError, match=r"/data/nope\.tar at byte 7: HTTP 404 not found"):
            read_range(f"{nginx}/data/nope.tar", 7, 10)
        with pytest.raises(SourceError, match=short):
            read_range(f"{nginx}/data/part-000000.tar", size - 10, size + 100)
        with pytest.raises(SourceError, match=short):
            read_into(f"{nginx}/data/part-000000.tar", size - 10, size + 100)
    through(check)


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_from_an_index_url(nginx: str, total_samples: int, workers: int) -> None:
    loader = make_loader(f"{nginx}/data/index.json", num_workers=workers, batch_size=64, shuffle_buffer=700)
    assert all_ids(loader) == list(range(total_samples))


@pytest.mark.parametrize("moved", ["moved/index.json", "relative/"])
def test_an_index_and_shards_behind_redirects_stream_every_sample_once(nginx: str, total_samples: int,
                                                                       moved: str) -> None:
    loader = make_loader(f"{nginx}/{moved}", num_workers=2, batch_size=64, shuffle_buffer=700)
    assert all_ids(loader) == list(range(total_samples))


def test_a_range_keeps_its_range_through_redirects(nginx: str, web_root: Path, through) -> None:
    local = (web_root / "data" / "part-000003.tar").read_bytes()

    def check() -> None:
        for moved in ("moved", "relative"):
            assert read_range(f"{nginx}/{moved}/part-000003.tar", 1000, 70_000) == local[1000:70_000]
            assert read_into(f"{nginx}/{moved}/part-000003.tar", 1000, 70_000) == local[1000:70_000]
    through(check)


def test_an_error_behind_a_redirect_names_the_url_given_and_where_it_led(nginx: str) -> None:
    with pytest.raises(SourceError, match=r"moved/nope\.tar at byte 7: HTTP 404 not found \(redirected to "
                                          r"http://127\.0\.0\.1:\d+/data/nope\.tar\)"):
        read_range(f"{nginx}/moved/nope.tar", 7, 10)


def test_a_redirect_loop_and_a_folder_without_its_slash_are_named_errors(nginx: str, web_root: Path) -> None:
    with pytest.raises(SourceError, match=r"loop/x\.tar at byte 0: more than 5 redirects"):
        read_range(f"{nginx}/loop/x.tar", 0, 10)
    unindexed = web_root / "unindexed"  # a folder of shards, no index: read as a shard without its "/"
    unindexed.mkdir()
    shutil.copy(web_root / "data" / "part-000000.tar", unindexed)
    with pytest.raises(SourceError, match=r"/unindexed at byte 0: is a folder \(the server redirects it to "
                                          r"http://127\.0\.0\.1:\d+/unindexed/\): pass the URL of its index\.json, "
                                          r"or of the shards in it"):
        make_loader(f"{nginx}/unindexed", num_workers=0, batch_size=64)


@pytest.mark.parametrize("prefix", ["pct%41", "hash#x", "q?x", "col:on"])
def test_shards_whose_names_hold_url_characters_stream_over_http(nginx: str, web_root: Path, prefix: str) -> None:
    """Names were joined to the folder's URL as they are: '%41' read as 'A', '#' began a
    fragment, '?' a query, and the shards, which are there, were reported missing."""
    folder = web_root / f"named-{prefix.encode().hex()}"
    pipeline.write_shards(folder, {"i": np.arange(300)}, shard_samples=100, prefix=prefix, quiet=True)
    assert sorted(all_ids(make_loader(f"{nginx}/{folder.name}/", num_workers=0, batch_size=50))) == list(range(300))


def test_a_user_and_password_in_the_url_are_sent_and_a_401_says_where_they_go(nginx: str,
                                                                            total_samples: int) -> None:
    """urllib3 leaves a URL's credentials out: a server behind a password answered 401, and the
    error said nothing of how to give them."""
    user, password = LOCKED_USER
    locked = nginx.replace("http://", f"http://{user}:{quote(password)}@") + "/locked/data/"
    assert all_ids(make_loader(locked, num_workers=2, batch_size=64)) == list(range(total_samples))
    moved = locked.replace("/locked/", "/locked-moved/")  # redirected to the same host: they go along
    assert all_ids(make_loader(moved, num_workers=0, batch_size=64)) == list(range(total_samples))
    with pytest.raises(SourceError, match=re.escape("HTTP 401 unauthorized (a server behind a password: give the "
                                                    "user and password in the URL, as curl takes them)")) as caught:
        make_loader(nginx.replace("http://", f"http://{user}:wrong-{quote(password)}@") + "/locked/data/")
    assert "wrong" not in str(caught.value)  # (a password in a URL is never shown)


@pytest.mark.parametrize("location", ["/signed/data/?sig=s3cret", "/signed/data?sig=s3cret",
                                      "/signed/data/index.json?sig=s3cret&x=1"])
def test_a_token_in_the_query_of_a_sets_url_goes_to_each_of_its_files(nginx: str, location: str,
                                                                     total_samples: int) -> None:
    """A server (or an Azure SAS) that takes a token in the query answered the index, and then
    403 for the table and every shard, whose URLs were joined without it."""
    assert all_ids(make_loader(nginx + location, num_workers=2, batch_size=64)) == list(range(total_samples))


def test_a_presigned_urls_signature_stays_with_its_object() -> None:
    """An S3 or GCS presigned URL signs its one object: its query sent for another is refused."""
    for query in ("X-Amz-Signature=ab&X-Amz-Credential=k", "X-Goog-Signature=ab", "Signature=ab&Expires=1"):
        index = f"https://bucket.example.org/train/index.json?{query}"
        assert join(parent(index), "train-000.tar") == "https://bucket.example.org/train/train-000.tar"
    assert join(parent("https://h.example.org/t/index.json?sig=a%2Fb"), "s 1.tar") == \
        "https://h.example.org/t/s%201.tar?sig=a%2Fb"


def test_resume_over_http_yields_the_uninterrupted_batches(nginx: str) -> None:
    reference, _ = play(f"{nginx}/data/", seed=2)
    head, state = play(f"{nginx}/data/", seed=2, stop=37)
    tail, _ = play(f"{nginx}/data/", seed=2, state=state)
    assert head + tail == reference


def test_an_epoch_through_cuts_stalls_trickles_and_503s_delivers_every_sample_once(
        nginx: str, total_samples: int, fast_retries) -> None:
    port = port_of(nginx)
    proxy = FaultProxy(port, {"cut": 0.2, "stall": 0.05, "trickle": 0.05, "503": 0.1}, seed=3, stall_seconds=2)
    try:
        loader = make_loader(f"{proxy.url}/data/index.json", num_workers=2, batch_size=64, shuffle_buffer=300,
                             chunks_per_buffer=16)
        assert all_ids(loader) == list(range(total_samples))
    finally:
        proxy.close()
    assert proxy.counts["cut"] >= 20 and proxy.counts["503"] >= 5, proxy.counts
    assert proxy.counts["stall"] >= 2 and proxy.counts["trickle"] >= 2, proxy.counts


def test_a_server_that_never_answers_is_an_error_not_a_hang(fast_retries, monkeypatch) -> None:
    import socket

    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "2")
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never responds
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/x.tar"
        with pytest.raises(SourceError, match=r"x\.tar at byte 0: request failed 2 times"):
            read_range(url, 0, 100)


def test_signed_query_strings_never_reach_error_messages(nginx: str) -> None:
    with pytest.raises(SourceError) as err:
        read_range(f"{nginx}/data/nope.tar?X-Amz-Signature=secret123&X-Amz-Credential=AKIA", 0, 10)
    assert "secret123" not in str(err.value) and "AKIA" not in str(err.value) and "<redacted>" in str(err.value)


def test_the_soak_benchmark_runs_and_every_epoch_is_exact(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_soak.py"
    result = subprocess.run([sys.executable, str(script), "--quick", "--out", str(tmp_path / "soak.json")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "soak.json").read_text())
    epochs = report["epochs"]
    assert epochs and all(e["exact"] and e["samples"] == 5001 and not e["duplicates"] for e in epochs)
    assert report["summary"]["exact_epochs"] == len(epochs) and sum(e["requests"] for e in epochs) > 0


def test_ranges_land_in_buffers_reused_epoch_after_epoch_and_given_back_when_idle(
        nginx: str, total_samples: int, monkeypatch) -> None:
    """An epoch's hundreds of ranges (and the rows joined from them) land in the few buffers the
    reader needs at once, each epoch exactly once; back-to-back epochs reuse them; a reader that
    idles gives them back."""
    gc.collect()  # an earlier test's loader left for the collector gives its buffers back now, not after the trim
    idle_trim.idle_trim().call_off()
    monkeypatch.setattr(idle_trim, "IDLE_S", 600.0)  # no trim between epochs, however slow the machine
    pool = process_pool()
    pool.trim()
    loader = make_loader(f"{nginx}/data/index.json", num_workers=0, batch_size=64, shuffle_buffer=700)
    made_per_epoch = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        made, requests = pool.allocations, loader.stats()["requests"]
        assert all_ids(loader) == list(range(total_samples))
        made, requests = pool.allocations - made, loader.stats()["requests"] - requests
        assert requests > 100 and 0 <= made <= requests // 10, (made, requests)
        made_per_epoch.append(made)
    assert made_per_epoch[0] > 0 and sum(made_per_epoch[1:]) <= 3, made_per_epoch  # was each epoch anew
    assert pool.held_bytes > 0
    monkeypatch.setattr(idle_trim, "IDLE_S", 0.5)
    assert all_ids(loader) == list(range(total_samples))  # an epoch whose end asks for a trim soon
    assert wait_for(lambda: pool.held_bytes == 0, seconds=20)


@pytest.fixture
def server_without_range(web_root: Path) -> Iterator[str]:
    """Python's own file server, which answers a Range request with the whole file."""
    with FileServer(web_root) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()


def test_a_server_that_ignores_range_is_an_error_even_under_skip_and_cache_dir_reads_it(
        server_without_range: str, total_samples: int, tmp_path: Path) -> None:
    """Every piece but a shard's first would fail on such a server: skipping them trained on
    stand-ins for nine samples in ten. Whole shards, downloaded once, need no ranges."""
    url = f"{server_without_range}/data/index.json"
    with pytest.raises(SourceError, match=r"the server does not honour Range requests \(it sent the whole "
                                          r"file\): serve the shards from one that does .*or pass cache_dir="):
        all_ids(make_loader(url, num_workers=0, batch_size=64, on_error="skip"))
    cached = make_loader(url, num_workers=0, batch_size=64, cache_dir=tmp_path / "cache")
    assert all_ids(cached) == list(range(total_samples))


def test_tune_reads_through_a_cache_dir_as_its_error_about_such_a_server_says(
        server_without_range: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The error says to pass cache_dir=; tune had no way to."""
    url, cache = f"{server_without_range}/data/index.json", tmp_path / "cache"
    assert main(["tune", url, "--workers", "0", "--seconds", "0.3", "--batch-size", "64", "--cache-dir",
                 str(cache)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"recommended: pipeline.make_loader({url!r}, num_workers=0, "
                                                    f"batch_size=64, cache_dir={str(cache)!r})")
    assert any(cache.rglob("*.tar"))


def test_a_shard_without_an_index_cut_on_a_server_that_ignores_range_is_an_error_even_under_skip(
        server_without_range: str, foreign_folder: str, fast_retries) -> None:
    """A shard streamed whole resumes a cut with a Range request; on such a server every cut
    would lose the rest of its shard, silently under skip."""
    proxy = FaultProxy(port_of(server_without_range), {"cut": 1.0})
    try:
        loader = make_loader(f"{proxy.url}/{foreign_folder}/part-000000.tar", num_workers=0, batch_size=8,
                             on_error="skip")
        with pytest.raises(SourceError, match=r"part-000000\.tar at byte \d+: the server does not honour Range "
                                              r"requests, which resume a shard after a cut: .*copy them to local disk"):
            all_ids(loader)
    finally:
        proxy.close()


@pytest.fixture
def self_signed_https(web_root: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on loopback serving ``web_root`` with a self-signed certificate: ``(URL, certificate)``."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = FileServer(web_root)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}", cert
    server.shutdown()
    server.server_close()


def test_tls_failures_no_retry_can_mend_are_errors_at_once(nginx: str, web_root: Path, self_signed_https,
                                                           monkeypatch) -> None:
    https, cert = self_signed_https
    plain = nginx.replace("http://", "https://")
    for url, reason in (
            (f"{plain}/data/part-000000.tar", "the server does not speak TLS at this port (SSL: WRONG_VERSION_NUMBER): "
                                              "give its URL with http://, not https://"),
            (f"{https}/data/part-000000.tar", "its TLS certificate cannot be verified (self-signed certificate): point "
                                              "SSL_CERT_FILE (for S3: AWS_CA_BUNDLE) at the bundle of the authority "
                                              "that signed it")):
        started = time.monotonic()
        with pytest.raises(SourceError) as raised:
            read_range(url, 0, 100)
        assert str(raised.value) == f"{url} at byte 0: {reason}"
        assert time.monotonic() - started < 5  # not retried: 8 attempts took 22 s
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # what the message says to do
    assert read_range(f"{https}/data/part-000000.tar", 0, 100) == (web_root / "data" / "part-000000.tar").read_bytes()[:100]


def test_shards_are_read_through_the_proxy_the_environment_names(nginx: str, total_samples: int,
                                                                   monkeypatch) -> None:
    """urllib3 reads no proxy setting: a set reached only through a proxy (a host this machine
    cannot resolve) failed with 'does not resolve', where curl and urllib went through it."""
    proxy = ForwardProxy(port_of(nginx))
    try:
        monkeypatch.setenv("http_proxy", proxy.url.replace("http://", "http://user:p%40ss@"))
        monkeypatch.setenv("no_proxy", "localhost")
        assert all_ids(make_loader("http://data.internal/data/", num_workers=2, batch_size=64)) == \
            list(range(total_samples))
        assert proxy.requests[0] == ("http://data.internal/data/index.json", "Basic dXNlcjpwQHNz")  # (user:p@ss)
        asked = len(proxy.requests)
        for direct in ("127.0.0.1,.internal", "10.0.0.0/8, 127.0.0.0/8"):  # reached directly (a network, as curl)
            monkeypatch.setenv("no_proxy", direct)
            assert all_ids(make_loader(f"{nginx}/data/", num_workers=0, batch_size=64)) == list(range(total_samples))
        assert len(proxy.requests) == asked
        monkeypatch.setenv("no_proxy", "")
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("http_proxy", "")  # (set empty, the lower-case name stands, as urllib reads it)
        assert all_ids(make_loader(f"{nginx}/data/", num_workers=0, batch_size=64)) == list(range(total_samples))
        assert len(proxy.requests) == asked
        monkeypatch.setenv("http_proxy", "socks5h://127.0.0.1:1")
        if importlib.util.find_spec("socks") is None:
            with pytest.raises(SourceError, match=r"data\.internal/data/index\.json: cannot read index file \(the "
                                                  r"environment's proxy socks5h://127\.0\.0\.1:1 is a SOCKS proxy, "
                                                  r"which needs PySocks: pip install pysocks\)"):
                make_loader("http://data.internal/data/", num_workers=0)
    finally:
        proxy.shutdown()
        proxy.server_close()
