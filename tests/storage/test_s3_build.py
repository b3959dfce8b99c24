"""Builds that write straight to S3: the same bytes as a local build, the index last."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import OutputExistsError, Part, SourceError
from pipeline.storage import read_bytes
from pipeline.storage import s3 as s3_storage
from pipeline.storage.retry import RetryPolicy
from tests.storage.conftest import all_ids
from tests.storage.servers import FaultProxy, make_bucket, port_of

from ..helpers import index_content


@pytest.fixture
def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {"i": np.arange(3000), "x": rng.random((3000, 40), dtype=np.float32)}


@pytest.fixture
def built_bucket(s3_env: str) -> str:
    make_bucket("built")
    return "built"


def test_a_build_to_s3_uploads_the_bytes_of_a_local_build(built_bucket: str, arrays, tmp_path: Path) -> None:
    options = dict(pack=8, shard_bytes=64 << 10, quiet=True)
    local = pipeline.write_shards(tmp_path / "local", arrays, prefix="t", **options)
    remote = pipeline.write_shards("s3://built/run1", arrays, prefix="t", workers=2, **options)
    assert index_content(remote) == index_content(local) and len(local.shards) > 5
    for name in [shard.url for shard in local.shards] + ["index.json", "index.bin"]:
        assert read_bytes(f"s3://built/run1/{name}") == (tmp_path / "local" / name).read_bytes()
    loader = pipeline.make_loader("s3://built/run1", num_workers=2, batch_size=100)
    assert all_ids(loader) == list(range(3000))
    with pytest.raises(OutputExistsError, match=r"s3://built/run1/index\.json already exists"):
        pipeline.write_shards("s3://built/run1", arrays, prefix="t", **options)


def test_a_killed_build_to_s3_is_replaced_as_its_error_says_and_merges_leave_no_staging(
        built_bucket: str, arrays, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "staging").mkdir()
    monkeypatch.setenv("PIPELINE_STAGING_DIR", str(tmp_path / "staging"))
    options = dict(pack=8, shard_bytes=64 << 10, quiet=True)
    pipeline.write_shards("s3://built/killed", arrays, prefix="t", **options)
    s3_storage.delete("s3://built/killed/index.json", RetryPolicy())  # as if killed before its index
    with pytest.raises(OutputExistsError) as refused:
        pipeline.write_shards("s3://built/killed", arrays, prefix="t", **options)
    assert str(refused.value).endswith("and no index names it: overwrite=True (--overwrite) replaces them; or write "
                                       "to another folder, or another prefix")  # no resume: S3 builds have none
    pipeline.write_shards("s3://built/killed", arrays, prefix="t", overwrite=True, **options)
    assert all_ids(pipeline.make_loader("s3://built/killed", num_workers=0, batch_size=100)) == list(range(3000))
    for i in range(2):
        pipeline.write_shards("s3://built/merged", arrays, prefix="p", part=Part(i, 2), **options)
    pipeline.merge_index_files(["s3://built/merged"])
    assert list((tmp_path / "staging").iterdir()) == []


def test_shard_writer_streams_to_s3(built_bucket: str, arrays) -> None:
    with pipeline.ShardWriter("s3://built/writer", "w", shard_samples=700, pack=4) as writer:
        writer.write_columns(arrays)
    index = pipeline.make_loader("s3://built/writer/index.json", num_workers=0, batch_size=500)
    assert all_ids(index) == list(range(3000))


def test_parts_built_to_s3_merge_into_one_index(built_bucket: str, arrays, tmp_path: Path) -> None:
    options = dict(pack=8, shard_bytes=64 << 10, quiet=True)
    for i in range(3):
        pipeline.write_shards("s3://built/parts", arrays, prefix="p", part=Part(i, 3), **options)
    merged, where = pipeline.merge_index_files(["s3://built/parts"])
    assert where == "s3://built/parts/index.json"
    assert index_content(merged) == index_content(pipeline.write_shards(tmp_path / "whole", arrays, prefix="p", **options))


def test_an_upload_that_keeps_failing_leaves_no_index(built_bucket: str, arrays, monkeypatch, fast_retries) -> None:
    """Through a proxy that answers 503 to everything after the first few requests."""
    endpoint = built_bucket and __import__("os").environ["AWS_ENDPOINT_URL"]
    proxy = FaultProxy(port_of(endpoint), {}, fail_after=4)  # (the first look at what the prefix holds)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    try:
        with pytest.raises(SourceError, match=r"s3://built/failing/t-0000\d\d\.tar at byte 0: upload failed 6 times, last: S3 503"):
            pipeline.write_shards("s3://built/failing", arrays, prefix="t", shard_bytes=64 << 10, quiet=True)
    finally:
        proxy.close()
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    from pipeline.storage import s3 as s3_storage
    from pipeline.storage.retry import RetryPolicy

    assert not s3_storage.exists("s3://built/failing/index.json", RetryPolicy())
    assert s3_storage.exists("s3://built/failing/t-000000.tar", RetryPolicy())  # what came before is there


def test_a_dask_build_to_s3_uploads_the_bytes_of_a_local_build(built_bucket: str, arrays, tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    options = dict(pack=8, shard_bytes=64 << 10, quiet=True)
    local = pipeline.write_shards(tmp_path / "local", arrays, prefix="t", **options)
    remote = pipeline.write_shards("s3://built/dask", arrays, prefix="t", engine="dask", workers=2, **options)
    assert index_content(remote) == index_content(local) and len(local.shards) > 5
    for name in [shard.url for shard in local.shards] + ["index.json", "index.bin"]:
        assert read_bytes(f"s3://built/dask/{name}") == (tmp_path / "local" / name).read_bytes()


def test_the_staging_folder_of_a_killed_build_goes_with_the_next_build(built_bucket: str, arrays,
                                                                      tmp_path: Path, monkeypatch) -> None:
    import fcntl
    import os
    import socket
    import subprocess
    import sys

    monkeypatch.setenv("PIPELINE_STAGING_DIR", str(tmp_path))
    host = socket.gethostname()
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)  # a process that is gone
    killed = tmp_path / f"pipeline-staging-{host}-{dead}-abc123xy"
    alive = tmp_path / f"pipeline-staging-{host}-{os.getppid()}-def456xy"  # one still running
    elsewhere = tmp_path / f"pipeline-staging-{host}-77777-{dead}-ghi789xy"  # machine '{host}-77777''s
    hidden = tmp_path / f"pipeline-staging-{host}-{dead}-jkl012xy"  # in another PID namespace: looks gone, holds its lock
    for folder in (killed, alive, elsewhere, hidden):
        folder.mkdir()
        (folder / ".t-000003.tar.tmp-1").write_bytes(b"half a shard")
    with open(hidden / ".held", "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        pipeline.write_shards("s3://built/after-kill", arrays, prefix="t", pack=8, shard_bytes=64 << 10, quiet=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([alive.name, elsewhere.name, hidden.name])


def test_a_build_with_a_wrong_secret_says_what_to_check(built_bucket: str, arrays, monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(SourceError) as refused:
        pipeline.write_shards("s3://built/refused", arrays, quiet=True)
    assert "wrong-secret" not in str(refused.value)
    assert str(refused.value).endswith(": S3 403: forbidden (the credentials are wrong, or may not do this here: check "
                                       "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, and the bucket's "
                                       "permissions)")


def test_an_overwrite_on_s3_removes_the_shards_a_killed_build_wrote_beyond_its_own(built_bucket: str, arrays,
                                                                                   tmp_path: Path) -> None:
    """A local folder was cleaned so; under an S3 prefix the killed run's extra shards stayed, and
    a later 'pipeline index' of the prefix took them for data."""
    from pipeline.storage.destination import destination

    pipeline.write_shards("s3://built/grown", arrays, prefix="t", pack=8, shard_samples=300, quiet=True)  # 10 shards
    s3_storage.delete("s3://built/grown/index.json", RetryPolicy())  # as if killed before its index
    pipeline.write_shards("s3://built/grown", arrays, prefix="t", pack=8, shard_samples=1000, overwrite=True,
                          quiet=True)
    assert sorted(destination("s3://built/grown").list("t-")) == [f"t-00000{n}.tar" for n in range(3)]
    with pytest.raises(ValueError, match=re.escape(
            "s3://built/grown: resume works on local folders; build again with overwrite=True (--overwrite) "
            "instead, which writes every shard")):
        pipeline.write_shards("s3://built/grown", arrays, prefix="t", pack=8, resume=True, quiet=True)


def test_a_dask_worker_without_the_credentials_is_named_in_the_error(built_bucket: str, arrays, monkeypatch,
                                                                     tmp_path: Path) -> None:
    """The user's shell has them, the cluster's workers (started elsewhere) not: the error said
    only "no usable AWS credentials"."""
    distributed = pytest.importorskip("distributed")
    import os

    kept = {name: os.environ[name] for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    for name in kept:
        monkeypatch.delenv(name)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "none"))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        for name, value in kept.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(SourceError, match=r"s3://built/no-credentials/t-000000\.tar at byte 0: no usable AWS "
                                              r"credentials: .* \(on Dask worker tcp://127\.0\.0\.1:\d+, whose "
                                              r"environment needs the storage's settings and credentials too\)"):
            pipeline.write_shards("s3://built/no-credentials", arrays, prefix="t", engine="dask",
                                  scheduler=cluster.scheduler_address, quiet=True)
