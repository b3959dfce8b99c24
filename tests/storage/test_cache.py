"""The local cache of remote shards: one download per shard, no half-written reads, LRU
eviction that spares shards being read and never deadlocks."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import ShardError, SourceError, make_loader
from pipeline.storage.cache import ShardCache
from tests.helpers import cached_range
from tests.storage.conftest import all_ids
from tests.storage.servers import FaultProxy, port_of


@pytest.fixture
def counting_proxy(nginx: str):
    proxy = FaultProxy(port_of(nginx), {})
    yield proxy
    proxy.close()


def test_each_shard_is_downloaded_once_and_later_epochs_read_the_cache(counting_proxy, tmp_path: Path,
                                                                       total_samples: int) -> None:
    loader = make_loader(f"{counting_proxy.url}/data/", num_workers=2, batch_size=64, shuffle_buffer=500,
                         cache_dir=tmp_path / "cache", verify=True)
    shards = len(pipeline.load_index(f"{counting_proxy.url}/data/index.json").shards)
    first = counting_proxy.counts["ok"]
    assert all_ids(loader) == list(range(total_samples))
    assert counting_proxy.counts["ok"] - first == shards  # one GET per shard, whatever the workers
    assert all_ids(loader) == list(range(total_samples))
    assert counting_proxy.counts["ok"] - first == shards
    assert len(list((tmp_path / "cache").glob("*-part-*.tar"))) == shards


def test_a_download_cut_in_a_response_without_a_length_is_resumed_not_taken_whole(nginx: str, tmp_path: Path,
                                                                                   total_samples: int,
                                                                                   fast_retries) -> None:
    """A response without a Content-Length ends where its connection closes, cut or not: a cut
    download was taken whole, the server blamed ('not the version the index names'), the shard
    refused for 10 minutes, and `pipeline verify` failed every shard."""
    proxy = FaultProxy(port_of(nginx), {}, cut_unsized=lambda head: b".tar " in head)
    try:
        loader = make_loader(f"{proxy.url}/data/", num_workers=0, batch_size=64, cache_dir=tmp_path / "cache")
        assert all_ids(loader) == list(range(total_samples)) and loader.stats()["retries"] > 0
        assert proxy.counts["unsized"] > len(pipeline.load_index(f"{proxy.url}/data/").shards)  # cut, resumed
        assert pipeline.verify(f"{proxy.url}/data/") == []
        assert len(list(pipeline.iter_samples(f"{proxy.url}/data/"))) == total_samples
    finally:
        proxy.close()


def _read_in_process(folder: str, url: str, queue) -> None:
    queue.put(len(cached_range(ShardCache(folder, 1 << 30), url, 0, 4096)))


def test_processes_asking_for_one_shard_at_once_download_it_once(counting_proxy, tmp_path: Path) -> None:
    url = f"{counting_proxy.url}/data/part-000004.tar"
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_read_in_process, args=(str(tmp_path), url, queue)) for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    assert [queue.get(timeout=5) for _ in processes] == [4096] * 4
    assert counting_proxy.counts["ok"] == 1


def test_eviction_spares_shards_being_read_and_limits_smaller_than_a_shard_work(nginx: str, web_root: Path,
                                                                                 tmp_path: Path) -> None:
    urls = [f"{nginx}/data/part-{i:06d}.tar" for i in range(4)]
    sizes = [(web_root / "data" / f"part-{i:06d}.tar").stat().st_size for i in range(4)]
    cache = ShardCache(tmp_path, max_bytes=min(sizes) // 2)  # smaller than any shard
    with cache.reading(urls[0]) as held:
        for url in urls[1:]:
            assert cached_range(cache, url, 0, 100) == (web_root / "data" / url.rsplit("/", 1)[1]).read_bytes()[:100]
        assert held.exists()  # being read: never evicted
    assert cached_range(cache, urls[3], 10, 20)
    assert [p.name.split("-", 1)[1] for p in tmp_path.glob("*.tar")] == ["part-000003.tar"]  # the rest went
    cache.evict()  # nobody holds it now: over the limit, so it goes too
    assert not list(tmp_path.glob("*.tar"))


def test_a_shard_whose_sha256_differs_from_the_index_is_refused(nginx: str, web_root: Path, tmp_path: Path) -> None:
    bad = web_root / "bad"
    shutil.copytree(web_root / "data", bad)
    shard = bad / "part-000001.tar"
    data = bytearray(shard.read_bytes())
    data[pipeline.load_index(bad).shards[1].offsets[2] + 600] ^= 0xFF
    shard.write_bytes(bytes(data))
    loader = make_loader(f"{nginx}/bad/", num_workers=0, batch_size=64, cache_dir=tmp_path, verify=True)
    with pytest.raises(SourceError, match=r"bad/part-000001\.tar: sha256 [0-9a-f]+ differs from the index's"):
        all_ids(loader)
    leftovers = [p.name for p in tmp_path.glob("*part-000001.tar*") if not p.name.endswith(".lock")]
    assert leftovers == []  # nothing half-written or wrong is kept (only its lock file)


def _rebuild(folder: Path, first: int) -> None:
    """A set of 500 samples numbered from ``first``: as long, byte for byte, whatever ``first``."""
    i = np.arange(first, first + 500, dtype=np.int64)
    pipeline.write_shards(folder, {"i": i}, prefix="part", shard_samples=200, pack=1, overwrite=True, quiet=True)


def test_a_set_rebuilt_at_the_same_urls_is_downloaded_again_not_read_from_the_old_copies(
        nginx: str, web_root: Path, tmp_path: Path) -> None:
    _rebuild(web_root / "rebuilt", 0)
    cache = tmp_path / "cache"

    def ids() -> list[int]:
        return all_ids(make_loader(f"{nginx}/rebuilt/", num_workers=0, batch_size=64, cache_dir=cache))
    assert ids() == list(range(500))
    old = sorted(p.name for p in cache.glob("*.tar"))
    _rebuild(web_root / "rebuilt", 1000)  # `pipeline build --overwrite`: same names and sizes, other bytes
    assert ids() == list(range(1000, 1500))
    new = sorted(p.name for p in cache.glob("*.tar"))
    assert len(new) == len(old) == 3 and not set(new) & set(old)  # the old copies went with the new ones


def _dead_pid() -> int:
    """The pid of a process that has ended (and been waited for): no process has it now."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_downloads_a_killed_process_left_are_removed_and_those_under_way_kept(nginx: str, tmp_path: Path) -> None:
    name = ShardCache(tmp_path, 1 << 30).path_for(f"{nginx}/data/part-000001.tar").name
    abandoned = tmp_path / f"{name}.part-{_dead_pid()}-1"
    under_way = tmp_path / f"{name}.part-{os.getpid()}-1"
    for partial in (abandoned, under_way):
        partial.write_bytes(b"half a shard")
    ShardCache(tmp_path, 1 << 30)  # opening the cache
    assert not abandoned.exists() and under_way.exists()
    cache = ShardCache(tmp_path, 0)
    abandoned.write_bytes(b"half a shard")  # killed after the cache was opened: eviction takes it
    cached_range(cache, f"{nginx}/data/part-000002.tar", 0, 100)
    assert not abandoned.exists() and under_way.exists()


def test_a_download_whose_process_this_one_cannot_see_is_kept_while_it_holds_its_lock(tmp_path: Path) -> None:
    """Its process may be in another PID namespace (a container sharing the folder): the shard's
    lock, which a download holds throughout, says it is under way."""
    partial = tmp_path / f"0123456789abcdef01234567-part-000001.tar.part-{_dead_pid()}-1"
    partial.write_bytes(b"half a shard")
    with open(tmp_path / "0123456789abcdef01234567-part-000001.tar.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ShardCache(tmp_path, 1 << 30)
        assert partial.exists()
    ShardCache(tmp_path, 1 << 30)
    assert not partial.exists()


def test_a_cached_copy_that_fails_a_check_is_dropped_so_a_mended_server_copy_is_read(nginx: str, web_root: Path,
                                                                                     tmp_path: Path) -> None:
    """A copy damaged on the server, cached, failed every later run (or cost its samples every
    epoch under skip) after the server's copy was mended."""
    folder = web_root / "mended"
    shutil.copytree(web_root / "data", folder)
    shard = folder / "part-000001.tar"
    good = shard.read_bytes()
    damaged = bytearray(good)
    damaged[pipeline.load_index(folder).shards[1].offsets[2] + 600] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    total = pipeline.load_index(folder).samples
    with pytest.raises(ShardError, match=r"mended/part-000001\.tar at byte \d+: .*read from its cached copy, which is "
                                         r"not the version indexed and was deleted: the next read downloads it again"):
        all_ids(make_loader(f"{nginx}/mended/", num_workers=0, batch_size=64, cache_dir=tmp_path))
    loader = make_loader(f"{nginx}/mended/", num_workers=0, batch_size=64, cache_dir=tmp_path, on_error="skip")
    assert len([i for batch in loader for i in batch["i"].tolist()]) == total
    assert loader.stats()["replaced_samples"] == pipeline.load_index(folder).pack  # the damaged record
    shard.write_bytes(good)  # read at once: the damaged copies were kept as the version they are, not the one indexed
    again = make_loader(f"{nginx}/mended/", num_workers=0, batch_size=64, cache_dir=tmp_path, on_error="skip")
    assert all_ids(again) == list(range(total)) and again.stats()["replaced_samples"] == 0
    copies = [p for p in tmp_path.glob("*part-000001.tar") if ".part-" not in p.name]
    assert [p.read_bytes() == good for p in copies] == [True]


def test_lock_files_go_with_their_copies_and_a_lock_on_a_deleted_file_is_taken_again(
        nginx: str, web_root: Path, tmp_path: Path) -> None:
    from pipeline.storage.cache import _locked

    sizes = [(web_root / "data" / f"part-{i:06d}.tar").stat().st_size for i in range(6)]
    cache = ShardCache(tmp_path, max_bytes=max(sizes) * 2)  # two copies at most: the rest evicted
    for _ in range(2):  # two epochs
        for i in range(6):
            assert cached_range(cache, f"{nginx}/data/part-{i:06d}.tar", 0, 512)
    copies = sorted(path.name for path in tmp_path.glob("*.tar"))
    assert len(copies) == 2
    assert sorted(path.name for path in tmp_path.glob("*.lock")) == sorted([".evict.lock"] + [c + ".lock" for c in copies])
    orphan = tmp_path / (copies[0].replace(".tar", "x.tar") + ".lock")  # a copy deleted by hand left its lock
    orphan.touch()
    cache.evict()
    assert not orphan.exists()

    # a waiter whose lock file was deleted by the holder takes the lock on the file now there
    lock = tmp_path / "a.lock"
    entered = threading.Event()

    def wait_for_the_lock() -> None:
        with _locked(lock, fcntl.LOCK_EX):
            entered.set()
            release.wait(10)

    release = threading.Event()
    with _locked(lock, fcntl.LOCK_EX):
        waiter = threading.Thread(target=wait_for_the_lock)
        waiter.start()
        time.sleep(0.2)  # the waiter opened the file and waits in flock
        lock.unlink()
    assert entered.wait(10)
    with open(lock, "a+b") as other:  # the file at the path now is the waiter's: held
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    release.set()
    waiter.join(10)


@pytest.mark.parametrize("damage, verify", [("flipped", True), ("cut", False)])
def test_a_download_not_of_the_indexed_version_is_not_downloaded_again_for_each_piece_under_skip(
        counting_proxy, web_root: Path, tmp_path: Path, caplog, damage: str, verify: bool) -> None:
    """A shard whose download fails its sha256 (verify=True), or is shorter than the index says,
    was downloaded whole again for every piece of it read: 73 downloads of a 9-shard set an epoch."""
    bad = web_root / f"not-indexed-{damage}"
    if not bad.exists():
        shutil.copytree(web_root / "data", bad)
        shard = bad / "part-000001.tar"
        data = bytearray(shard.read_bytes())
        if damage == "flipped":
            data[pipeline.load_index(bad).shards[1].offsets[2] + 600] ^= 0xFF
        shard.write_bytes(bytes(data) if damage == "flipped" else bytes(data[:len(data) // 2]))
    index = pipeline.load_index(bad)
    loader = make_loader(f"{counting_proxy.url}/{bad.name}/", num_workers=0, batch_size=64, cache_dir=tmp_path,
                         verify=verify, on_error="skip", shuffle_buffer=64)  # many pieces of each shard
    first = counting_proxy.counts["ok"]
    delivered = sum(len(batch["i"]) for batch in loader)
    told = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping ")]
    assert len(told) == 1 and re.search(
        r"part-000001\.tar.*: the server's copy is not the version the index names \(rebuilt or replaced since, or "
        r"damaged\): copy the set again whole, index and shards, or 'pipeline verify' it; not downloaded again for 10 "
        r"minutes", told[0]), told
    assert counting_proxy.counts["ok"] - first == len(index.shards)  # the damaged shard too, once
    stats = loader.stats()
    assert stats["skipped_pieces"] > 3 and stats["replaced_samples"] == index.shards[1].samples
    assert delivered == index.samples
