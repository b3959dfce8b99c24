"""Shards written by webdataset, indexed where they live: served by nginx over HTTP (the index
written locally, naming them by URL) and in an S3 bucket (the index written beside them)."""

from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.storage.indexes import NoIndexError
from tests.storage.conftest import upload_folder
from tests.storage.servers import make_bucket
from tests.write.test_indexing import SIZES, delivered_across_a_resume, every_sample, webdataset_shards

warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")
TOTAL = sum(SIZES)


def test_shards_served_over_http_are_indexed_and_stream_exactly(nginx: str, web_root: Path, tmp_path: Path) -> None:
    webdataset_shards(web_root / "wds-http")
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (web_root / "wds-http").iterdir()}
    with pytest.warns(UserWarning, match=re.escape(
            f"cache_dir={str(tmp_path / 'unused')!r} is not used: shards without an index are streamed through once "
            f"an epoch, not cached; index them (pipeline index URL... --output DIR, then read DIR) to cache them")):
        pipeline.make_loader(f"{nginx}/wds-http/w-{{000000..000004}}.tar", cache_dir=tmp_path / "unused")
    assert not (tmp_path / "unused").exists()
    index = pipeline.index_shards(f"{nginx}/wds-http/w-{{000000..000004}}.tar", tmp_path / "local", workers=2,
                                  quiet=True)
    assert list(index.shards.names)[0] == f"{nginx}/wds-http/w-000000.tar"  # named by URL from a local index
    assert index.samples == TOTAL and index.fields["txt"].optional
    loader = pipeline.make_loader(tmp_path / "local", num_workers=2, batch_size=32, seed=4, shuffle_buffer=100)
    assert sorted(every_sample(loader)) == list(range(TOTAL))
    assert loader.stats()["retries"] == 0
    assert pipeline.verify(tmp_path / "local") == []
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (web_root / "wds-http").iterdir()} == before
    # its shards are remote, though its index is not: they are cached (this was silently ignored)
    cached = pipeline.make_loader(tmp_path / "local", batch_size=32, cache_dir=tmp_path / "cache")
    assert sorted(every_sample(cached)) == list(range(TOTAL))
    assert sorted(p.name[-12:] for p in (tmp_path / "cache").rglob("*.tar")) == [f"w-{n:06d}.tar" for n in range(5)]


def test_shards_in_a_bucket_are_indexed_beside_them_and_stream_exactly(s3_env: str, tmp_path: Path) -> None:
    webdataset_shards(tmp_path / "wds")
    make_bucket("foreign")
    upload_folder(tmp_path / "wds", "foreign", "wds")
    index = pipeline.index_shards("s3://foreign/wds/", quiet=True)  # every .tar under the prefix
    assert list(index.shards.names) == [f"w-{s:06d}.tar" for s in range(len(SIZES))]
    upload_folder(tmp_path / "wds", "foreign", "run.v2")  # a prefix with a dot, without its /: a folder too, as
    assert pipeline.index_shards("s3://foreign/run.v2", quiet=True).samples == TOTAL  # the loader reads it
    loader = pipeline.make_loader("s3://foreign/wds/", num_workers=2, batch_size=32, seed=4, shuffle_buffer=100)
    assert sorted(every_sample(loader)) == list(range(TOTAL))
    assert sorted(delivered_across_a_resume("s3://foreign/wds", stop_after=5)) == list(range(TOTAL))


def test_local_shards_are_not_indexed_into_a_bucket_whose_index_could_not_name_them(s3_env: str,
                                                                                      tmp_path: Path) -> None:
    """The index was written (exit 0) naming the shards by their local paths, which a remote index
    may not name: it failed when read, saying an S3 URL needs a bucket."""
    webdataset_shards(tmp_path / "wds")
    make_bucket("local-shards")
    refused = re.escape(f"{tmp_path / 'wds' / 'w-000000.tar'} is a file on this machine, which an index at "
                        f"s3://local-shards/idx cannot name")
    with pytest.raises(ValueError, match=refused):
        pipeline.index_shards(tmp_path / "wds", "s3://local-shards/idx", quiet=True)
    pipeline.write_shards(tmp_path / "part", {"x": np.arange(10)}, quiet=True, part=pipeline.Part(0, 1))
    with pytest.raises(ValueError, match="is a file on this machine, which an index at s3://local-shards/merged"):
        pipeline.merge_index_files([tmp_path / "part"], "s3://local-shards/merged/index.json")
    with pytest.raises(NoIndexError):  # nothing written
        pipeline.load_index("s3://local-shards/idx")
