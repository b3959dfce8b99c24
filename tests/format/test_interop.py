"""Our shards are standard: GNU tar and webdataset read them; we read webdataset's shards."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

import pipeline
from pipeline.format.records import decode_fields, iter_records


@pytest.fixture
def our_shards(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    pipeline.write_shards(tmp_path / "s", {"x": rng.random((50, 4), dtype=np.float32), "y": np.arange(50)},
                          prefix="train", shard_samples=20, pack=1, quiet=True)
    return tmp_path / "s"


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar not installed")
def test_gnu_tar_lists_our_shards(our_shards: Path) -> None:
    listing = subprocess.run(["tar", "-tf", str(our_shards / "train-000000.tar")],
                             check=True, capture_output=True, text=True).stdout.split()
    assert listing == [f"{i:012d}.msgpack" for i in range(20)]


def test_webdataset_iterates_our_shards_with_the_one_line_decoder(our_shards: Path) -> None:
    urls = [str(our_shards / f"train-{i:06d}.tar") for i in range(3)]
    dataset = wds.WebDataset(urls, shardshuffle=False).decode(
        wds.handle_extension("msgpack", pipeline.decode_record))
    samples = list(dataset)
    assert [s["__key__"] for s in samples] == [f"{i:012d}" for i in range(50)]
    assert [int(s["msgpack"]["y"]) for s in samples] == list(range(50))
    assert samples[7]["msgpack"]["x"].shape == (4,)


def test_webdataset_shard_writer_output_reads_record_by_record(tmp_path: Path) -> None:
    pattern = str(tmp_path / "wds-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=4) as sink:
        for i in range(10):
            sink.write({"__key__": f"s{i:03d}", "npy": np.full((2, 3), i, np.float32), "cls": i,
                        "json": {"id": i}, "txt": f"text {i}"})
    seen = []
    for path in sorted(tmp_path.glob("wds-*.tar")):
        with open(path, "rb") as src:
            for record in iter_records(src, str(path)):
                fields = decode_fields(record, str(path))
                np.testing.assert_array_equal(fields["npy"], np.full((2, 3), int(fields["cls"]), np.float32))
                assert fields["json"] == {"id": fields["cls"]} and fields["txt"] == f"text {fields['cls']}"
                seen.append(record.key)
    assert seen == [f"s{i:03d}" for i in range(10)]


def test_pickle_members_stay_bytes(tmp_path: Path) -> None:
    import pickle
    import tarfile

    payload = pickle.dumps({"boom": 1})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("a.pickle", "a.pyd"):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    (record,) = list(iter_records(io.BytesIO(buf.getvalue()), "p.tar"))
    assert decode_fields(record, "p.tar") == {"pickle": payload, "pyd": payload}

