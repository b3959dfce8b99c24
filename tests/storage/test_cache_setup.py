"""The cache of remote shards as a user sets it up: a cache_dir shared with their own files, a
copy a crash left short, a full disk, and option values that are no options."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import make_loader
from pipeline.storage.cache import ShardCache
from tests.helpers import cached_range
from tests.storage.conftest import all_ids


def test_eviction_deletes_only_the_caches_own_copies(nginx: str, tmp_path: Path, total_samples: int) -> None:
    """A cache_dir holding the user's files lost them at the first eviction, and a folder there
    stopped the loop with IsADirectoryError."""
    (tmp_path / "model.pt").write_bytes(b"weights")
    (tmp_path / "runs").mkdir()
    with pytest.warns(UserWarning, match="holds less than the largest shard"):  # (every read evicts)
        loader = make_loader(f"{nginx}/data/", num_workers=0, batch_size=64, cache_dir=tmp_path, cache_bytes=1)
    assert all_ids(loader) == list(range(total_samples))
    assert (tmp_path / "model.pt").read_bytes() == b"weights" and (tmp_path / "runs").is_dir()


def test_a_cached_copy_cut_short_is_downloaded_again(nginx: str, web_root: Path, tmp_path: Path) -> None:
    """A machine that crashed as a copy was written could leave it short: every later run
    failed on it, or under skip lost its samples every epoch."""
    url = f"{nginx}/data/part-000001.tar"
    whole = (web_root / "data" / "part-000001.tar").read_bytes()
    cache = ShardCache(tmp_path, 1 << 30)
    path = cache.fetch(url, len(whole))
    path.write_bytes(whole[:1000])
    assert cached_range(cache, url, 0, len(whole), size=len(whole)) == whole
    assert path.read_bytes() == whole


def test_a_full_disk_is_an_error_naming_the_cache_and_what_to_do(tmp_path: Path) -> None:
    """A bare "No space left on device", naming nothing, which skip let through as an error of
    the shard. /dev/full is a disk that is always full."""
    cache = ShardCache(tmp_path, 1 << 30)
    with open("/dev/full", "wb", buffering=0) as full:
        with pytest.raises(OSError, match=re.escape(f"{tmp_path / 'x.part-1-1'}: cannot use cache_dir {tmp_path} (No "
                                                    f"space left on device): free space there (it needs "
                                                    f"cache_bytes, and room for the downloads under way on top: a "
                                                    f"whole shard each, up to 8 at once in each process that reads, "
                                                    f"workers included), or give a smaller cache_bytes, fewer "
                                                    f"num_workers or another cache_dir")):
            with cache._writing(tmp_path / "x.part-1-1"):
                full.write(b"x" * 4096)


def test_a_cache_folder_removed_while_in_use_is_made_again(nginx: str, web_root: Path, tmp_path: Path) -> None:
    """A scratch cleaner that removes cache_dir as a run goes: its lock files could not be
    opened, a bare FileNotFoundError in the loop (under skip too); the copies are downloaded
    again instead."""
    url = f"{nginx}/data/part-000001.tar"
    whole = (web_root / "data" / "part-000001.tar").read_bytes()
    cache = ShardCache(tmp_path / "cache", 1 << 30)
    assert cached_range(cache, url, 0, len(whole), size=len(whole)) == whole
    shutil.rmtree(tmp_path / "cache")
    assert cached_range(cache, url, 100, 5000, size=len(whole)) == whole[100:5000]
    assert cache.holds(url)


def test_a_cache_folder_that_cannot_be_written_is_an_error_naming_it(nginx: str, tmp_path: Path) -> None:
    """Before: a bare OSError at the first read, in a worker (a read-only one named no file)."""
    where = "/dev/null/cache"
    with pytest.raises(OSError, match=re.escape(f"{where}: cannot use cache_dir {where} (Not a directory): give a "
                                                f"cache_dir this process can write to")):
        make_loader(f"{nginx}/data/", num_workers=0, cache_dir=where)


@pytest.mark.parametrize("options, message", [
    (dict(cache_dir="c", cache_bytes="1GB"), "cache_bytes must be a number of bytes >= 1 (e.g. 100 << 30 for 100 "
                                             "GiB), got '1GB'"),
    (dict(cache_dir="c", cache_bytes=0), "cache_bytes must be a number of bytes >= 1"),
    (dict(cache_dir="c", verify="no"), "verify must be True or False, got 'no'"),
    (dict(verify=True), "cache_bytes and verify are options of the cache of remote shards: pass cache_dir= too"),
    (dict(cache_bytes=1 << 30), "pass cache_dir= too"),
    (dict(cache_dir=""), "cache_dir='' names no folder"),
    (dict(cache_dir="file"), "cache_dir file is a file, not a folder"),
])
def test_cache_options_that_are_no_options_are_errors_naming_them(nginx: str, tmp_path: Path, monkeypatch, options,
                                                                   message: str) -> None:
    monkeypatch.chdir(tmp_path)
    Path("file").write_text("")
    with pytest.raises(ValueError, match=re.escape(message)):
        make_loader(f"{nginx}/data/", num_workers=0, **options)


def test_a_cache_smaller_than_a_shard_is_warned_of_and_a_home_folder_expanded(nginx: str, tmp_path: Path,
                                                                               monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    largest = max(shard.bytes for shard in pipeline.load_index(f"{nginx}/data/").shards)
    with pytest.warns(UserWarning, match=re.escape(f"cache_bytes=1,000 holds less than the largest shard "
                                                   f"({largest:,} bytes): shards are downloaded again and again")):
        loader = make_loader(f"{nginx}/data/", num_workers=0, cache_dir="~/cache", cache_bytes=1000, read_ahead=0)
    next(iter(loader))  # (no read ahead: no shard being admitted in a thread meanwhile, one evicted for it)
    assert list((tmp_path / "cache").glob("*.tar"))


def test_a_relative_cache_dir_is_the_folder_named_when_the_loader_was_made(nginx: str, tmp_path: Path,
                                                                          monkeypatch) -> None:
    """A script that changes its folder after making its loader (into a run's folder) cached the
    shards there, each run folder a cache of its own, which cache_bytes bounded no more."""
    monkeypatch.chdir(tmp_path)
    loader = make_loader(f"{nginx}/data/", num_workers=0, cache_dir="cache")
    (tmp_path / "run1").mkdir()
    monkeypatch.chdir(tmp_path / "run1")
    assert sum(len(batch["x"]) for batch in loader) == loader.dataset.samples
    assert len(list((tmp_path / "cache").glob("*.tar"))) == len(pipeline.load_index(f"{nginx}/data/").shards)
    assert not (tmp_path / "run1" / "cache").exists()


def test_a_cache_dir_given_with_local_shards_makes_no_folder(tmp_path: Path) -> None:
    """Local shards are read in place: the same script over a local copy of a remote set makes
    no empty cache folder."""
    pipeline.write_shards(tmp_path / "local", {"x": np.arange(100)}, quiet=True)
    loader = make_loader(tmp_path / "local", num_workers=0, batch_size=10, cache_dir=tmp_path / "cache")
    assert sum(len(batch["x"]) for batch in loader) == 100
    assert loader.dataset.cache is None and not (tmp_path / "cache").exists()
