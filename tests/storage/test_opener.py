"""The opener's local schemes: paths, file:// URLs, pipe: commands, and unknown schemes."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import SourceError
from pipeline.storage import join, open_stream, read_range, redact
from pipeline.storage.errors import CutShort
from pipeline.storage.file_maps import FileMaps
from pipeline.storage.indexes import NoIndexError
from pipeline.storage.opener import map_range
from tests.stream.shardsets import uneven_shards


def test_file_urls_and_pipe_commands_read_the_same_bytes(tmp_path: Path) -> None:
    data = np.random.default_rng(0).bytes(100_000)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    assert read_range(f"file://{path}", 10, 5000) == data[10:5000]
    assert read_range(f"pipe:cat {path}", 10, 5000) == data[10:5000]
    with open_stream(f"pipe:cat {path}") as stream:
        assert stream.read() == data
    with open_stream(f"pipe:cat {path}") as stream:
        assert stream.read(None) == data  # (io's "everything", as -1)


@pytest.mark.parametrize("name, samples", [("", 70), ("/", 70), ("/part-000000.tar", 40), ("/index.json", 70)])
def test_file_urls_of_a_folder_a_shard_or_an_index_stream_through_the_index(tmp_path: Path, name: str,
                                                                            samples: int) -> None:
    folder = uneven_shards(tmp_path / "s", [40, 30])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a shard of the index read without it warns
        loader = pipeline.make_loader(f"file://{folder}{name}", batch_size=16, num_workers=0)
        ids = sorted(int(i) for batch in loader for i in batch["i"])
    assert ids == list(range(samples)) and len(loader) == -(-samples // 16)  # indexed: foreign shards have no len()


def test_a_file_url_with_a_host_is_refused_not_read_as_the_current_folder(tmp_path: Path, monkeypatch) -> None:
    """file://newset dropped its host, 'newset', and named the current folder: a build with
    overwrite=True replaced the set there. FILE:/// and file:/ (one slash) name absolute paths."""
    monkeypatch.chdir(tmp_path)
    pipeline.write_shards(".", {"x": np.arange(100)}, quiet=True)
    for url in ("file://newset", "file://./newset", "file://"):
        with pytest.raises(ValueError, match=re.escape(f"{url}: a file:// URL names an absolute path on this "
                                                       f"machine, file:///folder/name (three slashes) or "
                                                       f"file://localhost/folder/name")):
            pipeline.write_shards(url, {"x": np.arange(5)}, quiet=True, overwrite=True)
        with pytest.raises(ValueError, match="a file:// URL names an absolute path"):
            pipeline.make_loader(url)
    assert pipeline.load_index(".").samples == 100 and not (tmp_path / "newset").exists()
    for url in (f"FILE://{tmp_path}", f"file:{tmp_path}", f"file://localhost{tmp_path}"):
        assert sum(len(batch["x"]) for batch in pipeline.make_loader(url, batch_size=10)) == 100


def test_a_failing_pipe_command_is_named(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"pipe:cat /nonexistent: command exited with status 1"):
        with open_stream("pipe:cat /nonexistent") as stream:
            stream.read()
    with pytest.raises(SourceError, match=r"pipe:exit 22: command exited with status 22: \(it wrote nothing on "
                                          r"standard error\)"):  # curl -sf, say
        with open_stream("pipe:exit 22") as stream:
            stream.read()


def _read_all_within(url: str, seconds: float) -> bytes | BaseException:
    """What reading ``url`` to its end gives (its bytes or its error), failing the test when it
    takes longer than ``seconds``."""
    out: list = []

    def read() -> None:
        try:
            with open_stream(url) as stream:
                out.append(stream.read())
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            out.append(exc)
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"reading {url[:40]}... still waits after {seconds} s"
    return out[0]


def test_a_pipe_command_that_writes_much_on_standard_error_streams_on(tmp_path: Path) -> None:
    """More than a pipe holds (64 KiB) on standard error, before and after its output."""
    data = np.random.default_rng(2).bytes(300_000)
    (tmp_path / "blob.bin").write_bytes(data)
    noise = "head -c 200000 /dev/zero | tr '\\0' x >&2"
    assert _read_all_within(f"pipe:{noise}; cat {tmp_path}/blob.bin; {noise}", 60) == data
    failed = _read_all_within(f"pipe:{noise}; cat {tmp_path}/blob.bin; echo the real reason >&2; exit 3", 60)
    assert isinstance(failed, SourceError)
    assert str(failed).endswith("command exited with status 3: " + "x" * (300 - len("the real reason")) + "the real reason")


def test_foreign_shards_stream_through_pipe_commands(tmp_path: Path) -> None:
    folder = uneven_shards(tmp_path / "s", [40, 30])
    urls = [f"pipe:cat {folder}/part-{i:06d}.tar" for i in range(2)]
    ids = sorted(int(i) for batch in pipeline.ShardDataset(urls, batch_size=16) for i in batch["i"])
    assert ids == list(range(70))


def test_unknown_schemes_say_what_is_missing() -> None:
    with pytest.raises(SourceError, match=r"gs://bucket/x\.tar.*(fsspec|gcsfs|cannot open|protocol)"):
        open_stream("gs://bucket/x.tar")


def test_a_set_through_fsspec_streams_by_its_folder_url_with_or_without_its_slash(tmp_path: Path) -> None:
    """As an S3 prefix does: not read as a shard named like the folder ("not found"). A shard
    without a suffix is still read as one (its file system refuses a path under it)."""
    fsspec = pytest.importorskip("fsspec")
    folder = uneven_shards(tmp_path / "s", [40, 30])
    memory = fsspec.filesystem("memory")
    for path in folder.iterdir():
        memory.pipe(f"/fsspec-set/{path.name}", path.read_bytes())
    memory.pipe("/fsspec-bare/part-000000", (folder / "part-000000.tar").read_bytes())
    try:
        for url, samples in [("memory://fsspec-set", 70), ("memory://fsspec-set/", 70),
                             ("memory://fsspec-bare/part-000000", 40)]:
            loader = pipeline.make_loader(url, batch_size=16, num_workers=0)
            assert sorted(int(i) for batch in loader for i in batch["i"]) == list(range(samples)), url
        assert len(pipeline.make_loader("memory://fsspec-set", batch_size=16, num_workers=0)) == 5  # indexed
        for path in folder.iterdir():  # a build of splits, given by its folder: not read as a shard ("not found")
            memory.pipe(f"/fsspec-splits/train/{path.name}", path.read_bytes())
        with pytest.raises(NoIndexError, match=r"memory://fsspec-splits/index.json: cannot read index file \(.*\); "
                                               r"memory://fsspec-splits holds the shard sets 'train' \(one per split\): "
                                               r"pass one of them, e.g. memory://fsspec-splits/train$"):
            pipeline.make_loader("memory://fsspec-splits", num_workers=0)
    finally:
        memory.rm(["/fsspec-set", "/fsspec-bare", "/fsspec-splits"], recursive=True)


def test_urls_join_like_folders() -> None:
    assert join("s3://b/train", "part-0.tar") == "s3://b/train/part-0.tar"
    assert join("s3://b/a/train/", "../other/x.tar") == "s3://b/a/other/x.tar"
    assert join("http://h:1/d", "x.tar") == "http://h:1/d/x.tar"
    assert join("s3://b/a", "http://elsewhere/x.tar") == "http://elsewhere/x.tar"
    assert redact("https://user:pw@h/x.tar?X-Amz-Signature=abc") == "https://h/x.tar?<redacted>"


def test_a_retry_setting_that_is_not_a_number_is_an_error_naming_it(monkeypatch) -> None:
    from pipeline.storage.retry import RetryPolicy

    monkeypatch.setenv("PIPELINE_RETRY_DEADLINE", "2m")
    with pytest.raises(ValueError, match=r"PIPELINE_RETRY_DEADLINE='2m' is not a number of seconds \(unset it for "
                                         r"the default, 120\)"):
        RetryPolicy.from_env()
    monkeypatch.setenv("PIPELINE_RETRY_DEADLINE", "30")
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "3.5")
    with pytest.raises(ValueError, match=r"PIPELINE_RETRY_ATTEMPTS='3.5' is not a whole number"):
        RetryPolicy.from_env()


@pytest.mark.parametrize("name, value, default", [("PIPELINE_READ_TIMEOUT", "0", "30"),
                                                  ("PIPELINE_CONNECT_TIMEOUT", "-1", "10"),
                                                  ("PIPELINE_READ_TIMEOUT", "inf", "30")])
def test_a_timeout_of_no_time_is_an_error_naming_it(nginx: str, monkeypatch, name: str, value: str,
                                                    default: str) -> None:
    """Not urllib3's refusal at the first request, which names no setting."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as refused:
        pipeline.make_loader(f"{nginx}/data/", num_workers=0)
    assert str(refused.value) == f"{name}='{value}' is not a finite number of seconds above 0 (unset it for the default, {default})"


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_shard_that_is_not_a_file_is_an_error_naming_it_not_a_hang(tmp_path: Path, kind: str,
                                                                     workers: int) -> None:
    """A FIFO blocked the loader (and verify) for ever in open(), waiting for a writer; a folder
    crashed it with a bare 'No such device' from the memory map, skipped or not."""
    import os
    import subprocess
    import sys

    folder = uneven_shards(tmp_path / "set", [40, 40], pack=4)
    shard = folder / "part-000001.tar"
    shard.unlink()
    os.mkfifo(shard) if kind == "fifo" else shard.mkdir()
    what = "a FIFO" if kind == "fifo" else "a folder"
    for on_error in ("raise", "skip"):
        code = (f"import pipeline\n"
                f"loader = pipeline.make_loader({str(folder)!r}, num_workers={workers}, batch_size=8, "
                f"on_error={on_error!r})\n"
                f"print(sum(len(b['i']) for b in loader), loader.stats()['replaced_samples'])\n")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        if on_error == "raise":
            assert result.returncode == 1, result.stdout
            assert f"part-000001.tar at byte 0: is {what}, not a file: a shard must be a regular file" in \
                result.stderr
        else:  # a counted skip, as of a shard that is missing
            assert result.returncode == 0 and result.stdout.split() == ["80", "40"], result.stderr[-2000:]
    verify = subprocess.run([sys.executable, "-m", "pipeline", "verify", str(folder)], capture_output=True, text=True,
                            timeout=120)
    assert verify.returncode == 1 and f"is {what}, not a file" in verify.stdout


def test_a_range_that_ends_before_it_starts_names_the_file(tmp_path: Path) -> None:
    """A damaged index.bin can give a record an end before its start: mmap said only 'memory
    mapped length must be positive'."""
    (tmp_path / "f.tar").write_bytes(bytes(4096))
    path = str(tmp_path / "f.tar")
    for read in (map_range, FileMaps().range, read_range, lambda url, *span: read_range(f"file://{url}", *span),
                 lambda url, *span: read_range(f"pipe:cat {url}", *span)):  # (read_range gave b"", or a bare ValueError)
        with pytest.raises(SourceError, match=r"f\.tar at byte 3000: a range that ends \(at byte 1000\) before it "
                                              r"starts"):
            read(path, 3000, 1000)


def test_a_pipe_command_that_ends_before_the_range_names_where_it_ends() -> None:
    """It said "ends before byte 4": the bytes left to skip, not a place in the stream."""
    with pytest.raises(CutShort, match=r"pipe:printf abcdef at byte 6: ends at byte 6, expected data from byte 10") \
            as raised:
        read_range("pipe:printf abcdef", 10, 12)
    assert raised.value.offset == 6


def test_a_units_ranges_of_one_file_share_its_mapping_and_see_it_replaced(tmp_path: Path) -> None:
    """Ranges of one file read for a unit are views of one mapping (one descriptor a file,
    however many pieces); a file replaced meanwhile (a cache's copy downloaded again) is mapped
    again, and a range past its end is the error a single range's mapping gives."""
    path = tmp_path / "f.tar"
    path.write_bytes(bytes(range(256)) * 64)
    maps = FileMaps()
    first, second = maps.range(str(path), 10, 20), maps.range(str(path), 5000, 5004)
    assert bytes(first) == bytes(range(10, 20)) and bytes(second) == bytes(range(136, 140))
    assert first.obj is second.obj  # the same mapping
    path.with_name("new").write_bytes(bytes(reversed(range(256))) * 4)
    path.with_name("new").replace(path)
    assert bytes(maps.range(str(path), 0, 3)) == bytes([255, 254, 253]) and bytes(first) == bytes(range(10, 20))
    for read in (map_range, maps.range):
        with pytest.raises(CutShort, match=r"f\.tar at byte 1024: ends at byte 1024, expected data up to byte 2000"):
            read(str(path), 1000, 2000)
    path.write_bytes(b"")
    assert bytes(maps.range(str(path), 0, 0)) == b""


def test_out_of_descriptors_says_to_raise_the_limit(tmp_path: Path) -> None:
    (tmp_path / "f.tar").write_bytes(bytes(4096))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(map(int, os.listdir("/proc/self/fd"))) + 2, hard))
    held = []
    try:
        with contextlib.suppress(OSError):  # every descriptor the limit leaves taken
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        with pytest.raises(SourceError, match=r"f\.tar at byte 0: cannot open: Too many open files \(this process has "
                                              r"as many files open as it may: raise the limit, ulimit -n\)"):
            map_range(str(tmp_path / "f.tar"), 0, 10)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_set_of_thousands_of_small_shards_reads_with_few_files_open(tmp_path: Path, workers: int) -> None:
    """A unit holds a mapping of each shard it reads until it is gathered, and Python's mmap
    held a descriptor for each: a set of 1,500 shards of 4 samples, read in one unit, ran out
    of them ("Too many open files"; 1,024 by default, here 256)."""
    pipeline.write_shards(tmp_path / "small", {"i": np.arange(6_000), "x": np.zeros((6_000, 4), np.float32)},
                          shard_samples=4, quiet=True)
    opened = len(os.listdir("/proc/self/fd"))
    maps = FileMaps()
    views = [maps.range(os.path.join(tmp_path / "small", f"shard-{n:06d}.tar"), 0, 512) for n in range(100)]
    assert len(os.listdir("/proc/self/fd")) == opened and len(views) == 100  # (a view holds no descriptor)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(256, max(map(int, os.listdir("/proc/self/fd"))) + 64), hard))
    try:
        loader = pipeline.make_loader(tmp_path / "small", num_workers=workers, batch_size=256, seed=0)
        ids = np.concatenate([batch["i"].numpy() for batch in loader])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert sorted(ids.tolist()) == list(range(6_000))


def test_a_mapping_still_viewed_at_exit_is_not_unmapped_under_a_reader(tmp_path: Path) -> None:
    """Each mapping's unmapping was a finalizer run at exit, before the handler that stops the
    read-ahead threads still reading: a read at exit then crashed the process (SIGSEGV)."""
    (tmp_path / "f.tar").write_bytes(bytes(range(256)) * 16)
    code = ("import atexit, os, sys\n"
            "from pipeline.storage.page_maps import map_pages\n"
            "atexit.register(lambda: print(bytes(view[1:4]).hex()))  # (runs after handlers registered later)\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "view = map_pages(fd, 4096)\n"
            "os.close(fd)\n")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "f.tar")], capture_output=True, text=True,
                         timeout=60)
    assert (run.returncode, run.stdout) == (0, "010203\n"), run.stderr
