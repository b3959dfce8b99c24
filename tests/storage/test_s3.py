"""Streaming from a real S3-compatible server (SeaweedFS on 127.0.0.1), and its errors."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from pipeline import SourceError, make_loader
from pipeline.cli import main
from pipeline.storage import read_bytes, read_range, s3
from tests.storage.conftest import all_ids, play, read_into, upload_folder
from tests.storage.servers import make_bucket, seaweedfs_sockets, start_seaweedfs, stop

warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")


@pytest.fixture
def bucket(s3_env: str, web_root: Path) -> str:
    make_bucket("shards")
    upload_folder(web_root / "data", "shards", "train")
    return "shards"


def test_ranges_are_byte_exact(bucket: str, web_root: Path, through) -> None:
    local = (web_root / "data" / "part-000002.tar").read_bytes()

    def check() -> None:
        assert read_range("s3://shards/train/part-000002.tar", 512, 40_000) == local[512:40_000]
        assert read_into("s3://shards/train/part-000002.tar", 512, 40_000) == local[512:40_000]
        assert read_bytes("s3://shards/train/part-000002.tar") == local
    through(check)


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_from_a_bucket_prefix(bucket: str, total_samples: int, workers: int) -> None:
    loader = make_loader("s3://shards/train", num_workers=workers, batch_size=64, shuffle_buffer=700)
    assert all_ids(loader) == list(range(total_samples))


def test_resume_over_s3_yields_the_uninterrupted_batches(bucket: str) -> None:
    reference, _ = play("s3://shards/train/", seed=4)
    head, state = play("s3://shards/train/", seed=4, stop=29)
    tail, _ = play("s3://shards/train/", seed=4, state=state)
    assert head + tail == reference


def test_missing_key_bucket_and_bad_credentials_are_named(bucket: str, through) -> None:
    def check() -> None:
        with pytest.raises(SourceError, match=r"s3://shards/train/nope\.tar at byte 7: S3 NoSuchKey: no such key"):
            read_range("s3://shards/train/nope.tar", 7, 10)
        with pytest.raises(SourceError, match=r"s3://no-such-bucket/x at byte 0: S3 NoSuchBucket: no such bucket"):
            read_range("s3://no-such-bucket/x", 0, 10)
        with pytest.raises(SourceError, match=r"no index file|NoSuchKey"):
            make_loader("s3://shards/elsewhere/", num_workers=0)
        os.environ["AWS_SECRET_ACCESS_KEY"] = "wrong-secret"  # monkeypatch's undo is the test's
        with pytest.raises(SourceError, match=r"part-000000\.tar at byte 0: S3 SignatureDoesNotMatch: .*bad credentials") as err:
            read_range("s3://shards/train/part-000000.tar", 0, 10)
        assert "wrong-secret" not in str(err.value)
    through(check)


def test_an_endpoint_without_its_scheme_fails_at_once_saying_what_to_write(monkeypatch, capsys) -> None:
    """botocore refuses ``localhost:9000``: no retry mends a setting, so no back-off either."""
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "127.0.0.1:9000")
    monkeypatch.setenv("PIPELINE_RETRY_DELAY", "30")  # a retry would wait 15 s or more
    cause = ("no S3 client can be made from these settings (Invalid endpoint: 127.0.0.1:9000): "
             "AWS_ENDPOINT_URL='127.0.0.1:9000' needs its scheme, as in http://127.0.0.1:9000")
    with pytest.raises(SourceError) as caught:
        read_range("s3://shards/train/part-000000.tar", 7, 10)
    assert str(caught.value) == f"s3://shards/train/part-000000.tar at byte 7: {cause}"
    assert main(["inspect", "s3://shards/train"]) == 1
    assert capsys.readouterr().err == f"error: s3://shards/train/index.json: cannot read index file ({cause})\n"


def test_a_profile_that_is_not_there_fails_at_once_naming_it(monkeypatch, tmp_path: Path) -> None:
    pytest.importorskip("boto3")
    (tmp_path / "config").write_text("[default]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "trainnig")
    monkeypatch.setenv("PIPELINE_RETRY_DELAY", "30")  # a retry would wait 15 s or more
    with pytest.raises(SourceError) as caught:
        read_range("s3://shards/train/part-000000.tar", 0, 10)
    assert str(caught.value) == (
        "s3://shards/train/part-000000.tar at byte 0: no S3 client can be made from these settings (The config "
        "profile (trainnig) could not be found): AWS_PROFILE='trainnig' must name a profile of the AWS config or "
        "credentials files (AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE), or be unset")


def test_a_profile_set_empty_is_named_as_the_setting_refused(monkeypatch, tmp_path: Path) -> None:
    """The hint named AWS_DEFAULT_PROFILE=None, which was not set, for ``export AWS_PROFILE=``."""
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "")
    with pytest.raises(SourceError, match=re.escape("AWS_PROFILE='' must name a profile of the AWS config or "
                                                    "credentials files")):
        read_range("s3://shards/train/part-000000.tar", 0, 10)


def test_no_credentials_at_all_says_where_to_give_them(monkeypatch, tmp_path: Path) -> None:
    """The error said only "no usable AWS credentials: Unable to locate credentials", no next step."""
    pytest.importorskip("boto3")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # (no instance to ask either)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # (never reached: nothing signs the request)
    with pytest.raises(SourceError) as caught:
        read_range("s3://nobucket/train/index.json", 0, 10)
    assert str(caught.value) == ("s3://nobucket/train/index.json at byte 0: no usable AWS credentials: Unable to "
                                 "locate credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE")


def test_ignoring_configured_endpoints_ignores_the_environments_as_boto3_does(monkeypatch) -> None:
    """AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true sent boto3 to AWS, and this library to the endpoint."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert s3.endpoint_and_identity()[0] == "http://127.0.0.1:9"
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "True")
    assert s3.endpoint_and_identity()[0] is None


def test_an_endpoint_setting_left_empty_names_no_endpoint_as_for_boto3(bucket: str, seaweedfs: str, tmp_path: Path,
                                                                      monkeypatch, total_samples: int) -> None:
    """``export AWS_ENDPOINT_URL=`` is unset to boto3, which then takes the config file's endpoint."""
    (tmp_path / "config").write_text(f"[default]\nendpoint_url = {seaweedfs}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "")
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "1")
    assert all_ids(make_loader("s3://shards/train", num_workers=0, batch_size=64)) == list(range(total_samples))


@pytest.mark.parametrize("suffix", [".tar.gz", ".tgz"])
def test_a_gzip_compressed_shard_in_a_bucket_streams_by_its_url(bucket: str, web_root: Path, suffix: str) -> None:
    """Read as a shard, as a local one or an HTTP one is, not refused as no index."""
    import boto3

    shard = web_root / "data" / "part-000001.tar"
    key = f"compressed/part-000001{suffix}"
    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=gzip.compress(shard.read_bytes()))
    expected = [i for batch in make_loader(str(shard), num_workers=0, batch_size=64, shuffle=False)
                for i in batch["i"].tolist()]
    loader = make_loader(f"s3://{bucket}/{key}", num_workers=0, batch_size=64, shuffle=False)
    assert [i for batch in loader for i in batch["i"].tolist()] == expected


def test_a_mix_of_http_and_s3_sources_yields_the_batches_of_the_same_mix_on_disk(
        bucket: str, nginx: str, web_root: Path, total_samples: int) -> None:
    """Remote shards are cut into half as many chunks a window by default (fewer requests): the
    same batches as on disk with ``chunks_per_buffer=32``."""
    def mixed(sources: dict[str, str], **options) -> list[list[int]]:
        loader = make_loader(sources, num_workers=2, batch_size=64, seed=2, shuffle_buffer=700,
                             weights={"web": 0.75, "bucket": 0.25}, **options)
        return [batch["i"].tolist() for batch in loader]

    local = str(web_root / "data")
    remote = mixed({"web": f"{nginx}/data/index.json", "bucket": "s3://shards/train"})
    assert remote == mixed({"web": local, "bucket": local}, chunks_per_buffer=32)
    assert remote != mixed({"web": local, "bucket": local})
    assert sum(map(len, remote)) == 2 * total_samples  # an epoch of a mix: the sources' sizes together


def test_a_seaweedfs_stopped_uncleanly_leaves_no_socket_in_tmp(tmp_path: Path) -> None:
    """SeaweedFS puts its gRPC sockets in /tmp whatever its options, and a stop that comes at a
    bad time (or a kill) leaves some there; the harness removes them once it has exited."""
    _, process = start_seaweedfs(tmp_path / "seaweedfs")
    process.kill()
    left = seaweedfs_sockets(process.ports)
    stop(process)
    assert left and left <= set(process.leftovers) and not seaweedfs_sockets(process.ports)


def test_seaweedfs_starts_in_a_folder_too_deep_for_a_socket_path(tmp_path: Path) -> None:
    """A socket's path has at most 107 bytes: none of SeaweedFS's goes in its (deep) folder."""
    endpoint, process = start_seaweedfs(tmp_path / ("deep" * 20) / "seaweedfs")
    try:
        assert endpoint == f"http://127.0.0.1:{process.ports['s3']}"
    finally:
        stop(process)


@pytest.mark.parametrize("shape", ["embeddings", "images"])
def test_the_remote_benchmark_runs_local_http_and_s3(tmp_path: Path, short_tmp: Path, shape: str) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_remote.py"
    result = subprocess.run([sys.executable, str(script), "--quick", "--shape", shape, "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(short_tmp)})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "bench_remote.json").read_text())
    # nothing left behind: not the servers' logs (in TMPDIR), not SeaweedFS's sockets (in /tmp whatever TMPDIR)
    assert not list(short_tmp.iterdir())
    assert len(report["seaweedfs_ports"]) == 5 and not seaweedfs_sockets(report["seaweedfs_ports"])
    rows = report["rows"]
    assert [(r["source"], r["reader"].split(":")[0]) for r in rows] == [
        ("local", "this loader (2 workers)"), ("http", "curl"), ("http", "this loader (2 workers, urllib3)"),
        ("http", "this loader (2 workers, obstore)"), ("http", "ranged GETs of 512 KB, 8 threads, urllib3"),
        ("http", "ranged GETs of 512 KB, 8 threads, obstore"), ("s3", "boto3 get_object().read()"),
        ("s3", "this loader (2 workers, presigned URLs, urllib3)"), ("s3", "this loader (2 workers, boto3)"),
        ("s3", "this loader (2 workers, obstore)"), ("s3", "this loader (2 workers, cache_dir, epochs 2+)"),
        ("s3", "ranged GETs of 512 KB, 8 threads, presigned URLs, urllib3"),
        ("s3", "ranged GETs of 512 KB, 8 threads, boto3"), ("s3", "ranged GETs of 512 KB, 8 threads, obstore")]
    assert all(r["cpu_ms_per_request"] > 0 for r in rows if r["reader"].startswith("ranged"))
    loaders = [r for r in rows if r["reader"].startswith("this loader")]
    requests = [r["requests"] for r in loaders]
    assert requests[0] == requests[-1] == 0 and min(requests[1:-1]) > 0  # local, and from the cache: none
    assert all(r["loader_cpu_s"] > 0 and r["server_cpu_s"] >= 0 for r in loaders)
    assert all(r["cpu_ceiling_vs_local"] > 0 for r in loaders[1:])
    # every remote row, raw clients included, is compared with the local epochs it took turns with
    assert "local_seconds" not in rows[0] and rows[0]["vs_local"] is None
    assert all(r["vs_local"] == pytest.approx(r["mb_per_s"] / r["local_mb_per_s"]) for r in rows[1:])
    assert all(r["vs_local"] == pytest.approx(r["local_seconds"] / r["seconds"]) for r in loaders[1:])
    assert "CPU ceilings on these" in result.stdout
