"""The data of the two classic recipes, as they write it, converts exactly; and the build options
a new user reaches for first (a validation split, a cast, the default record size) do what they
say, with errors that name what is wrong."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import joblib
import numpy as np
import pytest
import torch

import pipeline
from pipeline import SampleError
from tests.helpers import read_back


def split_iter(array: np.ndarray, n: int):
    """The recipe's batching: consecutive batches of ``n``, the last partial one dropped."""
    for i in range(len(array) // n):
        yield array[i * n:(i + 1) * n]


def write_recipe(folder: Path, x: np.ndarray, y: np.ndarray, batch_size: int, keep_tail: bool = False) -> None:
    """``x_<B>.job`` / ``y_<B>.job`` exactly as the joblib batch recipe saves them (or, with
    ``keep_tail``, with the last short batch kept, as DataLoader-style batching does)."""
    folder.mkdir(exist_ok=True)
    batches = (lambda a: [a[i:i + batch_size] for i in range(0, len(a), batch_size)]) if keep_tail \
        else (lambda a: list(split_iter(a, batch_size)))
    joblib.numpy_pickle.dump(batches(x), folder / f"x_{batch_size}.job")
    joblib.numpy_pickle.dump(batches(y), folder / f"y_{batch_size}.job")


@pytest.fixture
def recipe_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(1003, 6)), rng.integers(0, 4, 1003)


@pytest.mark.parametrize("labels", ["int64", "float64"])
def test_the_joblib_recipes_files_convert_byte_exact_without_its_dropped_tail(
        tmp_path: Path, recipe_data, labels: str) -> None:
    x, y = recipe_data
    write_recipe(tmp_path / "out", x, y.astype(labels), batch_size=4)
    index = pipeline.build_joblib(tmp_path / "out", tmp_path / "shards", quiet=True)
    assert index.samples == 1000  # 250 batches of 4: the recipe dropped the last 3 samples
    assert index.fields["x"] == pipeline.FieldSpec("float64", (6,)) and index.fields["y"].dtype == labels
    _, fields = read_back(tmp_path / "shards")
    assert np.stack(fields["x"]).tobytes() == x[:1000].tobytes()
    assert np.array(fields["y"]).tobytes() == y[:1000].astype(labels).tobytes()


def test_two_runs_of_the_recipe_in_one_folder_are_refused_then_one_is_chosen(tmp_path: Path, recipe_data) -> None:
    x, y = recipe_data
    write_recipe(tmp_path / "out", x, y, batch_size=4)
    write_recipe(tmp_path / "out", x, y, batch_size=36)
    with pytest.raises(SampleError, match=r"several runs of the joblib batch recipe.*x_4\.job/y_4\.job \(1,000 samples "
                                          r"in batches of 4\), x_36\.job/y_36\.job \(972 samples in batches of 36\)"
                                          r".*every sample more than once: choose one with --batch-size 4"):
        pipeline.build_joblib(tmp_path / "out", tmp_path / "shards", quiet=True)
    assert not (tmp_path / "shards").exists()
    index = pipeline.build_joblib(tmp_path / "out", tmp_path / "shards", batch_size=36, quiet=True)
    assert index.samples == 972
    with pytest.raises(FileNotFoundError, match=r"no x_8\.job / y_8\.job \(there are x_4\.job, x_36\.job\)"):
        pipeline.build_joblib(tmp_path / "out", tmp_path / "other", batch_size=8, quiet=True)


def test_runs_that_kept_their_short_last_batch_are_recognised_too(tmp_path: Path, recipe_data) -> None:
    x, y = recipe_data
    write_recipe(tmp_path / "out", x, y, batch_size=4, keep_tail=True)
    write_recipe(tmp_path / "out", x, y, batch_size=36, keep_tail=True)
    with pytest.raises(SampleError, match=r"x_4\.job/y_4\.job \(1,003 samples in batches of 4\), x_36\.job/y_36\.job "
                                          r"\(1,003 samples in batches of 36\)"):
        pipeline.build_joblib(tmp_path / "out", tmp_path / "shards", quiet=True)
    assert pipeline.build_joblib(tmp_path / "out", tmp_path / "shards", batch_size=4, quiet=True).samples == 1003


def test_a_validation_split_is_disjoint_complete_in_order_and_reproducible(tmp_path: Path, recipe_data) -> None:
    x, y = recipe_data
    write_recipe(tmp_path / "out", x, y, batch_size=4)

    def split(folder: str, seed: int, validation=0.1) -> dict[str, list[float]]:
        pipeline.build_joblib(tmp_path / "out", tmp_path / folder, validation=validation, seed=seed, quiet=True)
        return {name: [float(v[0]) for v in read_back(tmp_path / folder / name)[1]["x"]]
                for name in ("train", "validation")}

    first, again, other = split("a", seed=0), split("b", seed=0), split("c", seed=1)
    assert first == again and first != other
    assert len(first["validation"]) == 100 and len(first["train"]) == 900
    rows = {float(v): i for i, v in enumerate(x[:1000, 0])}
    for name in ("train", "validation"):
        order = [rows[v] for v in first[name]]
        assert order == sorted(order)  # source order within a split
    assert sorted(rows[v] for v in first["train"] + first["validation"]) == list(range(1000))
    held_out = pipeline.validation_rows(1000, 0.1, seed=0)  # what maps a split's sample numbers to input rows
    assert [rows[v] for v in first["validation"]] == held_out.tolist()
    assert [rows[v] for v in first["train"]] == sorted(set(range(1000)) - set(held_out.tolist()))
    assert len(split("d", seed=0, validation=250)["validation"]) == 250
    for bad in (0.0, 1.0, 1000, 1.5):
        with pytest.raises(ValueError, match="validation"):
            pipeline.build_joblib(tmp_path / "out", tmp_path / "e", validation=bad, quiet=True)


def test_a_split_built_by_workers_is_the_split_built_in_one_process(tmp_path: Path) -> None:
    x = np.arange(30_000 * 4, dtype=np.float32).reshape(30_000, 4)
    options = dict(validation=0.2, seed=5, shard_samples=1000, pack=50, quiet=True)
    one = pipeline.write_shards(tmp_path / "one", {"x": x}, workers=1, **options)
    two = pipeline.write_shards(tmp_path / "two", {"x": x}, workers=2, **options)
    for name in ("train", "validation"):
        assert [s.sha256 for s in one[name].shards] == [s.sha256 for s in two[name].shards]
    rows = sorted(int(v[0]) // 4 for name in ("train", "validation")
                  for v in read_back(tmp_path / "two" / name)[1]["x"])
    assert rows == list(range(30_000))


class Squares(pipeline.Source):
    """A user's own source, as README's "Building shards" writes one."""

    fixed_shape = True

    def __len__(self) -> int:
        return 100

    def read(self, start: int, stop: int) -> pipeline.RowBlock:
        i = np.arange(start, stop)
        return pipeline.RowBlock({"i": i, "square": i * i})


def test_a_source_of_ones_own_is_split_by_build_shards_as_a_converter_splits_its_input(tmp_path: Path) -> None:
    """build_shards took no validation= (a TypeError), though README lists it among the options
    of every build: a source of one's own had no split."""
    splits = pipeline.build_shards(Squares(), tmp_path / "own", validation=0.1, seed=3, quiet=True)
    i = np.arange(100)
    pipeline.write_shards(tmp_path / "arrays", {"i": i, "square": i * i}, validation=0.1, seed=3, quiet=True)
    assert {name: index.samples for name, index in splits.items()} == {"train": 90, "validation": 10}
    for name in ("train", "validation"):
        assert read_back(tmp_path / "own" / name) == read_back(tmp_path / "arrays" / name)
    with pytest.raises(ValueError, match=re.escape("a split build names shards after each split (train-000000.tar)")):
        pipeline.build_shards(Squares(), tmp_path / "prefixed", "sq", validation=0.1, quiet=True)


def test_a_split_of_per_file_samples_reads_each_file_once(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    for n in range(40):
        (folder / f"{n:03d}.bin").write_bytes(bytes([n]) * (n + 1))
    indexes = pipeline.build_folder(folder, tmp_path / "shards", validation=7, seed=3, quiet=True)
    assert {name: index.samples for name, index in indexes.items()} == {"train": 33, "validation": 7}
    keys = [k for name in ("train", "validation") for k in read_back(tmp_path / "shards" / name)[0]]
    assert sorted(keys) == [f"{n:03d}" for n in range(40)]
    for name in ("train", "validation"):
        found, fields = read_back(tmp_path / "shards" / name)
        assert fields["bin"] == [bytes([int(k)]) * (int(k) + 1) for k in found]


def test_dtype_stores_a_cast_copy_and_refuses_casts_that_change_values(tmp_path: Path, recipe_data) -> None:
    x, y = recipe_data
    full = pipeline.write_shards(tmp_path / "f64", {"x": x, "y": y}, pack=100, quiet=True)  # (headers: a tenth)
    half = pipeline.write_shards(tmp_path / "f32", {"x": x, "y": y.astype(np.float64)},
                                 dtypes={"x": "float32", "y": "int16"}, pack=100, quiet=True)
    assert half.fields["x"].dtype == "float32" and half.fields["y"].dtype == "int16"
    assert half.bytes < 0.6 * full.bytes
    _, fields = read_back(tmp_path / "f32")
    assert np.stack(fields["x"]).tobytes() == x.astype(np.float32).tobytes()
    assert np.array(fields["y"]).tolist() == y.tolist()
    message = f"arrays, field 'x', row 0: value {x[0, 0].item()!r} is not a whole number; it cannot be stored as int64"
    with pytest.raises(SampleError, match=re.escape(f"{message} (store it as a float)")):
        pipeline.write_shards(tmp_path / "bad", {"x": x, "y": y}, dtypes={"x": "int64"}, quiet=True)
    with pytest.raises(SampleError, match=re.escape(f"arrays, field 'y', row 0: value {y[0] + 300} does not fit in "
                                                    f"int8 (-128 to 127)")):
        pipeline.write_shards(tmp_path / "bad", {"x": x, "y": y + 300}, dtypes={"y": "int8"}, quiet=True)
    with pytest.raises(ValueError, match=r"--dtype names fields \['z'\] that arrays does not have"):
        pipeline.write_shards(tmp_path / "bad", {"x": x, "y": y}, dtypes={"z": "float32"}, quiet=True)
    with pytest.raises(ValueError, match=r"--dtype x=complex64 \(dtypes=\{'x': 'complex64'\}\): unsupported "
                                         r"array dtype"):
        pipeline.write_shards(tmp_path / "bad", {"x": x, "y": y}, dtypes={"x": "complex64"}, quiet=True)
    with pytest.raises(ValueError, match=r"--dtype x=bfloat16 \(dtypes=\{'x': 'bfloat16'\}\): a cast makes NumPy "
                                         r"dtypes, which have no bfloat16; shards store the bfloat16 torch tensors"):
        pipeline.write_shards(tmp_path / "bad", {"x": x, "y": y}, dtypes={"x": "bfloat16"}, quiet=True)
    refused = [({"x": np.array([1e39])}, "float32", r"value 1e\+39 does not fit in float32"),
               ({"x": np.array([100_000])}, "float16", r"value 100000 does not fit in float16"),
               ({"x": np.array([2.0 ** 63])}, "int64", r"value 9\.22\d*e\+18 does not fit in int64"),
               ({"x": np.array([2 ** 63], np.uint64)}, "int64", r"value 9223372036854775808 does not fit in int64"),
               ({"x": np.array([-1])}, "uint8", r"value -1 does not fit in uint8"),
               ({"x": np.array([2])}, "bool", r"value 2 is not 0 or 1")]
    for arrays, dtype, message in refused:
        with pytest.raises(SampleError, match=message):
            pipeline.write_shards(tmp_path / "bad", arrays, dtypes={"x": dtype}, quiet=True)


def test_dtype_casts_samples_of_different_shapes_one_by_one(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    shapes = {"a": (3, 2), "b": (3, 3), "c": (2, 8), "d": (8, 2)}  # c and d: files of one size
    for name, shape in shapes.items():
        np.save(root / f"{name}.npy", np.full(shape, 0.5))
    labels = {name: n for n, name in enumerate(shapes)}
    indexes = pipeline.build_sample_files(root, labels, {"train": list(shapes)}, tmp_path / "out",
                                          dtypes={"x": "float16"}, quiet=True)
    assert indexes["train"].pack == 1 and indexes["train"].fields["x"].dtype == "float16"
    _, fields = read_back(tmp_path / "out" / "train")
    assert [x.shape for x in fields["x"]] == list(shapes.values()) and all(x.dtype == np.float16 for x in fields["x"])


def test_the_default_pack_keeps_small_samples_close_to_their_size_and_large_ones_whole(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n = 600_000  # 43 MB: records of 64 KiB still make 512 of them
    small = {"x": np.zeros((n, 16), np.float32), "y": rng.integers(0, 9, n)}
    index = pipeline.write_shards(tmp_path / "small", small, quiet=True)
    data = small["x"].nbytes + small["y"].nbytes
    assert index.pack == (64 << 10) // (16 * 4 + 8)
    assert index.bytes < 1.05 * data  # one record per sample would be 1024 bytes a sample: 14x the data
    few = {"x": small["x"][:20_000], "y": small["y"][:20_000]}  # 1.4 MB: 512 records (of 39), not 22 of 910
    unpacked = pipeline.write_shards(tmp_path / "one", few, pack=1, quiet=True)
    assert unpacked.bytes > 13 * (few["x"].nbytes + few["y"].nbytes)
    assert pipeline.write_shards(tmp_path / "few", few, quiet=True).records == 20_000 // 39 + 1
    large = pipeline.write_shards(tmp_path / "large", {"x": rng.random((20, 40_000), dtype=np.float32)}, quiet=True)
    assert large.pack == 1
    folder = tmp_path / "files"
    folder.mkdir()
    for n in range(5):
        (folder / f"{n}.txt").write_bytes(b"x" * (n + 1))
    assert pipeline.build_folder(folder, tmp_path / "folder", quiet=True).pack == 1  # files: one per record
    for bad in (0, "big", True):
        with pytest.raises(ValueError, match="pack must be 'auto' or an integer >= 1"):
            pipeline.write_shards(tmp_path / "bad", small, pack=bad, quiet=True)


def test_pack_takes_numpy_integers_and_the_command_line_auto_and_none_in_any_case(tmp_path: Path) -> None:
    """pack=np.int64(4) was refused, as no other count is. Python takes "auto" as spelt (another
    spelling is refused, saying so); the command line, typed, takes --pack and --shard-bytes' words
    in any case, and says how to ask for no size limit where a size is too small."""
    data = {"x": np.arange(40, dtype=np.float32)}
    assert pipeline.write_shards(tmp_path / "numpy", data, pack=np.int64(4), quiet=True).pack == 4
    assert json.loads((tmp_path / "numpy" / "index.json").read_text())["pack"] == 4
    with pipeline.ShardWriter(tmp_path / "writer", pack=np.int32(8)) as writer:
        writer.write_columns(data)
    assert pipeline.load_index(tmp_path / "writer").pack == 8
    with pytest.raises(ValueError, match=re.escape("pack must be 'auto' or an integer >= 1, got 'Auto'")):
        pipeline.write_shards(tmp_path / "auto", data, pack="Auto", quiet=True)
    np.save(tmp_path / "x.npy", data["x"])
    command = [sys.executable, "-m", "pipeline", "build", "arrays", str(tmp_path / "cli"), "--array",
               f"x={tmp_path / 'x.npy'}", "--quiet", "--overwrite"]
    run = subprocess.run([*command, "--shard-bytes", "0"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.endswith("argument --shard-bytes: '0' is smaller than a shard can be "
                                                       "(4096 bytes); --shard-bytes none for no size limit\n")
    run = subprocess.run([*command, "--pack", "Auto", "--shard-bytes", "None"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert pipeline.load_index(tmp_path / "cli").pack != "auto"  # (auto's choice is stored: a number)


def test_limits_that_make_no_sense_are_refused(tmp_path: Path, recipe_data) -> None:
    x, y = recipe_data
    for options, message in (({"shard_bytes": 0}, r"shard_bytes must be a whole number >= 4096 \(a tar header "
                                                  r"and a record\), got 0; pass shard_bytes=None for no size limit"),
                             ({"shard_bytes": "1MB"}, r"shard_bytes must be a whole number >= 4096 .*, got '1MB'"),
                             ({"workers": 0}, r"workers must be a whole number >= 1 \(1 writes in this process\), "
                                              r"got 0"),
                             ({"workers": "2"}, r"workers must be a whole number >= 1 .*, got '2'"),
                             ({"shard_samples": 0}, r"shard_samples must be a whole number >= 1, got 0"),
                             ({"shard_samples": 2.5}, r"shard_samples must be a whole number >= 1, got 2.5")):
        with pytest.raises(ValueError, match=message):  # (not Python's words from the comparison or slice it reached)
            pipeline.write_shards(tmp_path / "out", {"x": x}, quiet=True, **options)
        if "workers" not in options:
            with pytest.raises(ValueError, match=message):
                pipeline.ShardWriter(tmp_path / "writer", **options)
    with pytest.raises(ValueError, match=r"part 4/4: parts count from 0, so the parts of 4 are 0/4 to 3/4"):
        pipeline.Part.parse("4/4")
    with pytest.raises(ValueError, match=r"part 1/0: N is the number of parts, at least 1 \(e\.g\. 0/4 to 3/4"):
        pipeline.Part.parse("1/0")
    np.save(tmp_path / "x.npy", x)
    cli = subprocess.run([sys.executable, "-m", "pipeline", "build", "arrays", str(tmp_path / "o"), "--array",
                          f"x={tmp_path / 'x.npy'}", "--pack", "AUTOMATIC"], capture_output=True, text=True)
    assert cli.returncode == 2 and cli.stderr.strip().endswith(
        "argument --pack: not a whole number: 'AUTOMATIC': give samples per record (1 or more), or auto")


def make_pt_files(root: Path, ids: list[str]) -> None:
    root.mkdir(exist_ok=True)
    for n, sample_id in enumerate(ids):
        torch.save(torch.full((3, 2, 2), float(n)), root / f"{sample_id}.pt")


def test_an_id_in_two_splits_or_without_a_label_is_listed_with_its_file(tmp_path: Path) -> None:
    ids = [f"id{n}" for n in range(10)]
    make_pt_files(tmp_path / "donnees", ids)
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({i: n % 3 for n, i in enumerate(ids)}))
    partition = tmp_path / "partition.json"
    partition.write_text(json.dumps({"entrainement": ids[:8], "validation": ids[5:]}))
    with pytest.raises(SampleError, match=rf"{partition}: 3 IDs are in more than one split: 'id5' \(entrainement, "
                                          rf"validation\), 'id6' .*'id7' .*; an ID may belong to one split only"):
        pipeline.build_sample_files(tmp_path / "donnees", labels, partition, tmp_path / "out", quiet=True)
    labels.write_text(json.dumps({i: 0 for i in ids[:2]}))
    partition.write_text(json.dumps({"entrainement": ids[:8], "validation": ids[8:]}))
    with pytest.raises(SampleError, match=rf"{labels} has no label for 8 IDs of {partition}: 'id2' \(split "
                                          rf"'entrainement'\), .*'id6' \(split 'entrainement'\) and 3 more"):
        pipeline.build_sample_files(tmp_path / "donnees", labels, partition, tmp_path / "out", quiet=True)
    partition.write_text(json.dumps({"entrainement": ids, "validation": []}))  # (an empty set was written)
    with pytest.raises(SampleError, match=re.escape(f"{partition}: split 'validation' lists no IDs: give it some, "
                                                    f"or leave it out")):
        pipeline.build_sample_files(tmp_path / "donnees", labels, partition, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()
    partition.write_text(json.dumps({"entrainement": ids[:8], "validation": ids[8:]}))
    labels.write_text(json.dumps({i: n % 3 for n, i in enumerate(ids)}))
    indexes = pipeline.build_sample_files(tmp_path / "donnees", labels, partition, tmp_path / "out", quiet=True)
    assert sorted(indexes) == ["entrainement", "validation"]  # each split under its own name
    assert (tmp_path / "out" / "entrainement" / "entrainement-000000.tar").is_file()


def test_a_split_name_that_cannot_name_a_folder_is_named_as_the_partitions_split(tmp_path: Path) -> None:
    make_pt_files(tmp_path / "donnees", ["a", "b"])
    partition = tmp_path / "partition.json"
    partition.write_text(json.dumps({"train/2024": ["a"], "validation": ["b"]}))
    with pytest.raises(SampleError, match=re.escape(
            f"{partition}: split name 'train/2024' is not allowed: it may not contain '.', '/', '\\\\' or control "
            f"characters, nor start with '__'; it names the split's folder and shards "
            f"(OUT/<split>/<split>-000000.tar): rename the split")):
        pipeline.build_sample_files(tmp_path / "donnees", {"a": 0, "b": 1}, partition, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()


def test_a_resume_whose_labels_were_renumbered_writes_the_finished_split_again(tmp_path: Path, capsys) -> None:
    """The training split finished, a validation file stopped the build; mended, and a label
    renamed to a class that sorts first: the finished split's labels are of the old list, so
    the resume writes it again (a finished set alone, with no split stopped, is refused)."""
    ids = [f"s{n}" for n in range(8)]
    make_pt_files(tmp_path / "data", ids)
    (tmp_path / "data" / "s7.pt").write_bytes(b"not a torch file")
    labels = {i: ["cat", "dog", "bird"][n % 3] for n, i in enumerate(ids)}
    partition = {"train": ids[:5], "validation": ids[5:]}
    with pytest.raises(SampleError, match=re.escape(str(tmp_path / "data" / "s7.pt"))):
        pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", quiet=True)
    assert pipeline.load_index(tmp_path / "out" / "train").metadata == {"classes": ["bird", "cat", "dog"]}
    make_pt_files(tmp_path / "data", ids)
    labels["s7"] = "ant"
    indexes = pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", resume=True)
    assert (f"{tmp_path / 'out' / 'train' / 'index.json'}: a split the stopped build finished, of other rows than "
            f"this one plans") in capsys.readouterr().err
    assert indexes["train"].metadata == indexes["validation"].metadata == {"classes": ["ant", "bird", "cat", "dog"]}
    pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "fresh", quiet=True)
    for split in ("train", "validation"):
        assert (tmp_path / "out" / split / f"{split}-000000.tar").read_bytes() == \
            (tmp_path / "fresh" / split / f"{split}-000000.tar").read_bytes()
    labels["s0"] = "ape"
    with pytest.raises(pipeline.OutputExistsError, match=re.escape(
            f"{tmp_path / 'out' / 'train' / 'index.json'} is the index of a finished build whose source has changed "
            f"since: it holds {{'classes': ['ant', 'bird', 'cat', 'dog']}}, this build {{'classes': ['ant', 'ape', "
            f"'bird', 'cat', 'dog']}} (labels numbered by another list?); pass overwrite=True (--overwrite) to build "
            f"it again")):
        pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", resume=True, quiet=True)


def test_labels_that_are_gaps_twice_given_or_pickled_are_refused_and_ints_beside_floats_are_floats(
        tmp_path: Path) -> None:
    ids = [f"s{n}" for n in range(6)]
    make_pt_files(tmp_path / "data", ids)
    partition = {"train": ids[:4], "validation": ids[4:]}
    labels = {i: float(n % 3) for n, i in enumerate(ids)}
    labels["s2"] = float("nan")  # a pandas column's missing value
    with pytest.raises(SampleError, match=re.escape("the labels mapping: 1 labels are not finite numbers (a gap, NaN, "
                                                    "in a table's column?): 's2' (nan); give each ID its label")):
        pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", quiet=True)
    with pytest.raises(SampleError, match=re.escape("the labels mapping: keys [1, '1'] name the same ID")):
        pipeline.build_sample_files(tmp_path / "data", {1: 0, "1": 1, **labels}, partition, tmp_path / "out",
                                    quiet=True)
    torch.save({i: 0 for i in ids}, tmp_path / "labels.pt")
    with pytest.raises(SampleError, match=re.escape(f"labels file {tmp_path / 'labels.pt'} is not JSON but binary "
                                                    f"(pickle.dump or torch.save?): save the dict with json.dump")):
        pipeline.build_sample_files(tmp_path / "data", tmp_path / "labels.pt", partition, tmp_path / "out", quiet=True)
    with pytest.raises(IsADirectoryError, match=re.escape(f"labels file {tmp_path / 'data'} is a folder: give the "
                                                          f"JSON file of the labels")):  # (a bare [Errno 21])
        pipeline.build_sample_files(tmp_path / "data", tmp_path / "data", partition, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()
    (tmp_path / "labels.json").write_text(json.dumps({i: [1, 2.5, 2][n % 3] for n, i in enumerate(ids)}))
    pipeline.build_sample_files(tmp_path / "data", tmp_path / "labels.json", partition, tmp_path / "out", quiet=True)
    train = [batch["y"] for batch in pipeline.make_loader(tmp_path / "out" / "train", batch_size=4, shuffle=False)]
    assert [t.dtype for t in train] == [torch.float64] and train[0].tolist() == [1.0, 2.5, 2.0, 1.0]
    (tmp_path / "labels.json").write_text(json.dumps({"unlisted": 0.5, **{i: n % 3 for n, i in enumerate(ids)}}))
    pipeline.build_sample_files(tmp_path / "data", tmp_path / "labels.json", partition, tmp_path / "out",
                                overwrite=True, quiet=True)  # an ID of no split decides nothing
    train = [batch["y"] for batch in pipeline.make_loader(tmp_path / "out" / "train", batch_size=4, shuffle=False)]
    assert [t.dtype for t in train] == [torch.int64] and train[0].tolist() == [0, 1, 2, 0]


def test_labels_a_float_or_one_array_would_change_are_refused_naming_them(tmp_path: Path) -> None:
    """2**53 + 1 beside 0.5 was stored as 2**53, multi-hot [true, false] beside [2, 3] as [1, 0],
    and a .pt file holding [2**53 + 1, 0.5] as two floats, without a word."""
    ids = ["a", "b", "c"]
    make_pt_files(tmp_path / "data", ids)
    partition = {"train": ids}
    for labels, error in [
            ({"a": 2**53 + 1, "b": 0.5, "c": 1}, "the labels mapping: the label of 'a', 9007199254740993, would be "
             "stored as the float 9007199254740992.0 beside the labels that are fractions: give such labels as text"),
            ({"a": [True, False], "b": [2, 3], "c": [True, True]}, "the labels mapping: labels that are lists hold "
             "arrays of bool, int64 whose values one array would change")]:
        with pytest.raises(SampleError, match=re.escape(error)):
            pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", quiet=True)
    torch.save([2**53 + 1, 0.5], tmp_path / "data" / "a.pt")
    with pytest.raises(SampleError, match=re.escape(
            f"{tmp_path / 'data' / 'a.pt'}: the integer 9007199254740993 beside other numbers would be stored as the "
            f"float 9007199254740992.0; save such numbers as an array of int64 or uint64, or as text")):
        pipeline.build_sample_files(tmp_path / "data", {i: 0 for i in ids}, partition, tmp_path / "out", quiet=True)


def test_an_id_with_both_a_pt_and_an_npy_file_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """As after following the advice for a .pt of NumPy data without removing the .pt."""
    make_pt_files(tmp_path / "data", ["a", "b", "c"])
    np.save(tmp_path / "data" / "b.npy", np.full((3, 2, 2), 7, np.float32))
    with pytest.raises(SampleError, match=re.escape(
            f"split 'train' of the partition: 1 IDs have both a .pt and a .npy file, e.g. {tmp_path / 'data' / 'b.pt'} "
            f"(beside b.npy): keep one file per ID")):
        pipeline.build_sample_files(tmp_path / "data", {i: 0 for i in "abc"}, {"train": list("abc")},
                                    tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()
    (tmp_path / "data" / "b.pt").unlink()
    pipeline.build_sample_files(tmp_path / "data", {i: 0 for i in "abc"}, {"train": list("abc")}, tmp_path / "out",
                                quiet=True)
    assert read_back(tmp_path / "out" / "train")[1]["x"][1].tolist() == np.full((3, 2, 2), 7.0).tolist()



def test_a_split_build_of_a_source_of_ones_own_refuses_bad_options_before_writing_anything(tmp_path: Path) -> None:
    """build_shards(validation=) checked its options only as each split began: a part given as a
    tuple failed with Python's words, and a refused option left an empty folder behind."""
    from pipeline.write.sources.arrays import ArraySource

    source = ArraySource({"x": np.arange(100)})
    with pytest.raises(TypeError, match=re.escape("part takes pipeline.Part(I, N), part I of N counting from 0")):
        pipeline.build_shards(source, tmp_path / "out", validation=0.1, part=(0, 2))
    with pytest.raises(ValueError, match=re.escape("workers must be a whole number >= 1")):
        pipeline.build_shards(source, tmp_path / "out", validation=0.1, workers=0)
    assert not (tmp_path / "out").exists()
