"""Servers shared by the storage tests, started once per session and stopped at its end."""

from __future__ import annotations

import multiprocessing
import shutil
import traceback
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

import pipeline
from pipeline.storage.opener import read_range_into
from tests.storage.servers import ACCESS_KEY, SECRET_KEY, start_nginx, start_seaweedfs, stop


@pytest.fixture(scope="session")
def web_root(tmp_path_factory) -> Path:
    """What nginx serves: one uneven, packed shard set with every sample numbered by ``i``."""
    root = tmp_path_factory.mktemp("www")
    from tests.stream.shardsets import random_sizes, uneven_shards

    uneven_shards(root / "data", random_sizes(9, 300, 1800, seed=11), pack=8)
    return root


@pytest.fixture
def foreign_folder(web_root: Path) -> str:
    """The indexed set's shards in a folder without an index: read as foreign shards."""
    folder = web_root / "foreign"
    if not folder.exists():
        folder.mkdir()
        for shard in (web_root / "data").glob("*.tar"):
            shutil.copy(shard, folder)
    return "foreign"


@pytest.fixture(scope="session")
def nginx(tmp_path_factory, web_root: Path) -> Iterator[str]:
    url, process = start_nginx(tmp_path_factory.mktemp("nginx"), web_root)
    yield url
    stop(process)


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory) -> Iterator[str]:
    endpoint, process = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    yield endpoint
    stop(process)


@pytest.fixture
def s3_env(seaweedfs: str, monkeypatch) -> str:
    """Point boto3 at the test server with the right credentials."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweedfs)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return seaweedfs


@pytest.fixture
def fast_retries(monkeypatch) -> None:
    """Short back-off and read timeout, so that fault tests take seconds."""
    monkeypatch.setenv("PIPELINE_RETRY_DELAY", "0.01")
    monkeypatch.setenv("PIPELINE_READ_TIMEOUT", "1")
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "6")


def upload_folder(folder: Path, bucket: str, prefix: str) -> None:
    import boto3

    client = boto3.client("s3")
    for path in sorted(folder.iterdir()):
        client.upload_file(str(path), bucket, f"{prefix}/{path.name}")


def run_in_child(action: Callable[[], None], timeout: float = 120) -> None:
    """``action()`` (assertions and all) in a forked child; its failure, or a hang, fails the test.
    Why: obstore is not fork-safe, and a process that used it cannot fork DataLoader workers that
    use it too. Tests that make obstore read in "their own" process do it in a child, so that the
    tests' process never starts it and the workers it forks later read through it as a training
    job's do."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def run() -> None:
        try:
            action()
            send.send(None)
        except BaseException:  # noqa: BLE001 - everything goes back to the test
            send.send(traceback.format_exc())

    child = context.Process(target=run)
    child.start()
    said = receive.poll(timeout)  # before join: a long message fills the pipe, and its sender waits
    failure = receive.recv() if said else f"the child said nothing in {timeout:g}s (exit code {child.exitcode})"
    child.join(10)
    if child.is_alive():
        child.kill()
    if failure is not None:
        pytest.fail(f"in the child process:\n{failure}")


@pytest.fixture(params=["python", "obstore"])
def through(request, monkeypatch) -> Callable[[Callable[[], None]], None]:
    """Runs a check with ranges read through the Python clients (urllib3, boto3) here, or through
    obstore in a child process (see :func:`run_in_child`)."""
    if request.param == "python":
        monkeypatch.setenv("PIPELINE_OBSTORE", "never")
        return lambda action: action()
    pytest.importorskip("obstore")
    monkeypatch.setenv("PIPELINE_OBSTORE", "always")
    return run_in_child


def read_into(url: str, start: int, stop: int, **options) -> bytes:
    """``read_range`` the way the loader reads remote ranges: into a buffer of the reader's."""
    out = bytearray(stop - start)
    read_range_into(url, start, memoryview(out), **options)
    return bytes(out)


def all_ids(loader) -> list[int]:
    return sorted(i for batch in loader for i in batch["i"].tolist())


def play(source: str, seed: int, state=None, stop: int | None = None):
    """One epoch of sample numbers per batch with 2 workers; with ``stop``, only that many
    batches and the loader's state after them."""
    loader = pipeline.make_loader(source, num_workers=2, batch_size=64, seed=seed, shuffle_buffer=700)
    if state:
        loader.load_state_dict(state)
    batches = []
    for batch in loader:
        batches.append(batch["i"].tolist())
        if stop and len(batches) == stop:
            return batches, loader.state_dict()
    return batches, None


@pytest.fixture(scope="session")
def total_samples(web_root: Path) -> int:
    return pipeline.load_index(web_root / "data").samples


@pytest.fixture
def np_rng() -> np.random.Generator:
    return np.random.default_rng(0)
