"""ShardWriter: limits, names, packing, keys, the index, and what an error leaves behind."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

import pipeline
from pipeline import ArraySource, OutputExistsError, SampleError, ShardWriter
from pipeline.write.splits import build_split_sets
from tests.helpers import index_content, read_back


def test_shards_respect_the_sample_limit_with_deterministic_names(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, "train", shard_samples=40) as writer:
        for i in range(100):
            writer.write({"i": i})
    index = pipeline.load_index(tmp_path)
    assert [s.url for s in index.shards] == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    assert [s.samples for s in index.shards] == [40, 40, 20]
    keys, fields = read_back(tmp_path)
    assert fields["i"] == list(range(100)) and keys == [f"{i:012d}" for i in range(100)]


def test_shards_respect_the_byte_limit(tmp_path: Path) -> None:
    limit = 64 << 10
    with ShardWriter(tmp_path, shard_bytes=limit) as writer:
        for _ in range(100):
            writer.write({"blob": bytes(3000)})
    index = pipeline.load_index(tmp_path)
    assert len(index.shards) > 1 and all(s.bytes <= limit for s in index.shards)
    assert index.samples == 100


def test_packed_records_hold_k_rows_and_only_the_last_of_a_shard_is_shorter(tmp_path: Path, tabular) -> None:
    with ShardWriter(tmp_path, shard_samples=1000, pack=64) as writer:
        writer.write_columns(tabular)
    index = pipeline.load_index(tmp_path)
    assert [s.samples for s in index.shards] == [1000, 1000, 1000]
    assert all(s.records == 16 for s in index.shards)  # 15 x 64 + 1 x 40
    keys, fields = read_back(tmp_path)
    np.testing.assert_array_equal(np.stack(fields["x"]), tabular["x"])
    np.testing.assert_array_equal(np.array(fields["y"]), tabular["y"])
    assert keys == [f"{i:012d}" for i in range(3000)]
    assert index.fields["x"].shape == (10,) and index.fields["x"].dtype == "float32"


def test_packing_per_sample_writes_and_columns_give_the_same_shards(tmp_path: Path, tabular) -> None:
    with ShardWriter(tmp_path / "a", pack=32, shard_samples=500) as writer:
        writer.write_columns(tabular)
    with ShardWriter(tmp_path / "b", pack=32, shard_samples=500) as writer:
        for i in range(7):
            writer.write({"x": tabular["x"][i], "y": tabular["y"][i]})
        writer.write_columns({"x": tabular["x"][7:], "y": tabular["y"][7:]})
    sha = [[s.sha256 for s in pipeline.load_index(tmp_path / d).shards] for d in "ab"]
    assert sha[0] == sha[1]


@pytest.mark.parametrize("pack", [1, 3, 16])
def test_vectorised_and_per_record_encodings_write_identical_shards(tmp_path: Path, pack: int) -> None:
    """Array columns are laid out with NumPy; per-sample writes go record by record (40 samples
    per shard: with pack=3 and 16 every shard also ends with a short record)."""
    rng = np.random.default_rng(pack)
    columns = {"f16": rng.random((203, 3, 2)).astype(np.float16), "u8": rng.integers(0, 255, 203).astype(np.uint8),
               "b": rng.random(203) > 0.5, "big": rng.integers(0, 2**62, (203, 700))}
    pipeline.write_shards(tmp_path / "fast", columns, pack=pack, shard_samples=40, quiet=True)
    with ShardWriter(tmp_path / "stream", pack=pack, shard_samples=40) as writer:
        writer.write_columns(columns)
    with ShardWriter(tmp_path / "slow", pack=pack, shard_samples=40) as writer:
        for i in range(203):
            writer.write({name: col[i] for name, col in columns.items()})
    expected = index_content(pipeline.load_index(tmp_path / "slow"))
    assert len(expected[3]) > 2
    for other in ("fast", "stream"):
        assert index_content(pipeline.load_index(tmp_path / other)) == expected
        assert (tmp_path / other / "index.bin").read_bytes() == (tmp_path / "slow" / "index.bin").read_bytes()
        index = json.loads((tmp_path / other / "index.json").read_bytes())
        assert (index.pop("plan", None) is None) == (other == "stream")  # (a build's record, for a resume)
        assert index == json.loads((tmp_path / "slow" / "index.json").read_bytes())
    with ShardWriter(tmp_path / "bytes", pack=pack, shard_bytes=200 << 10) as writer:
        writer.write_columns(columns)
    index = pipeline.load_index(tmp_path / "bytes")
    assert index.samples == 203 and all(s.bytes <= 200 << 10 for s in index.shards) and len(index.shards) > 3
    np.testing.assert_array_equal(np.stack(read_back(tmp_path / "bytes")[1]["big"]), columns["big"])


def test_index_offsets_sizes_and_sha256_match_the_files(tmp_path: Path, tabular) -> None:
    pipeline.write_shards(tmp_path, tabular, pack=100, shard_bytes=8 << 10, quiet=True)
    index = pipeline.load_index(tmp_path)
    for shard in index.shards:
        data = (tmp_path / shard.url).read_bytes()
        assert len(data) == shard.bytes and hashlib.sha256(data).hexdigest() == shard.sha256
        with tarfile.open(tmp_path / shard.url) as tar:
            assert [m.offset for m in tar.getmembers()] == shard.offsets


def test_given_keys_are_kept_and_duplicates_refused(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "a", pack=2) as writer:
        for key in ["cat", "dog", "emu"]:
            writer.write({"v": len(key)}, key=key)
    assert read_back(tmp_path / "a")[0] == ["cat", "dog", "emu"]
    with pytest.raises(SampleError, match="duplicate sample key 'cat'"):
        with ShardWriter(tmp_path / "b") as writer:
            writer.write({"v": 1}, key="cat")
            writer.write({"v": 2}, key="cat")
    assert not (tmp_path / "b" / "index.json").exists()



def test_write_shards_names_a_repeated_or_bad_key_by_its_rows(tmp_path: Path) -> None:
    keys = [f"id-{n}" for n in range(1000)]
    keys[700] = "id-3"
    with pytest.raises(SampleError, match=re.escape(
            "sample key 'id-3' is given twice, keys[3] and keys[700]: every sample needs a key of its own")):
        pipeline.write_shards(tmp_path / "a", {"x": np.arange(1000)}, keys=keys, quiet=True)
    keys[700] = "scan.700"
    with pytest.raises(SampleError, match=re.escape("keys[700]: sample key 'scan.700' is not allowed: it may not")):
        pipeline.write_shards(tmp_path / "a", {"x": np.arange(1000)}, keys=keys, quiet=True)
    assert not (tmp_path / "a").exists()

@pytest.mark.parametrize("key", ["a/b", "../x", "x.y", "/abs", "nul\0", "__meta__", ""])
def test_keys_that_could_escape_or_break_grouping_are_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(SampleError, match="key"):
        with ShardWriter(tmp_path) as writer:
            writer.write({"v": 1}, key=key)


def test_mixing_given_and_generated_keys_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SampleError, match="every sample or for none"):
        with ShardWriter(tmp_path) as writer:
            writer.write({"v": 1})
            writer.write({"v": 2}, key="k")


def test_samples_with_different_fields_or_dtypes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SampleError, match=re.escape(
            "sample(s) number 1 (no key given) left out: its fields: fields differ from earlier samples (missing "
            "['a'], extra ['b']) (with pack=4, a sample is checked as its record fills, which may be at a later "
            "write); the set is written with the others")):
        with ShardWriter(tmp_path / "a", pack=4) as writer:
            writer.write({"a": 1})
            writer.write({"b": 1})
            writer.close()
    assert pipeline.load_index(tmp_path / "a").samples == 1
    with pytest.raises(SampleError, match="sample 1: field 'a' has dtype float64, earlier samples float32"):
        with ShardWriter(tmp_path / "b") as writer:
            writer.write({"a": np.zeros(2, np.float32)})
            writer.write({"a": np.zeros(2, np.float64)})
    with pytest.raises(SampleError, match=re.escape(
            "sample 1: field 'a' has shape [], earlier samples [2]; an array field needs one number of dimensions in "
            "every sample (their sizes may differ): reshape the odd one")):
        with ShardWriter(tmp_path / "c") as writer:
            writer.write({"a": np.zeros(2, np.float32)})
            writer.write({"a": np.float32(1)})


def test_an_existing_index_is_refused_unless_overwrite_and_stale_shards_go(tmp_path: Path) -> None:
    pipeline.write_shards(tmp_path, {"v": np.arange(100)}, shard_samples=10, quiet=True)
    with pytest.raises(OutputExistsError, match="index.json already exists"):
        pipeline.write_shards(tmp_path, {"v": np.arange(100)}, quiet=True)
    with pytest.raises(OutputExistsError, match=r"index\.json already exists, the index of a set of 10 shards \(100 "
                                                r"samples: shard-000000\.tar, \.\.\.\); pass overwrite=True "
                                                r"\(--overwrite\) to replace it, which deletes the shards it names; "
                                                r"to keep them"):  # a ShardWriter has nothing to resume
        with pipeline.ShardWriter(tmp_path, "shard"):
            pass
    pipeline.write_shards(tmp_path, {"v": np.arange(30)}, shard_samples=10, overwrite=True, quiet=True)
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == [f"shard-{i:06d}.tar" for i in range(3)]
    assert read_back(tmp_path)[1]["v"] == list(range(30))



def test_an_overwrite_that_fails_leaves_only_the_shards_it_wrote(tmp_path: Path) -> None:
    """The old index goes first; the old shards past those written over must go too, else the
    folder holds a mix of old and new shards that ``pipeline index`` would make a set of."""
    with ShardWriter(tmp_path, "shard", shard_samples=10) as old:
        old.write_columns({"v": np.arange(100, 150)})
    with pytest.raises(RuntimeError, match="the source failed"):
        with ShardWriter(tmp_path, "shard", shard_samples=10, overwrite=True) as writer:
            writer.write_columns({"v": np.arange(25)})
            raise RuntimeError("the source failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-000000.tar", "shard-000001.tar"]
    pipeline.index_shards(tmp_path, quiet=True)
    assert read_back(tmp_path)[1]["v"] == list(range(20))  # whole shards of the new samples, and only those
    # a killed writer's shards past those of the next overwrite go once it is closed
    with ShardWriter(tmp_path, "shard", shard_samples=10, overwrite=True) as writer:
        writer.write_columns({"v": np.arange(5)})
    (tmp_path / "index.json").unlink()
    with ShardWriter(tmp_path, "shard", shard_samples=2, overwrite=True) as killed:
        killed.write_columns({"v": np.arange(8)})
    (tmp_path / "index.json").unlink()
    with ShardWriter(tmp_path, "shard", shard_samples=10, overwrite=True) as writer:
        writer.write_columns({"v": np.arange(7)})
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == ["shard-000000.tar"]
    assert read_back(tmp_path)[1]["v"] == list(range(7))

def test_tars_of_another_tool_under_the_shard_names_are_not_written_over(tmp_path: Path) -> None:
    """A folder of webdataset shards (``shard-000000.tar`` is its naming too) and no index: a build
    into it must not replace them unless told to."""
    theirs = {name: os.urandom(3000) for name in ("shard-000000.tar", "shard-000005.tar")}
    for name, data in theirs.items():
        (tmp_path / name).write_bytes(data)
    refusal = re.escape(f"{tmp_path / 'shard-000000.tar'} already exists (2 file(s) under the shard names this build "
                        f"writes), and no index names it: ")
    with pytest.raises(OutputExistsError, match=refusal + r"overwrite=True \(--overwrite\) replaces them"):
        with pipeline.ShardWriter(tmp_path, "shard", shard_samples=10) as writer:
            writer.write({"v": 1})
    np.save(tmp_path / "v.npy", np.arange(50))
    cli = subprocess.run([sys.executable, "-m", "pipeline", "build", "arrays", str(tmp_path), "--array",
                          f"v={tmp_path / 'v.npy'}"], capture_output=True, text=True)
    assert cli.returncode == 1 and "no index names it: --overwrite (overwrite=True in Python) replaces them" in cli.stderr
    assert "resume=True" not in cli.stderr  # no build of this library's stopped there: nothing to resume
    assert {name: (tmp_path / name).read_bytes() for name in theirs} == theirs  # untouched
    pipeline.write_shards(tmp_path, {"v": np.arange(30)}, shard_samples=10, overwrite=True, quiet=True)
    assert read_back(tmp_path)[1]["v"] == list(range(30))
    assert (tmp_path / "shard-000005.tar").read_bytes() == theirs["shard-000005.tar"]  # not a name it wrote


def test_splits_over_a_shard_set_replace_it_or_are_refused(tmp_path: Path) -> None:
    """The splits go beside the old set's index, which a loader given the folder would go on reading."""
    pipeline.write_shards(tmp_path, {"v": np.arange(100)}, shard_samples=10, quiet=True)
    with pytest.raises(OutputExistsError, match=re.escape(
            f"{tmp_path / 'index.json'} already exists: that folder is a shard set, and the splits would go beside "
            f"it ({tmp_path / 'train'}, {tmp_path / 'validation'}) while a loader given the folder reads the old set; "
            f"pass overwrite=True (--overwrite)")):
        pipeline.write_shards(tmp_path, {"v": np.arange(50)}, validation=0.2, quiet=True)
    assert not (tmp_path / "train").exists()
    pipeline.write_shards(tmp_path, {"v": np.arange(50)}, validation=0.2, overwrite=True, quiet=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train", "validation"]  # the old set is gone, whole
    train, validation = (read_back(tmp_path / split)[1]["v"] for split in ("train", "validation"))
    assert sorted(train + validation) == list(range(50)) and len(validation) == 10


@pytest.mark.parametrize("writer", ["write_shards", "ShardWriter"])
def test_a_set_over_splits_removes_them_or_is_refused(tmp_path: Path, writer: str) -> None:
    """The old splits would stay beside the new set, for a script that reads the splits to train on.
    A set of the user's own in a subfolder (its shards not named after it) is left alone."""
    pipeline.write_shards(tmp_path, {"v": np.arange(50)}, validation=0.2, shard_samples=10, quiet=True)
    pipeline.write_shards(tmp_path / "mine", {"v": np.arange(5)}, quiet=True)

    def write(**options) -> None:
        if writer == "write_shards":
            pipeline.write_shards(tmp_path, {"v": np.arange(30)}, quiet=True, **options)
        else:
            with ShardWriter(tmp_path, "shard", **options) as sink:
                for n in range(30):
                    sink.write({"v": n}, key=f"s{n}")
    with pytest.raises(OutputExistsError, match=re.escape(
            f"{tmp_path / 'train' / 'index.json'} already exists: that folder holds the splits of an earlier build "
            f"(train, validation), which would stay beside the new set (a script that reads the splits would train "
            f"or evaluate on them); pass overwrite=True (--overwrite) to remove them")):
        write()
    assert len(read_back(tmp_path / "train")[0]) == 40 and not (tmp_path / "index.json").exists()  # untouched
    write(overwrite=True)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "index.bin", "index.json", "mine/index.bin", "mine/index.json", "mine/shard-000000.tar", "shard-000000.tar"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["mine"]  # no empty train/, validation/
    assert read_back(tmp_path)[1]["v"] == list(range(30)) and read_back(tmp_path / "mine")[1]["v"] == list(range(5))


def test_a_split_build_over_splits_of_other_names_removes_them_or_is_refused(tmp_path: Path) -> None:
    """A partition of train/val/test built again as train/validation with --overwrite left val/
    and test/ of the old build beside the new splits, their samples now in validation/."""
    values = {"v": np.arange(60)}
    build_split_sets({"train": ArraySource(values), "val": ArraySource(values), "test": ArraySource(values)},
                     tmp_path / "out", quiet=True)
    pipeline.write_shards(tmp_path / "out" / "mine", {"v": np.arange(5)}, quiet=True)
    with pytest.raises(OutputExistsError, match=re.escape(
            f"{tmp_path / 'out' / 'test' / 'index.json'} already exists: that folder holds the splits of an earlier "
            f"build (test, val), which would stay beside the new splits (train, validation)")):
        pipeline.write_shards(tmp_path / "out", values, validation=0.5, quiet=True)
    pipeline.write_shards(tmp_path / "out", values, validation=0.5, overwrite=True, quiet=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["mine", "train", "validation"]


def test_overwriting_a_version_1_index_deletes_the_shards_it_named(tmp_path: Path) -> None:
    old = [{"url": f"old-{i:06d}.tar", "samples": 1, "records": 1, "bytes": 1, "sha256": "", "offsets": [0]}
           for i in range(3)]
    (tmp_path / "index.json").write_text(json.dumps({"format": "pipeline-shards", "version": 1, "shards": old}))
    for shard in old:
        (tmp_path / shard["url"]).write_bytes(b"old")
    with pytest.raises(OutputExistsError, match=r"index\.json already exists; pass overwrite=True \(--overwrite\) "
                                                r"to replace it, which deletes the shards it names; to keep"):
        with pipeline.ShardWriter(tmp_path, "shard"):  # (nothing to resume; no count of samples in it)
            pass
    pipeline.write_shards(tmp_path, {"v": np.arange(30)}, shard_samples=10, overwrite=True, quiet=True)
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == [f"shard-{i:06d}.tar" for i in range(3)]


class FailingDisk:
    """Makes the n-th ``os.writev`` fail like a full disk would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_at: int) -> None:
        self.calls = 0
        self.fail_at = fail_at
        self.real = os.writev
        monkeypatch.setattr(os, "writev", self)

    def __call__(self, fd: int, buffers) -> int:
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError(28, "No space left on device")
        return self.real(fd, buffers)


def test_a_write_error_mid_shard_leaves_no_index_and_no_partial_shard(tmp_path: Path, monkeypatch) -> None:
    data = {"x": np.zeros((4000, 1000), np.uint8)}
    disk = FailingDisk(monkeypatch, fail_at=-1)
    pipeline.write_shards(tmp_path / "count", data, shard_bytes=1 << 20, quiet=True)
    disk.fail_at, disk.calls = disk.calls // 2, 0  # fail halfway through the same build
    with pytest.raises(OSError, match="No space left"):
        pipeline.write_shards(tmp_path, data, shard_bytes=1 << 20, quiet=True)
    assert not (tmp_path / "index.json").exists()
    assert not list(tmp_path.glob(".*tmp*"))
    complete = sorted(tmp_path.glob("*.tar"))
    assert complete and len(complete) < 4  # some shards were finished, not all
    for path in complete:  # what is left under a shard name is a whole archive
        with open(path, "rb") as src:
            assert sum(1 for _ in pipeline.iter_records(src, str(path))) > 0
        assert path.read_bytes().endswith(bytes(1024))

    disk.calls = 0
    with pytest.raises(OSError, match="No space left"):
        with ShardWriter(tmp_path / "w", shard_bytes=1 << 20) as writer:
            writer.write_columns(data)
    assert not (tmp_path / "w" / "index.json").exists() and not list((tmp_path / "w").glob(".*tmp*"))


def test_an_empty_input_gives_an_empty_shard_set_that_reads_and_verifies(tmp_path: Path) -> None:
    pipeline.write_shards(tmp_path / "a", {"x": np.zeros((0, 3), np.float32)}, quiet=True)
    ShardWriter(tmp_path / "b").close()
    for folder in (tmp_path / "a", tmp_path / "b"):
        index = pipeline.load_index(folder)
        assert (len(index.shards), index.samples) == (0, 0) and pipeline.verify(folder) == []
    assert list(pipeline.ShardDataset(tmp_path / "a", batch_size=4)) == []


def test_the_build_benchmark_runs(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_build.py"
    result = subprocess.run([sys.executable, str(script), "--quick", "--out", str(tmp_path)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "bench_build.json").read_text())
    cases = {case["case"] for case in report["cases"]}
    assert {"tabular", "tabular webdataset"} <= cases and all(t["value"] > 0 for t in report["targets"])


def test_a_sample_that_disagrees_with_the_others_is_named_by_its_number_when_packed(tmp_path: Path) -> None:
    """Packed, the error named "samples" alone (and by key, a "record" that was a sample)."""
    with pytest.raises(SampleError, match=r"sample 6: field 'a' has dtype float64, earlier samples float32"):
        with ShardWriter(tmp_path / "out", pack=4) as writer:
            for i in range(8):
                writer.write({"a": np.zeros(2, np.float64 if i == 6 else np.float32)})


@pytest.mark.parametrize("pack", [1, 4])
def test_a_refused_sample_leaves_the_writer_as_it_was(tmp_path: Path, pack: int) -> None:
    """A refused write stayed queued: every later sample, and close(), failed on it, and the
    samples written before were lost in a temporary file."""
    with ShardWriter(tmp_path / "fields", pack=pack) as writer:
        for i in range(3):
            writer.write({"y": i})
        with pytest.raises(pipeline.FormatError, match=r"fields|'z'"):
            writer.write({"z": 2})
        writer.write({"y": 9})
    assert read_back(tmp_path / "fields")[1]["y"] == [0, 1, 2, 9]
    with ShardWriter(tmp_path / "keys", pack=pack) as writer:
        writer.write_columns({"y": [1, 2]}, keys=["x", "w"])
        with pytest.raises(SampleError, match="duplicate sample key 'a'"):
            writer.write_columns({"y": [3, 4, 5]}, keys=["a", "b", "a"])
        writer.write_columns({"y": [5, 6]}, keys=["a", "b"])  # none of the refused keys was taken
    assert read_back(tmp_path / "keys") == (["x", "w", "a", "b"], {"y": [1, 2, 5, 6]})


def test_numbers_as_python_or_numpy_scalars_mix_in_one_field(tmp_path: Path) -> None:
    """``labels[i]`` is a ``np.int64``, ``int(...)`` a Python int: a field keeps its first
    sample's form, and values of the other convert to it where exact."""
    with ShardWriter(tmp_path / "python") as writer:
        writer.write({"y": 3, "w": 0.5})
        writer.write_columns({"y": np.arange(4), "w": np.array([0.25] * 4, np.float32)})
        writer.write({"y": np.uint8(7), "w": np.float64(1.5)})
    assert {name: spec.dtype for name, spec in pipeline.load_index(tmp_path / "python").fields.items()} == {
        "y": "int", "w": "float"}
    assert read_back(tmp_path / "python")[1] == {"y": [3, 0, 1, 2, 3, 7], "w": [0.5] + [0.25] * 4 + [1.5]}
    with ShardWriter(tmp_path / "numpy", pack=2) as writer:
        for value in (np.int16(3), 4, np.int16(-5)):
            writer.write({"y": value})
    assert pipeline.load_index(tmp_path / "numpy").fields["y"] == pipeline.FieldSpec("int16", ())
    batch = next(iter(pipeline.make_loader(tmp_path / "numpy", 0, batch_size=3, shuffle=False)))
    assert batch["y"].dtype == torch.int16 and batch["y"].tolist() == [3, 4, -5]
    with ShardWriter(tmp_path / "nan") as writer:  # a missing regression label
        writer.write({"y": np.float64(0.5)})
        writer.write({"y": float("nan")})
    assert np.isnan(read_back(tmp_path / "nan")[1]["y"][1])
    with pytest.raises(SampleError, match=re.escape(
            "sample 1: field 'y' is a Python float here and a NumPy float32 scalar (a 0-d array) in earlier samples; give it "
            "one kind of value in every sample")):  # 0.1 is no float32
        with ShardWriter(tmp_path / "inexact") as writer:
            writer.write({"y": np.float32(0.5)})
            writer.write({"y": 0.1})


@pytest.mark.parametrize(("pack", "extra"), [
    ("auto", " ('auto' is a build's, which sees the samples' shapes before it writes)"),  # was a TypeError on '<'
    (2.5, ""),  # was taken, then a TypeError at the first write
    (0, ""),
    (True, ""),
])
def test_a_pack_that_is_not_a_whole_number_is_refused_before_anything_is_written(tmp_path: Path, pack: object,
                                                                                 extra: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"ShardWriter's pack is the samples a record holds, an integer "
                                                   f">= 1, got {pack!r}{extra}")):
        pipeline.ShardWriter(tmp_path / "out", pack=pack)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad", ["caf\udce9", 2**70, {"other": 1}])
def test_with_pack_a_sample_its_record_refuses_is_left_out_not_every_sample_after_it(tmp_path: Path, bad) -> None:
    """With pack > 1 a sample is checked when its record fills, at a later write. The bad sample
    stayed pending: that write and every one after it were refused about it, close failed, and
    no index was written: every sample since the last shard was lost. Now it is left out, the
    write that found it says so and is taken; one in the last record is left out at close, which
    writes the set and then says so."""
    def text(i: int):
        return bad if i in (13, 37) and not isinstance(bad, dict) else f"doc {i}"

    refused: dict[int, str] = {}
    with pytest.raises(SampleError, match=r"sample\(s\) 'k37' left out: .*; the set is written with the others$"):
        with ShardWriter(tmp_path / "out", pack=8) as writer:
            for i in range(40):
                sample = {"tokens": np.arange(4, dtype=np.uint16) + i, "text": text(i)}
                if isinstance(bad, dict) and i in (13, 37):
                    sample.update(bad)  # a field the others lack
                try:
                    writer.write(sample, key=f"k{i}")
                except SampleError as exc:
                    refused[i] = str(exc)
    assert list(refused) == [15]
    assert refused[15].startswith("sample(s) 'k13' left out: ")
    assert refused[15].endswith("(with pack=8, a sample is checked as its record fills, which may be at a later "
                                "write); the others are taken, this write's too")
    keys, fields = read_back(tmp_path / "out")
    assert sorted(keys) == sorted(f"k{i}" for i in range(40) if i not in (13, 37))
    assert sorted(fields["text"]) == sorted(f"doc {i}" for i in range(40) if i not in (13, 37))


@pytest.mark.parametrize("pack", [1, 2])
def test_with_pack_samples_refused_among_records_already_written_or_across_a_record_are_left_out(
        tmp_path: Path, pack: int) -> None:
    """A write_columns whose third record failed after two were written left them pending: every
    later write wrote them again (and close an index over the copies). Two samples of one record
    of other shapes, or the same fields in another order, refused every later write."""
    with ShardWriter(tmp_path / "columns", pack=pack, shard_samples=2) as writer:
        with pytest.raises(SampleError, match=rf"^sample\(s\) 'c' left out: record 'c', field 's': .*surrogates not "
                                              rf"allowed \(with pack={pack}, .*; the others are taken, this write's "
                                              rf"too$"):
            keys = ["a", "b", "c", "d"][:2 + pack]  # (the bad one last at pack=1: alone in what is pending)
            writer.write_columns({"s": [key if key != "c" else "c\ud800" for key in keys]}, keys=keys)
        writer.write({"s": "e"}, key="e")
    assert read_back(tmp_path / "columns")[0] == ["a", "b", "d", "e"][:1 + pack] + ["e"]
    refused = []
    with ShardWriter(tmp_path / "shapes", pack=4) as writer:
        for key, size, order in (("a", 3, "xy"), ("b", 4, "xy"), ("c", 3, "yx"), ("d", 3, "xy"), ("e", 3, "yx")):
            sample = {"x": np.zeros(size, np.float32), "y": 1}
            try:
                writer.write(dict(sorted(sample.items(), reverse=order == "yx")), key=key)
            except SampleError as exc:
                refused.append((key, str(exc)))
    assert [key for key, _ in refused] == ["d"] and refused[0][1].startswith(
        "sample(s) 'b' left out: field 'x': shape (4,) differs from (3,), the others' in a packed record of pack=4 "
        "(pack=1 lets shapes vary)")
    assert sorted(read_back(tmp_path / "shapes")[0]) == ["a", "c", "d", "e"]
    assert pipeline.load_index(tmp_path / "shapes").fields["x"].shape == (3,)  # not varying: 'b' is left out


@pytest.mark.parametrize("odd", [0, 4])  # the writer's first sample, or a record's
def test_with_pack_a_sample_of_another_shape_is_left_out_whichever_place_it_takes_in_its_record(
        tmp_path: Path, odd: int) -> None:
    """Compared with the first of its record, an odd sample there kept itself and left out the
    good ones after it, record after record (19 of 20 lost); tensors of another shape were not
    found at all, and refused every write after them. The index keeps the shape of the samples
    written."""
    with ShardWriter(tmp_path / "out", pack=4) as writer:
        for i in range(20):
            size = 4 if i == odd else 3
            try:
                writer.write({"x": torch.zeros(size) if i % 2 else np.zeros(size, np.float32)}, key=f"k{i}")
            except SampleError as exc:
                assert str(exc).startswith(f"sample(s) 'k{odd}' left out: field 'x': shape (4,) differs from (3,), "
                                           f"the others' in a packed record of pack=4")
    assert sorted(read_back(tmp_path / "out")[0]) == sorted(f"k{i}" for i in range(20) if i != odd)
    assert pipeline.load_index(tmp_path / "out").fields["x"].shape == (3,)


def test_columns_of_dtypes_one_array_holds_only_by_changing_values_are_refused_with_pack(tmp_path: Path) -> None:
    """uint64 IDs beside int64 ones were joined as float64 in a packed record: the IDs changed."""
    with ShardWriter(tmp_path / "out", pack=4) as writer:
        writer.write_columns({"id": np.array([2**63 + 1, 2**63 + 3], np.uint64)})
        with pytest.raises(SampleError, match=r"field 'id' has dtype int64, earlier samples uint64, which one array "
                                              r"holds only by changing values"):
            writer.write_columns({"id": np.array([5, 7], np.int64)})
    assert read_back(tmp_path / "out")[1]["id"] == [2**63 + 1, 2**63 + 3]
