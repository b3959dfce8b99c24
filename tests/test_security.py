"""Data is never code, and names from data never leave a folder.

- Reading shards, indexes and sample files never unpickles and never runs a command: pickled
  members stay bytes, a pickled ``.npy`` or ``.pt`` is refused, an index cannot name a
  ``pipe:`` command.
- Keys, shard prefixes, split names, cache file names and symlinks cannot make a build or the
  shard cache write or read outside their folders.
"""

from __future__ import annotations

import io
import pickle
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch

import pipeline
from pipeline import FolderSource, Part, SampleError, ShardWriter
from pipeline.storage import SourceError, join
from pipeline.storage.cache import ShardCache
from tests.storage.servers import FileServer


class Marker:
    """Unpickling it creates the file ``path``: the proof that a loader ran code from data."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def files_under(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if not path.is_dir()}


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_pickled_members_of_foreign_shards_stay_bytes(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    payload = pickle.dumps(Marker(marker))
    extensions = ("pyd", "pickle", "pth", "pkl", "pt")
    with tarfile.open(tmp_path / "foreign.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(6):
            for ext in extensions:
                add_member(tar, f"k{i}.{ext}", payload)
            add_member(tar, f"k{i}.cls", str(i).encode())
    batches = list(pipeline.ShardDataset([str(tmp_path / "foreign.tar")], batch_size=6, shuffle=False))
    assert [int(i) for i in batches[0]["cls"]] == list(range(6))
    assert all(list(batches[0][ext]) == [payload] * 6 for ext in extensions)
    assert not marker.exists()


def test_a_pickled_npy_member_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    buffer = io.BytesIO()
    np.save(buffer, np.array([Marker(marker)], dtype=object), allow_pickle=True)
    with tarfile.open(tmp_path / "foreign.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        add_member(tar, "k0.npy", buffer.getvalue())
    with pytest.raises(pipeline.ShardError, match=r"foreign\.tar.*pickle"):
        list(pipeline.ShardDataset([str(tmp_path / "foreign.tar")], batch_size=1))
    assert not marker.exists()


def test_msgpack_extension_types_never_unpickle(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    payload = pickle.dumps(Marker(marker))
    for record in [payload] + [msgpack.packb({"x": msgpack.ExtType(code, payload)}) for code in range(128)]:
        try:
            pipeline.decode_record(record)
        except (pipeline.FormatError, ValueError):
            pass
    assert not marker.exists()


def test_a_pt_sample_file_with_code_in_its_pickle_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    (tmp_path / "data").mkdir()
    torch.save(torch.zeros(3), tmp_path / "data" / "good.pt")
    torch.save({"weights": Marker(marker)}, tmp_path / "data" / "evil.pt")
    assert not marker.exists()
    with pytest.raises(SampleError, match=r"evil\.pt: holds a pickled object \(_?io\.open\) that "
                                              r"torch\.load\(weights_only=True\) refuses to load"):
        pipeline.build_sample_files(tmp_path / "data", {"good": 0, "evil": 1}, {"train": ["good", "evil"]},
                                    tmp_path / "out", quiet=True)
    assert not marker.exists()
    assert not list((tmp_path / "out").rglob("index.json"))


def test_an_index_cannot_make_a_reader_run_a_command(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    pipeline.write_shards(tmp_path / "shards", {"x": np.arange(10)}, prefix="victim", shard_samples=5, quiet=True)
    index = tmp_path / "shards" / "index.json"
    index.write_text(index.read_text().replace("victim-", f"pipe:touch {marker} #://"))
    with pytest.raises((SourceError, pipeline.IndexFormatError)):
        list(pipeline.ShardDataset(tmp_path / "shards", batch_size=4))
    verified = subprocess.run([sys.executable, "-m", "pipeline", "verify", str(tmp_path / "shards")],
                              capture_output=True, text=True, timeout=60)  # each shard fails, and it says so
    assert verified.returncode == 1 and verified.stdout.count("FAIL") == 2, verified.stdout + verified.stderr
    assert "not a file's name: a pipe: command cannot stand for a file" in verified.stdout
    assert "2 of 2 shards failed" in verified.stdout
    assert not marker.exists()
    for base in ("shards", "http://host/shards/", "s3://bucket/shards"):
        with pytest.raises(SourceError, match="a pipe: command cannot stand for a file"):
            join(base, f"pipe:touch {marker} #://")
    assert join("http://host/shards/", "../other/x.tar") == "http://host/other/x.tar"  # names still resolve


@pytest.mark.parametrize("key", ["a\\b", "..\\x", "C:\\x", ".", "..", "line\nfeed", "del\x7f", "k" * 200])
def test_keys_with_backslashes_dots_control_characters_or_too_long_are_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(SampleError, match="key"):
        with ShardWriter(tmp_path) as writer:
            writer.write({"v": 1}, key=key)
    assert not list(tmp_path.rglob("*.tar"))


@pytest.mark.parametrize("prefix", ["../escaped", "/tmp/absolute", "sub/x", "a\\b", "", ".hidden", "p" * 201, "nl\n",
                                    "x{1}"])
def test_shard_prefixes_that_are_not_plain_names_are_refused(tmp_path: Path, prefix: str) -> None:
    out = tmp_path / "out"
    pipeline.write_shards(out, {"x": np.arange(4)}, quiet=True)
    before = files_under(tmp_path)
    with pytest.raises(ValueError, match="prefix"):
        pipeline.write_shards(out, {"x": np.arange(4)}, prefix=prefix, overwrite=True, quiet=True)
    with pytest.raises(ValueError, match="prefix"):
        ShardWriter(out, prefix=prefix, overwrite=True)
    assert files_under(tmp_path) <= before  # nothing written anywhere
    assert not Path("/tmp/absolute-000000.tar").exists()


@pytest.mark.parametrize("split, sample_id", [("../up", "a"), ("a\\b", "a"), ("train", "../../x"), ("train", "/abs")])
def test_split_names_and_sample_ids_cannot_leave_the_output(tmp_path: Path, split: str, sample_id: str) -> None:
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "a.npy", np.zeros(2))
    with pytest.raises(SampleError):
        pipeline.build_sample_files(tmp_path / "data", {sample_id: 0}, {split: [sample_id]}, tmp_path / "out", quiet=True)
    assert files_under(tmp_path) == {tmp_path / "data" / "a.npy"}


def test_cache_file_names_stay_in_the_cache_folder(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", 1 << 30)
    urls = ["http://h/a/../../../../etc/passwd", "http://h/%2e%2e/%2e%2e/x.tar", "http://h/" + "/".join([".."] * 9),
            "http://h/.", "http://h/..", "s3://b//etc/passwd", "http://h/x.tar?next=/../../y", "file:///etc/passwd",
            "http://u:pw@h", "http://h/nul\x00.tar", "http://h/" + "y" * 5000 + ".tar", "http://h/é" * 100,
            "pipe:cat /etc/passwd"]
    for url in urls:
        path = cache.path_for(url)
        assert path.parent == cache.folder and path.name not in (".", "..") and "pw" not in path.name, url
        assert len(path.name.encode()) + len(".part-4194304-140000000000000") <= 255, url
    source = tmp_path / "shard.bin"
    source.write_bytes(b"shard bytes")
    for tail in ("#/../../escaped", "#/%2e%2e/%2e%2e/escaped", "#//tmp/escaped", "#/" + "z" * 3000):
        assert cache.fetch(f"pipe:cat {source} {tail}").read_bytes() == b"shard bytes"
    assert {p.parent for p in files_under(tmp_path)} == {tmp_path, cache.folder}
    assert files_under(tmp_path) - files_under(cache.folder) == {source}


def test_the_folder_converter_refuses_links_to_files_outside_the_folder(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the shards")
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "0001.txt").write_text("one")
    (folder / "0002.txt").symlink_to(folder / "0001.txt")  # inside: fine
    assert FolderSource(folder).keys == ["0001", "0002"]
    (folder / "sub" / "0003.txt").symlink_to(secret)
    with pytest.raises(SampleError, match=r"0003\.txt: a link to .*secret\.txt, outside"):
        FolderSource(folder, recursive=True)
    (folder / "sub" / "0003.txt").unlink()
    (folder / "elsewhere").symlink_to(tmp_path, target_is_directory=True)  # never followed
    assert FolderSource(folder, recursive=True).keys == ["0001", "0002"]


def test_merge_index_writes_only_its_output(tmp_path: Path) -> None:
    for i in range(2):
        pipeline.write_shards(tmp_path / "parts", {"x": np.arange(40)}, shard_samples=10, part=Part(i, 2), quiet=True)
    before = files_under(tmp_path)
    pipeline.merge_index_files([tmp_path / "parts"], tmp_path / "merged" / "all.json")
    assert {p.parent for p in files_under(tmp_path) - before} == {tmp_path / "merged"}
    assert pipeline.load_index(tmp_path / "merged" / "all.json").samples == 40
    assert not list((tmp_path / "parts").glob("index.part-*"))  # merged: removed
    for i in range(2):
        pipeline.write_shards(tmp_path / "parts", {"x": np.arange(40)}, shard_samples=10, part=Part(i, 2), quiet=True,
                              overwrite=True)
    marker = tmp_path / "marker"
    for part in (tmp_path / "parts").glob("index.part-*.json"):
        part.write_text(part.read_text().replace("shard-", f"pipe:touch {marker} #://"))
    with pytest.raises((SourceError, pipeline.IndexFormatError)):
        pipeline.merge_index_files([tmp_path / "parts"], tmp_path / "merged" / "again.json")
    assert not marker.exists() and not (tmp_path / "merged" / "again.json").exists()


def test_a_remote_index_cannot_make_a_reader_read_this_machines_files(tmp_path: Path) -> None:
    """A server's index named its shards file:///...: the loader read local files the server
    chose into training batches."""
    pipeline.write_shards(tmp_path / "local", {"x": np.arange(10)}, prefix="private", quiet=True)
    served = tmp_path / "served"
    shutil.copytree(tmp_path / "local", served)
    index = served / "index.json"
    index.write_text(index.read_text().replace('"private-', f'"{(tmp_path / "local").as_uri()}/private-'))
    with FileServer(served) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_port}/"
        with pytest.raises(SourceError, match=r"private-000000\.tar: a local file cannot stand for a file in "
                                              r"http://127\.0\.0\.1:\d+: a remote index names its own shards"):
            next(iter(pipeline.make_loader(url, num_workers=0)))
        server.shutdown()
    for base in ("http://host/shards/", "s3://bucket/shards", "gs://bucket/shards"):
        for local in ("file:///etc/passwd", "local:///etc/passwd", "simplecache::file:///etc/passwd"):
            with pytest.raises(SourceError, match="a local file cannot stand for a file"):
                join(base, local)
    assert join("gs://bucket/shards", "gs://other/a.tar") == "gs://other/a.tar"  # its own scheme
    assert join("s3://bucket/shards", "https://mirror/shards/a.tar") == "https://mirror/shards/a.tar"  # remote: as given
    assert join("shards", "file:///data/a.tar") == "file:///data/a.tar"  # a local index names local files
    for base in ("s3://bucket/shards", "gs://bucket/shards"):  # (its key: bucket '', said "an S3 URL needs a bucket")
        with pytest.raises(SourceError, match=r"/data/a\.tar: an absolute path cannot stand for a file in "
                                              r"\w+://bucket/shards: the index names a file of the machine that wrote it"):
            join(base, "/data/a.tar")
    assert join("http://host/shards/", "/data/a.tar") == "http://host/data/a.tar"  # a path on the server
