"""Converters from the layouts users have: every sample arrives, exactly, or a clear error."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import joblib
import numpy as np
import pytest
import torch

import pipeline
from pipeline import SampleError
from tests.helpers import read_back


def shard_hashes(folder: Path) -> list[str]:
    return [s.sha256 for s in pipeline.load_index(folder).shards]


def test_npy_npz_memmap_tensor_and_in_memory_arrays_build_identical_shards(tmp_path: Path, tabular) -> None:
    np.save(tmp_path / "x.npy", tabular["x"])
    np.save(tmp_path / "y.npy", tabular["y"])
    np.savez(tmp_path / "stored.npz", **tabular)
    np.savez_compressed(tmp_path / "packed.npz", **tabular)
    options = dict(pack=50, shard_bytes=20 << 10, quiet=True)
    pipeline.write_shards(tmp_path / "mem", tabular, **options)
    pipeline.write_shards(tmp_path / "npy", {"x": tmp_path / "x.npy", "y": str(tmp_path / "y.npy")}, **options)
    pipeline.write_shards(tmp_path / "mmap", {"x": np.load(tmp_path / "x.npy", mmap_mode="r"),
                                              "y": torch.from_numpy(tabular["y"])}, **options)
    pipeline.build_npz(tmp_path / "stored.npz", tmp_path / "stored", **options)
    pipeline.build_npz(tmp_path / "packed.npz", tmp_path / "packed", **options)
    expected = shard_hashes(tmp_path / "mem")
    assert len(expected) > 5
    for other in ("npy", "mmap", "stored", "packed"):
        assert shard_hashes(tmp_path / other) == expected, other
    _, fields = read_back(tmp_path / "npy")
    np.testing.assert_array_equal(np.stack(fields["x"]), tabular["x"])


def test_edits_to_a_copy_on_write_memmap_are_kept(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((4, 3), np.float32))
    edited = np.load(tmp_path / "x.npy", mmap_mode="c")
    edited[:] = 7
    shared = np.load(tmp_path / "x.npy", mmap_mode="r+")
    pipeline.write_shards(tmp_path / "c", {"x": edited}, quiet=True)
    shared[:] = 5  # a shared mapping's edits are in the file the build reads
    pipeline.write_shards(tmp_path / "r", {"x": shared}, quiet=True)
    assert read_back(tmp_path / "c")[1]["x"][0].tolist() == [7, 7, 7]
    assert read_back(tmp_path / "r")[1]["x"][0].tolist() == [5, 5, 5]


def test_file_backed_arrays_are_read_without_mapping_them(tmp_path: Path) -> None:
    rows = np.arange(50_000, dtype=np.float64).reshape(-1, 5)
    np.save(tmp_path / "a.npy", rows)
    column = pipeline.open_npy(tmp_path / "a.npy")
    assert len(column) == 10_000 and column.shape == (10_000, 5)
    np.testing.assert_array_equal(column.read(123, 456), rows[123:456])
    np.testing.assert_array_equal(column.rows(100, 200).read(5, 10), rows[105:110])


def test_feature_and_label_arrays_of_different_lengths_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((10, 2)))
    with pytest.raises(SampleError, match=r"different lengths: x has 10 rows \(.*x\.npy\), y has 9 rows"):
        pipeline.write_shards(tmp_path / "out", {"x": tmp_path / "x.npy", "y": np.zeros(9)}, quiet=True)
    assert not (tmp_path / "out").exists()


def test_arguments_in_the_wrong_order_are_refused_saying_the_order(tmp_path: Path) -> None:
    arrays = {"x": np.zeros((10, 2))}
    for args in ((arrays, tmp_path / "out"), (tmp_path / "out", np.zeros(3))):
        with pytest.raises(TypeError, match=re.escape(
                "write_shards takes the output folder, then a mapping of field names to arrays: "
                "write_shards('shards', {'x': features, 'y': labels}), got (")):
            pipeline.write_shards(*args, quiet=True)
    assert not (tmp_path / "out").exists()
    pd = pytest.importorskip("pandas")  # a DataFrame is columns by name too
    pipeline.write_shards(tmp_path / "frame", pd.DataFrame({"x": np.arange(10.0)}), quiet=True)
    assert [float(v) for v in read_back(tmp_path / "frame")[1]["x"]] == list(np.arange(10.0))
    with pytest.raises(SampleError, match=re.escape(
            "field 'tokens': its rows differ in shape; write_shards takes one array a field, each row a sample of "
            "one shape; write samples of several shapes (sequences of different lengths) with pipeline.ShardWriter")):
        pipeline.write_shards(tmp_path / "out", {"tokens": [np.arange(3), np.arange(5)]}, quiet=True)


def test_unsupported_dtype_and_missing_path_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SampleError, match=r"field 'z' \(in memory\): unsupported array dtype complex64"):
        pipeline.write_shards(tmp_path / "o", {"z": np.zeros(3, np.complex64)}, quiet=True)
    with pytest.raises(FileNotFoundError, match=r"nothere\.npy: no such \.npy file"):
        pipeline.write_shards(tmp_path / "o", {"x": tmp_path / "nothere.npy"}, quiet=True)


def test_an_array_named_as_a_reserved_field_is_refused_naming_its_file(tmp_path: Path) -> None:
    np.savez(tmp_path / "data.npz", __index=np.arange(3), x=np.arange(3))
    with pytest.raises(SampleError, match=re.escape(
            f"field '__index' ({tmp_path / 'data.npz'}): names starting with '__' are reserved, and a name cannot "
            f"be empty: give the array another name")):
        pipeline.build_npz(tmp_path / "data.npz", tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_a_whole_npz_is_refused_naming_it(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.arange(100_000))
    np.savez(tmp_path / "whole.npz", x=np.arange(100_000))
    (tmp_path / "cut.npz").write_bytes((tmp_path / "whole.npz").read_bytes()[:400_000])
    for name in ("x.npy", "cut.npz"):
        with pytest.raises(ValueError, match=rf"{name}: not a whole \.npz archive \(File is not a zip file; a "
                                             rf"truncated one has lost its table of contents\): pass a file written"):
            pipeline.build_npz(tmp_path / name, tmp_path / "o", quiet=True)
    assert not (tmp_path / "o").exists()


def make_joblib_batches(folder: Path, sizes: list[int], per_sample: bool = False) -> tuple[np.ndarray, np.ndarray]:
    folder.mkdir()
    xs, ys = [], []
    start = 0
    for b, size in enumerate(sizes):
        x = np.arange(start * 3, (start + size) * 3, dtype=np.float32).reshape(size, 3)
        y = np.arange(start, start + size)
        if per_sample:
            joblib.dump(list(x), folder / f"x_{b}.job")
            joblib.dump(list(y), folder / f"y_{b}.job")
        else:  # a list of per-batch arrays, as the recipe saves them
            joblib.dump([x[: size // 2], x[size // 2:]], folder / f"x_{b}.job")
            joblib.dump([y[: size // 2], y[size // 2:]], folder / f"y_{b}.job")
        xs.append(x)
        ys.append(y)
        start += size
    return np.concatenate(xs), np.concatenate(ys)


@pytest.mark.parametrize("per_sample", [False, True])
def test_joblib_batches_convert_in_numeric_batch_order(tmp_path: Path, per_sample: bool) -> None:
    sizes = [30, 7, 50, 13, 25, 11, 40, 9, 20, 16, 33]  # 11 batches: x_10 sorts after x_9
    x, y = make_joblib_batches(tmp_path / "jb", sizes, per_sample)
    options = {} if per_sample else {"lists": "batches"}  # (not batches of the number in their names)
    index = pipeline.build_joblib(tmp_path / "jb", tmp_path / "out", shard_samples=45, pack=8, quiet=True, **options)
    assert index.samples == sum(sizes)
    _, fields = read_back(tmp_path / "out")
    np.testing.assert_array_equal(np.stack(fields["x"]), x)
    np.testing.assert_array_equal(np.array(fields["y"]), y)


def test_a_chosen_batch_size_converts_its_pair_beside_a_file_of_another_without_its_partner(tmp_path: Path) -> None:
    """--batch-size B converts only x_B.job / y_B.job, but an x_64.job without its y file
    stopped it, with no word of what to do."""
    features = np.arange(300, dtype=np.float32).reshape(100, 3)
    labels = np.arange(100) % 4
    for b in (32, 64):
        joblib.dump([features[i:i + b] for i in range(0, 100, b)], tmp_path / f"x_{b}.job")
    joblib.dump([labels[i:i + 32] for i in range(0, 100, 32)], tmp_path / "y_32.job")
    with pytest.raises(FileNotFoundError, match=re.escape(f"x_64.job has no matching y_64.job: put that file beside "
                                                          f"it, or move x_64.job out of {tmp_path} (or convert one "
                                                          f"pair: --batch-size B)")):
        pipeline.build_joblib(tmp_path, tmp_path / "out", quiet=True)
    pipeline.build_joblib(tmp_path, tmp_path / "out", batch_size=32, quiet=True)
    _, fields = read_back(tmp_path / "out")
    np.testing.assert_array_equal(np.stack(fields["x"]), features)
    np.testing.assert_array_equal(np.array(fields["y"]), labels)


def test_joblib_files_without_partner_or_mismatched_rows_are_named(tmp_path: Path) -> None:
    make_joblib_batches(tmp_path / "jb", [5, 5])
    (tmp_path / "jb" / "y_1.job").unlink()
    with pytest.raises(FileNotFoundError, match=r"x_1\.job has no matching y_1\.job"):
        pipeline.build_joblib(tmp_path / "jb", tmp_path / "out", quiet=True)
    joblib.dump(np.arange(4), tmp_path / "jb" / "y_1.job")
    with pytest.raises(SampleError, match=r"x_1\.job: 5 feature rows but 4 labels in its y file"):
        pipeline.build_joblib(tmp_path / "jb", tmp_path / "out", quiet=True, lists="batches")
    (tmp_path / "one").mkdir()
    joblib.dump([np.ones((2, 3)), np.ones((3, 3))], tmp_path / "one" / "x_1.job")
    joblib.dump(np.arange(4), tmp_path / "one" / "y_1.job")
    with pytest.raises(SampleError, match=r"x_1\.job: 2 arrays that add up to neither the 4 labels"):
        pipeline.build_joblib(tmp_path / "one", tmp_path / "out", quiet=True)
    assert not (tmp_path / "out" / "index.json").exists()


def test_two_joblib_files_of_one_batch_number_are_refused_not_one_dropped(tmp_path: Path) -> None:
    folder = tmp_path / "jb"
    folder.mkdir()
    for name, n in (("0", 0), ("00", 2)):  # a run that padded its numbers beside one that did not
        joblib.dump(np.full((2, 3), float(n)), folder / f"x_{name}.job")
        joblib.dump([n, n + 1], folder / f"y_{name}.job")
    with pytest.raises(SampleError, match=re.escape(
            f"{folder / 'x_0.job'} and {folder / 'x_00.job'} both number batch 0: move one of them (and its y "
            f"partner) out of the folder")):
        pipeline.build_joblib(folder, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()

def make_sample_files(root: Path, ids: list[str], suffix: str = ".pt", first: int = 0) -> None:
    """Sample file ``n`` holds a 2x3 array of the number ``first + n``."""
    root.mkdir(exist_ok=True)
    for n, sample_id in enumerate(ids, start=first):
        value = torch.full((2, 3), float(n))
        if suffix == ".pt":
            torch.save(value, root / f"{sample_id}.pt")
        else:
            np.save(root / f"{sample_id}.npy", value.numpy())


def test_one_file_per_sample_with_labels_and_partition_gives_one_shard_set_per_split(tmp_path: Path) -> None:
    ids = [f"id-{n}" for n in range(30)]
    make_sample_files(tmp_path / "data", ids[:20])
    make_sample_files(tmp_path / "data", ids[20:], ".npy", first=20)
    labels = {sample_id: n % 4 for n, sample_id in enumerate(ids)}
    partition = {"train": ids[5:], "validation": ids[:5]}
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    indexes = pipeline.build_sample_files(tmp_path / "data", tmp_path / "labels.json", partition,
                                          tmp_path / "out", shard_samples=8, quiet=True)
    assert {split: i.samples for split, i in indexes.items()} == {"train": 25, "validation": 5}
    for split, split_ids in partition.items():
        keys, fields = read_back(tmp_path / "out" / split)
        assert keys == split_ids
        assert fields["y"] == [labels[i] for i in split_ids]
        assert [float(x[0, 0]) for x in fields["x"]] == [float(ids.index(i)) for i in split_ids]
    assert (tmp_path / "out" / "train" / "train-000000.tar").exists()


def test_class_names_of_ids_outside_the_partition_are_not_needed(tmp_path: Path) -> None:
    """Labels of the whole dataset, a partition of part of it: the build stopped on a bare
    KeyError of a class that only unlisted IDs have."""
    make_sample_files(tmp_path / "data", ["s0", "s1", "s2"])
    labels = {"s0": "cat", "s1": "dog", "s2": "ant"}
    indexes = pipeline.build_sample_files(tmp_path / "data", labels, {"train": ["s1", "s0"]}, tmp_path / "out",
                                          quiet=True)
    assert indexes["train"].metadata == {"classes": ["cat", "dog"]}
    assert read_back(tmp_path / "out" / "train")[1]["y"] == [1, 0]


def test_a_file_or_id_that_makes_no_sample_key_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    long = "x" * 93
    (folder / f"{long}.jpg").write_bytes(b"x")
    with pytest.raises(SampleError, match=re.escape(f"{folder / long}.jpg: sample key '{long}' is longer than 92 bytes; "
                                                    f"rename it")):
        pipeline.build_folder(folder, tmp_path / "out", quiet=True)
    make_sample_files(tmp_path / "data", [long])  # an ID, by contrast, is the user's: it makes a key shortened
    pipeline.build_sample_files(tmp_path / "data", {long: 0}, {"train": [long]}, tmp_path / "out", quiet=True)
    [(key, _)] = pipeline.iter_samples(tmp_path / "out" / "train")
    assert key.startswith("x" * 79 + "_") and len(key) == 92


def test_partition_ids_without_file_or_label_are_errors_before_anything_is_written(tmp_path: Path) -> None:
    make_sample_files(tmp_path / "data", ["a", "b"])
    with pytest.raises(FileNotFoundError, match=r"split 'validation' of the partition: 1 IDs have no file .*\['c'\]"):
        pipeline.build_sample_files(tmp_path / "data", {"a": 0, "b": 1, "c": 2},
                                    {"train": ["a"], "validation": ["b", "c"]}, tmp_path / "out", quiet=True)
    with pytest.raises(SampleError, match=r"the labels mapping has no label for 1 IDs of the partition: 'b' \(split 'train'\)"):
        pipeline.build_sample_files(tmp_path / "data", {"a": 0}, {"train": ["a", "b"]}, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()


def test_pt_files_holding_pickled_code_are_refused(tmp_path: Path) -> None:
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("executed",))

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.pt").write_bytes(pickle.dumps(Evil(), protocol=2))
    with pytest.raises(SampleError, match=r"a\.pt: holds a pickled object \((__builtin__\.)?print\) that "
                                          r"torch\.load\(weights_only=True\) refuses to load, as it refuses any code"):
        pipeline.build_sample_files(tmp_path / "data", {"a": 0}, {"train": ["a"]}, tmp_path / "out", quiet=True)


@pytest.mark.parametrize("words", [
    "Unsupported global: GLOBAL numpy.core.multiarray._reconstruct was not an allowed global by default.",
    "Unsupported class numpy.core.multiarray._reconstruct",  # (torch before 2.4)
])
def test_torchs_refusal_of_numpy_data_is_read_in_the_words_of_every_supported_torch(words: str) -> None:
    """CI runs one torch: the words of torch 2.3 (the floor) are checked here from its message."""
    from pipeline.write.sources.sample_files import _torch_load_failure

    error = _torch_load_failure(Path("a.pt"), RuntimeError(
        "Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` will likely succeed, "
        f"but it can result in arbitrary code execution. WeightsUnpickler error: {words}"))
    assert str(error).startswith("a.pt: holds NumPy data, which torch.load(weights_only=True) refuses to unpickle: "
                                 "save the array with np.save")


def test_folder_of_files_grouped_by_stem_keeps_bytes_exactly(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(0)
    expected = {}
    for n in range(12):
        image, meta = rng.bytes(100 + n), json.dumps({"n": n}).encode()
        (folder / f"{n:04d}.jpg").write_bytes(image)
        (folder / f"{n:04d}.json").write_bytes(meta)
        expected[f"{n:04d}"] = (image, meta)
    pipeline.build_folder(folder, tmp_path / "out", shard_samples=5, quiet=True)
    keys, fields = read_back(tmp_path / "out")
    assert keys == sorted(expected)
    assert list(zip(fields["jpg"], fields["json"])) == [expected[k] for k in keys]


def test_folder_samples_with_different_extensions_are_named(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.jpg", "a.json", "b.jpg"):
        (folder / name).write_bytes(b"x")
    with pytest.raises(SampleError, match=r"sample 'b' has files \['jpg'\], sample 'a' has \['jpg', 'json'\]"):
        pipeline.build_folder(folder, tmp_path / "out", quiet=True)


def test_a_stray_file_in_a_folder_is_named_as_the_odd_one_out(tmp_path: Path) -> None:
    """The extensions most samples have are the reference: before, a README among samples 'a'..'c'
    was the reference, and every sample was said to lack '.md'."""
    folder = tmp_path / "in"
    folder.mkdir()
    for key in ("a", "b", "c", "README"):
        for ext in (("md",) if key == "README" else ("json", "txt")):
            (folder / f"{key}.{ext}").write_text(key)
    with pytest.raises(SampleError, match=re.escape(
            f"{folder}: sample 'README' has files ['md'], samples 'a', ... (3) have ['json', 'txt']; every sample "
            f"needs the same extensions: move files that are no samples (a README, say) out of the folder, or give "
            f"every sample the same files")):
        pipeline.build_folder(folder, tmp_path / "out", quiet=True)


def test_a_file_without_an_extension_is_named_with_what_to_do(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.txt", "b.txt", "LICENSE"):
        (folder / name).write_text(name)
    with pytest.raises(SampleError, match=re.escape(
            f"{folder / 'LICENSE'}: a file name needs a stem and an extension (key.ext): a sample is the files of one "
            f"stem, a field each extension; move files that are no samples (a README, a LICENSE) out of the folder, "
            f"or rename this one")):
        pipeline.build_folder(folder, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()


def test_folder_stems_with_dots_are_told_the_key_ends_at_the_first_dot(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("2021.03.01.jpg", "2021.03.02.jpg", "2022.01.01.jpg"):
        (folder / name).write_bytes(b"x")
    with pytest.raises(SampleError, match=re.escape(
            "sample '2022' has files ['01.01.jpg'], sample '2021' has ['03.01.jpg', '03.02.jpg']; every sample "
            "needs the same extensions (a key is the name up to its first dot, as in webdataset's tars: "
            "'a.seg.png' is field 'seg.png' of sample 'a'; rename files whose stems hold dots, '2021.03.01.jpg' "
            "to '2021-03-01.jpg')")):
        pipeline.build_folder(folder, tmp_path / "out", quiet=True)


def test_folder_of_subfolders_points_at_recursive(tmp_path: Path) -> None:
    for name in ("cats/0001.jpg", "dogs/0001.jpg"):
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / name).write_bytes(name.encode())
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"{tmp_path / 'in'}: no files to build from; its files are in subfolders: pass --recursive "
            f"(recursive=True) to take them, keyed by their paths")):
        pipeline.build_folder(tmp_path / "in", tmp_path / "out", quiet=True)
    pipeline.build_folder(tmp_path / "in", tmp_path / "out", recursive=True, quiet=True)
    assert read_back(tmp_path / "out") == (["cats_0001", "dogs_0001"], {"jpg": [b"cats/0001.jpg", b"dogs/0001.jpg"]})
    (tmp_path / "in" / "0002.jpg").write_bytes(b"top")  # a file of its own: the subfolders' would go unread
    with pytest.warns(UserWarning, match=re.escape(f"{tmp_path / 'in'}: the files of its subfolders (cats, dogs) are "
                                                   f"not read: pass --recursive (recursive=True) to take them too")):
        pipeline.build_folder(tmp_path / "in", tmp_path / "top", quiet=True)
    assert read_back(tmp_path / "top") == (["0002"], {"jpg": [b"top"]})


@pytest.mark.parametrize("out", [".", "shards"])
def test_a_folder_built_into_itself_is_refused_when_built_again(tmp_path: Path, out: str) -> None:
    folder = tmp_path / "in"
    for name in ("a/1.txt", "b/2.txt"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(name.encode())
    pipeline.build_folder(folder, folder / out, recursive=True, quiet=True)
    with pytest.raises(SampleError, match=re.escape(
            f"{folder / out / 'index.json'}: the index of a shard set (an earlier build written into the folder it "
            f"reads?): its shards would be read as samples; write the shards outside the folder, and move this set "
            f"out of it")):
        pipeline.build_folder(folder, folder / out, recursive=True, overwrite=True, quiet=True)


def test_two_files_that_make_one_key_in_a_recursive_folder_are_both_named(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    (folder / "sub").mkdir(parents=True)
    for stem in ("sub/q", "sub_q"):
        (folder / f"{stem}.jpg").write_bytes(b"j")
    with pytest.raises(SampleError, match=re.escape(
            f"{folder / 'sub' / 'q.jpg'} and {folder / 'sub_q.jpg'} both make field 'jpg' of sample 'sub_q' "
            f"(a subfolder's path joins the key with '_'): rename one of them")):
        pipeline.build_folder(folder, tmp_path / "out", recursive=True, quiet=True)


def test_a_file_name_that_is_no_utf8_is_named_and_files_of_one_sample_each_get_a_key(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    name = b"\xffscan".decode("utf-8", "surrogateescape")  # Linux allows any bytes in a name
    (folder / f"{name}.jpg").write_bytes(b"j")
    with pytest.raises(SampleError, match=re.escape(
            f"{folder / name}.jpg: sample key '\\udcffscan' is not UTF-8 text, which a tar member's name must be; "
            f"rename it")):
        pipeline.build_folder(folder, tmp_path / "out", quiet=True)
    np.save(folder / f"{name}.npy", np.arange(3))
    pipeline.build_sample_files(folder, {name: 1}, {"train": [name]}, tmp_path / "files-out", quiet=True)
    keys, fields = read_back(tmp_path / "files-out" / "train")
    assert keys == ["\ufffdscan"] and fields["y"] == [1]
    np.testing.assert_array_equal(fields["x"][0], np.arange(3))


def test_shards_over_twice_shard_bytes_from_rows_that_vary_in_size_are_warned_of(tmp_path: Path) -> None:
    """Shards are cut by the first record's size: blobs after a small first one made one shard of
    the whole set, over shard_bytes many times, without a word (quiet or not)."""
    blobs = [b"x"] + [bytes(100_000)] * 40
    with pytest.warns(UserWarning) as told:
        index = pipeline.write_shards(tmp_path / "out", {"blob": blobs}, shard_bytes=500_000, pack=1, quiet=True)
    largest = max(shard.bytes for shard in index.shards)
    assert largest > 1_000_000
    assert [str(w.message) for w in told] == [
        f"1 shard(s) hold more than twice shard_bytes=500,000 (the largest, {tmp_path / 'out' / 'shard-000000.tar'}, "
        f"{largest:,} bytes in 41 samples): shards are cut by the size of the first record, and these rows vary in "
        f"size; give shard_samples (--shard-samples) to bound them"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipeline.write_shards(tmp_path / "bounded", {"blob": blobs}, shard_bytes=500_000, shard_samples=4, pack=1,
                              quiet=True)
