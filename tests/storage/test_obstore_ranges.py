"""Ranges through obstore or through the Python clients (``PIPELINE_OBSTORE``): the same tolerance
of faults over HTTP and S3, obstore never used where it would hang (a process forked after its
parent used it), in DataLoader workers only under ``workers``, and not at all by default. The
same bytes and the same errors through both: ``test_http.py`` and ``test_s3.py`` (their
``through`` fixture)."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline import make_loader
from pipeline.storage import RetryPolicy, obstore_ranges, read_range
from tests.storage.conftest import all_ids, run_in_child, upload_folder
from tests.storage.servers import FaultProxy, make_bucket, port_of

pytest.importorskip("obstore")
SHARD = "s3://clients/train/part-000002.tar"


@pytest.fixture
def clients_bucket(s3_env: str, web_root: Path) -> str:
    make_bucket("clients")
    upload_folder(web_root / "data", "clients", "train")
    return "clients"


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_an_epoch_through_cuts_stalls_trickles_and_503s_delivers_every_sample_once(
        kind: str, request, total_samples: int, fast_retries, monkeypatch, through) -> None:
    """Read without workers: the client's own time limit must end a stall (the proxy would hold it
    for 60 s, longer than the epoch may take), as the Python clients' per-read timeout does."""
    server = request.getfixturevalue("nginx" if kind == "http" else "seaweedfs")
    if kind == "s3":
        request.getfixturevalue("clients_bucket")
    proxy = FaultProxy(port_of(server), {"cut": 0.15, "stall": 0.04, "trickle": 0.04, "503": 0.1},
                       seed=3, stall_seconds=60)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    source = f"{proxy.url}/data/index.json" if kind == "http" else "s3://clients/train"

    def check() -> None:
        began = time.monotonic()
        loader = make_loader(source, num_workers=0, batch_size=64, shuffle_buffer=300, chunks_per_buffer=16)
        assert all_ids(loader) == list(range(total_samples))
        assert time.monotonic() - began < 45, "a stall was waited out, not timed out"
    try:
        through(check)
        counts = dict(proxy.counts)
    finally:
        proxy.close()
    assert counts["cut"] >= 10 and counts["503"] >= 5, counts
    assert counts["stall"] >= 2 and counts["trickle"] >= 2, counts


def test_a_process_forked_after_obstore_was_used_reads_through_boto3(clients_bucket: str, web_root: Path,
                                                                       monkeypatch) -> None:
    """obstore's runtime does not survive a fork: a grandchild calling it would hang for ever."""
    monkeypatch.setenv("PIPELINE_OBSTORE", "always")
    local = (web_root / "data" / "part-000002.tar").read_bytes()

    def grandchild(queue: multiprocessing.Queue) -> None:
        queue.put((obstore_ranges.enabled(), read_range(SHARD, 512, 40_000)))

    def check() -> None:
        assert obstore_ranges.enabled() and read_range(SHARD, 0, 100) == local[:100]  # obstore, in this process
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=grandchild, args=(queue,))
        child.start()
        said = queue.get(timeout=60)  # before join: a large message keeps its sender waiting
        child.join(10)
        child.kill()
        assert said == (False, local[512:40_000])
    run_in_child(check)


def test_under_workers_the_workers_read_through_obstore_and_the_training_process_through_boto3(
        clients_bucket: str, total_samples: int, monkeypatch) -> None:
    """A fresh interpreter, as a training job is: the index is read in it through boto3, so the
    workers forked from it start obstore's runtime each; every sample arrives once."""
    monkeypatch.setenv("PIPELINE_OBSTORE", "workers")
    script = textwrap.dedent(f"""
        from pipeline import make_loader
        from pipeline.storage import obstore_ranges

        def read_by_obstore(batch):  # runs in the worker that read the batch
            assert obstore_ranges.enabled() and obstore_ranges._stores, "a worker read its ranges through boto3"
            return batch

        loader = make_loader("s3://clients/train", num_workers=2, batch_size=64, shuffle_buffer=300,
                             batch_transform=read_by_obstore)
        ids = sorted(i for batch in loader for i in batch["i"].tolist())
        assert ids == list(range({total_samples})), len(ids)
        assert not obstore_ranges._stores, "the main process read ranges itself"
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_urls_obstore_would_not_send_as_they_are_go_through_urllib3() -> None:
    assert obstore_ranges.takes_http("https://data.example.org/shards/part-000001.tar")
    assert not obstore_ranges.takes_http("https://data.example.org/part-000001.tar?X-Amz-Signature=abc")
    assert not obstore_ranges.takes_http("https://user:secret@data.example.org/part-000001.tar")
    assert not obstore_ranges.takes_http("https://data.example.org/part-000001.tar#frag")
    assert not obstore_ranges.takes_http("http://[::1/x.tar")  # urllib3 says what is wrong with it


def test_obstore_is_off_unless_asked_for_and_asking_without_it_says_how_to_install_it(monkeypatch,
                                                                                     tmp_path: Path) -> None:
    monkeypatch.setattr(obstore_ranges, "_worker_pid", os.getpid())  # as if this were a DataLoader worker
    monkeypatch.delenv("PIPELINE_OBSTORE", raising=False)
    assert not obstore_ranges.enabled()
    monkeypatch.setenv("PIPELINE_OBSTORE", "workers")
    assert obstore_ranges.enabled()
    monkeypatch.setattr(obstore_ranges, "_worker_pid", None)
    assert not obstore_ranges.enabled()  # the training process
    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore now raises ImportError
    for mode in ("workers", "always"):
        monkeypatch.setenv("PIPELINE_OBSTORE", mode)
        monkeypatch.setattr(obstore_ranges, "_worker_pid", os.getpid())
        with pytest.raises(ValueError, match=rf"PIPELINE_OBSTORE={mode}, but obstore is not installed: pip install "
                                             rf"'pipeline\[obstore\]'"):
            obstore_ranges.enabled()
    monkeypatch.setenv("PIPELINE_OBSTORE", "fastest")
    with pytest.raises(ValueError, match=re.escape("PIPELINE_OBSTORE='fastest' is not never, workers or always (unset "
                                                   "it for the default, never)")):
        obstore_ranges.enabled()
    with pytest.raises(ValueError, match=re.escape("PIPELINE_OBSTORE='fastest' is not never")):
        make_loader(tmp_path)  # as it is made: its first read (the shard table's) was said to fail instead


def test_paths_obstore_would_rewrite_and_long_ranges_go_through_the_python_clients() -> None:
    assert obstore_ranges.plain_path("shards/train/part-000001.tar")
    for key in ("shards//part.tar", "shards/./part.tar", "shards/../part.tar", "a%2Fb.tar", "shards/"):
        assert not obstore_ranges.plain_path(key), key
    assert not obstore_ranges.takes_http("http://127.0.0.1:1/data//part.tar")
    assert obstore_ranges.MAX_RANGE == 4 << 20


def test_a_whole_request_may_take_as_long_as_the_python_clients_allow_a_slow_link() -> None:
    policy = RetryPolicy(read_timeout=30, stall_bytes=64 << 10)
    assert obstore_ranges._time_limit(policy, 1000) == 30
    assert obstore_ranges._time_limit(policy, 64 << 10) == 30
    assert obstore_ranges._time_limit(policy, 512 << 10) == 240  # 8 x 64 KB, each allowed 30 s
    assert obstore_ranges._time_limit(policy, (512 << 10) + 1) == 480


def test_an_endpoint_in_a_config_files_profile_is_where_obstore_reads_too(clients_bucket: str, web_root: Path,
                                                                          monkeypatch, tmp_path: Path) -> None:
    """boto3 reads it, obstore does not: the index came from the endpoint and every range went
    to AWS, retried for half a minute, then failed as 'error sending request'."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]  # (the test server's, which holds the clients bucket)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    (tmp_path / "config").write_text(f"[profile local]\nendpoint_url = {endpoint}\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "local")
    monkeypatch.setenv("PIPELINE_OBSTORE", "always")
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "1")
    local = (web_root / "data" / "part-000002.tar").read_bytes()

    def check() -> None:
        assert read_range(SHARD, 512, 40_000) == local[512:40_000]
        assert obstore_ranges._stores, "read through boto3, not obstore"
    run_in_child(check)


def test_obstore_takes_the_region_of_aws_region_which_boto3_leaves_unread(monkeypatch, tmp_path: Path) -> None:
    """The README's advice for a bucket in another region, set AWS_REGION, did nothing: obstore
    took boto3's region, and boto3 reads AWS_DEFAULT_REGION only, so the store was us-east-1's."""
    pytest.importorskip("obstore")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setattr(obstore_ranges, "_stores", {})
    assert obstore_ranges._s3_store("bucket", RetryPolicy(), 10.0).config["region"] == "eu-west-3"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")  # boto3's own setting comes first
    monkeypatch.setattr(obstore_ranges, "_stores", {})
    assert obstore_ranges._s3_store("bucket", RetryPolicy(), 10.0).config["region"] == "ap-south-1"
