"""S3 ranges through either client, boto3 or obstore (``PIPELINE_S3_CLIENT``): the same bytes, the
same errors, the same tolerance of faults; and obstore never used where it would hang (a process
forked after its parent used it)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline import SourceError, make_loader
from pipeline.storage import read_range, s3_ranges
from tests.storage.conftest import all_ids, make_bucket, upload_folder
from tests.storage.servers import FaultProxy

pytest.importorskip("obstore")
SHARD = "s3://clients/train/part-000002.tar"


@pytest.fixture
def clients_bucket(s3_env: str, web_root: Path) -> str:
    make_bucket("clients")
    upload_folder(web_root / "data", "clients", "train")
    return "clients"


@pytest.fixture(params=["boto3", "obstore"])
def client(request, monkeypatch) -> str:
    monkeypatch.setenv("PIPELINE_S3_CLIENT", request.param)
    return request.param


def test_both_clients_read_the_same_bytes_and_name_the_same_errors(clients_bucket: str, web_root: Path, client: str,
                                                                   monkeypatch) -> None:
    local = (web_root / "data" / "part-000002.tar").read_bytes()
    assert read_range(SHARD, 512, 40_000) == local[512:40_000]
    assert s3_ranges.enabled() == (client == "obstore")
    with pytest.raises(SourceError, match=r"s3://clients/train/nope\.tar at byte 7: S3 NoSuchKey: no such key"):
        read_range("s3://clients/train/nope.tar", 7, 10)
    with pytest.raises(SourceError, match=r"s3://no-such-bucket/x at byte 0: S3 NoSuchBucket: no such bucket"):
        read_range("s3://no-such-bucket/x", 0, 10)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(SourceError, match=r"part-000002\.tar at byte 0: S3 SignatureDoesNotMatch: .*bad credentials") as err:
        read_range(SHARD, 0, 10)
    assert "wrong-secret" not in str(err.value)


def test_an_epoch_through_cuts_stalls_trickles_and_503s_delivers_every_sample_once(
        clients_bucket: str, seaweedfs: str, total_samples: int, fast_retries, monkeypatch, client: str) -> None:
    """In this process (no workers): obstore's own time limit on a request must catch a stall and
    a trickle, as boto3's per-read timeout does."""
    proxy = FaultProxy(int(seaweedfs.rsplit(":", 1)[1]), {"cut": 0.15, "stall": 0.04, "trickle": 0.04, "503": 0.1},
                       seed=3, stall_seconds=2)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    try:
        loader = make_loader("s3://clients/train", num_workers=0, batch_size=64, shuffle_buffer=300,
                             chunks_per_buffer=16)
        assert all_ids(loader) == list(range(total_samples))
    finally:
        proxy.close()
    assert proxy.counts["cut"] >= 10 and proxy.counts["503"] >= 5, proxy.counts
    assert proxy.counts["stall"] >= 2 and proxy.counts["trickle"] >= 2, proxy.counts


def _child_reads(queue: multiprocessing.Queue) -> None:
    queue.put((s3_ranges.enabled(), read_range(SHARD, 512, 40_000)))


def test_a_process_forked_after_obstore_was_used_reads_through_boto3(clients_bucket: str, web_root: Path,
                                                                       monkeypatch) -> None:
    """obstore's runtime does not survive a fork: a child calling it would hang for ever."""
    monkeypatch.setenv("PIPELINE_S3_CLIENT", "obstore")
    local = (web_root / "data" / "part-000002.tar").read_bytes()
    assert read_range(SHARD, 0, 100) == local[:100]  # obstore is used in this process
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_reads, args=(queue,))
    child.start()
    child.join(60)
    alive = child.is_alive()
    child.kill()
    assert not alive, "the forked child hung"
    assert queue.get(timeout=5) == (False, local[512:40_000])


def test_by_default_workers_read_through_obstore_and_the_training_process_through_boto3(
        clients_bucket: str, total_samples: int, monkeypatch) -> None:
    """A fresh interpreter, as a training job is: the index is read in it through boto3, so the
    workers forked from it start obstore's runtime each; every sample arrives once."""
    monkeypatch.delenv("PIPELINE_S3_CLIENT", raising=False)
    script = textwrap.dedent(f"""
        from pipeline import make_loader
        from pipeline.storage import s3_ranges

        def read_by_obstore(batch):  # runs in the worker that read the batch
            assert s3_ranges.enabled() and s3_ranges._stores, "a worker read its ranges through boto3"
            return batch

        loader = make_loader("s3://clients/train", num_workers=2, batch_size=64, shuffle_buffer=300,
                             batch_transform=read_by_obstore)
        ids = sorted(i for batch in loader for i in batch["i"].tolist())
        assert ids == list(range({total_samples})), len(ids)
        assert not s3_ranges._stores, "the main process read ranges itself"
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_asking_for_obstore_without_it_is_an_error_that_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setenv("PIPELINE_S3_CLIENT", "auto")
    assert not s3_ranges.enabled()  # this is no DataLoader worker
    monkeypatch.setenv("PIPELINE_S3_CLIENT", "obstore")
    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore now raises ImportError
    with pytest.raises(SourceError, match=r"obstore is not installed: pip install 'pipeline\[s3\]'"):
        s3_ranges.enabled()
    monkeypatch.setenv("PIPELINE_S3_CLIENT", "auto")
    assert not s3_ranges.enabled()
    monkeypatch.setenv("PIPELINE_S3_CLIENT", "fastest")
    with pytest.raises(SourceError, match=r"PIPELINE_S3_CLIENT='fastest': use auto, boto3 or obstore"):
        s3_ranges.enabled()
