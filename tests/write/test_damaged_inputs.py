"""The inputs of the classic recipes as users have them, damaged or not quite as the layout says:
each is an error naming the file and saying what to do, or, where the intent is plain (tensors
dumped with joblib), a build of exactly what the files hold."""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path
from typing import Any, Callable

import joblib
import numpy as np
import pytest
import torch

import pipeline
from pipeline import SampleError
from tests.write.test_converters import make_sample_files


def cut_to(size: int) -> Callable[[Path], None]:
    return lambda path: os.truncate(path, size)


def save_as(value: Any) -> Callable[[Path], None]:
    return lambda path: torch.save(value, path)


SAMPLE_FILE_DAMAGE = {
    "a .pt cut short": (".pt", cut_to(100), r"cannot load with torch\.load\(weights_only=True\) \(RuntimeError: "
                                            r".*\); if the file is truncated or damaged, save it again"),
    "an empty .pt": (".pt", cut_to(0), r"cannot load with torch\.load\(weights_only=True\) \(EOFError\); if the "
                                       r"file is truncated or damaged, save it again"),
    "a .pt of a NumPy array": (".pt", save_as(np.zeros(3)), r"holds NumPy data, which torch\.load\(weights_only=True\) "
                                                            r"refuses to unpickle: save the array with np\.save as "
                                                            r"<ID>\.npy in its place \(remove this file: an ID's "
                                                            r"\.pt is read before its \.npy\), or as a tensor with "
                                                            r"torch\.save\(torch\.from_numpy"),
    "a .pt of a dict of tensors": (".pt", save_as({"x": torch.zeros(2), "mask": torch.ones(2)}),
                                   r"holds a dict, not a tensor: .* save one tensor per file \(torch\.save\(tensor, "
                                   r"path\)\), or write samples of several fields with pipeline\.ShardWriter"),
    "a .pt of a list of same-shape tensors": (".pt", save_as([torch.zeros(2), torch.ones(2)]),
                                             r"holds a list of 2 tensors or arrays, not one tensor: this layout stores "
                                             r"each file's one tensor as field x \(stacking them would hide which was "
                                             r"which\); save torch\.stack\(items\) if they are one array, or write "
                                             r"samples of several fields with pipeline\.ShardWriter$"),
    "a .pt of a tensor and its label": (".pt", save_as((torch.zeros(2), torch.tensor(1))),
                                        r"holds a tuple of 2 tensors or arrays, not one tensor"),
    "a .pt of a sparse tensor": (".pt", save_as(torch.eye(3).to_sparse()),
                                 r"holds a torch\.sparse_coo tensor: save it dense \(tensor\.to_dense\(\)\)"),
    "a .pt of a float8 tensor": (".pt", save_as(torch.zeros(3).to(torch.float8_e4m3fn)),
                                 r"holds a tensor of dtype torch\.float8_e4m3fn, which shards cannot store: save it "
                                 r"as a dtype NumPy has \(tensor\.float\(\), say\)$"),
    "a .pt of pickle protocol 4": (".pt", lambda path: torch.save(torch.ones(3), path, pickle_protocol=4),
                                   r"saved with pickle protocol 4 or 5 \(torch\.save\(\.\.\., pickle_protocol=4\)\), "
                                   r"which torch\.load\(weights_only=True\) cannot read: save it again with the "
                                   r"default protocol"),
    "a .pt of garbage": (".pt", lambda path: path.write_bytes(b"garbage!" * 20),
                         r"cannot load with torch\.load\(weights_only=True\) \(Unsupported operand 103\); if the file "
                         r"is truncated or damaged, save it again"),
    "an .npy of Python objects": (".npy", lambda path: np.save(path, np.array([{}, 1], dtype=object)),
                                  r"holds an array of Python objects, which only pickle could load: save a numeric "
                                  r"array"),
    "an .npy cut short": (".npy", cut_to(140), r"cannot load with np\.load \(ValueError: .*\); if the file is "
                                               r"truncated or damaged, save it again"),
    "an empty .npy": (".npy", cut_to(0), r"cannot load with np\.load \((EOFError: No data left in file|it is no "
                                         r"\.npy file: it does not begin as one)\)"),  # (NumPy 2; NumPy 1)
    "a pickle named .npy": (".npy", lambda path: path.write_bytes(pickle.dumps([1, 2])),
                            r"cannot load with np\.load \(it is no \.npy file: it does not begin as one\)"),
    "an .npy of strings": (".npy", lambda path: np.save(path, np.array(["cat", "dog"])),
                           r"unsupported array dtype <U3 \(supported: bool, int8-64, uint8-64, float16/32/64\); save "
                           r"it as numbers of a dtype shards store \(tensor\.float\(\), say\)$"),
    "a .pt of complex numbers": (".pt", save_as(torch.ones(2, dtype=torch.complex64)),
                                 r"unsupported array dtype complex64 .*; save it as numbers of a dtype shards store"),
}


@pytest.mark.parametrize("damage", SAMPLE_FILE_DAMAGE)
def test_a_sample_file_that_cannot_be_used_is_an_error_naming_it(tmp_path: Path, damage: str) -> None:
    suffix, spoil, message = SAMPLE_FILE_DAMAGE[damage]
    make_sample_files(tmp_path / "data", ["a", "b", "c"], suffix=suffix)
    spoil(tmp_path / "data" / f"b{suffix}")
    with pytest.raises(SampleError, match=re.escape(str(tmp_path / "data" / f"b{suffix}")) + ": " + message):
        pipeline.build_sample_files(tmp_path / "data", {"a": 0, "b": 1, "c": 2}, {"train": ["a", "b", "c"]},
                                    tmp_path / "out", quiet=True)


def test_class_names_as_labels_are_numbered_as_imagefolder_numbers_classes(tmp_path: Path) -> None:
    make_sample_files(tmp_path / "data", ["a", "b", "c", "d"])
    labels, partition = {"a": "dog", "b": "cat", "c": "emu", "d": "cat"}, {"train": ["a", "b", "c"], "validation": ["d"]}
    built = pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", quiet=True)
    assert [index.metadata["classes"] for index in built.values()] == [["cat", "dog", "emu"]] * 2
    assert [int(s["y"]) for _, s in pipeline.iter_samples(tmp_path / "out" / "train")] == [1, 0, 2]
    assert [int(s["y"]) for _, s in pipeline.iter_samples(tmp_path / "out" / "validation")] == [0]


@pytest.mark.parametrize("labels,shown", [({"a": "cat", "b": 1, "c": 2}, "'a' ('cat'), 'b' (1), 'c' (2)"),
                                          ({"a": 0, "b": None, "c": {"k": 1}}, "'b' (None), 'c' ({'k': 1})")])
def test_labels_of_mixed_or_unusable_kinds_are_refused_before_anything_is_written(tmp_path: Path, labels: dict,
                                                                                    shown: str) -> None:
    make_sample_files(tmp_path / "data", ["a", "b", "c"])
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    with pytest.raises(SampleError, match=re.escape(f"{tmp_path / 'labels.json'}: a label is a number (or an array of "
                                                    f"numbers) or the name of a class, the same kind for every ID; "
                                                    f"{shown}")):
        pipeline.build_sample_files(tmp_path / "data", tmp_path / "labels.json", {"train": ["a", "b", "c"]},
                                    tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()


def test_numpy_labels_keep_their_dtype_and_dtypes_makes_them_int64_as_json_labels_are(tmp_path: Path) -> None:
    """As the README says: np.int32 labels (a pandas int32 column's) are batched as torch.int32,
    which cross_entropy refuses, and do not mix with the same labels from JSON; dtypes= makes them
    int64."""
    ids = ["a", "b", "c", "d"]
    make_sample_files(tmp_path / "data", ids)
    (tmp_path / "labels.json").write_text(json.dumps({sample_id: n % 2 for n, sample_id in enumerate(ids)}))
    labels = {sample_id: np.int32(n % 2) for n, sample_id in enumerate(ids)}
    built = {"json": {"labels": tmp_path / "labels.json"}, "int32": {"labels": labels},
             "int64": {"labels": labels, "dtypes": {"y": "int64"}}}
    batches = {}
    for name, options in built.items():
        pipeline.build_sample_files(tmp_path / "data", partition={"train": ids}, out_dir=tmp_path / name, quiet=True,
                                    **options)
        batches[name] = next(iter(pipeline.make_loader(tmp_path / name / "train", 0, batch_size=4, shuffle=False)))
    assert {name: batch["y"].dtype for name, batch in batches.items()} == {
        "json": torch.int64, "int32": torch.int32, "int64": torch.int64}
    assert all(batch["y"].tolist() == [0, 1, 0, 1] for batch in batches.values())
    with pytest.raises(RuntimeError, match="expected target dtype to be Long"):
        torch.nn.functional.cross_entropy(torch.zeros(4, 2), batches["int32"]["y"])
    with pytest.raises(ValueError, match=r"field 'y' is int32\[\] in source 'b' and int\[\] in source 'a'"):
        pipeline.make_loader({"a": tmp_path / "json" / "train", "b": tmp_path / "int32" / "train"}, 0)
    pipeline.make_loader({"a": tmp_path / "json" / "train", "b": tmp_path / "int64" / "train"}, 0)


def test_arrays_of_numbers_are_labels_and_files_may_hold_lists_of_numbers(tmp_path: Path) -> None:
    make_sample_files(tmp_path / "data", ["a", "b"])
    torch.save([1.5, 2.5, 3.5], tmp_path / "data" / "b.pt")
    torch.save([0.5, 1.5, 2.5], tmp_path / "data" / "a.pt")
    multi_hot = {"a": [0, 1], "b": [1, 0]}
    pipeline.build_sample_files(tmp_path / "data", multi_hot, {"train": ["a", "b"]}, tmp_path / "out", quiet=True)
    samples = [s for _, s in pipeline.iter_samples(tmp_path / "out" / "train")]
    assert [list(s["y"]) for s in samples] == [[0, 1], [1, 0]] and [list(s["x"]) for s in samples] == [[0.5, 1.5, 2.5], [1.5, 2.5, 3.5]]
    assert pipeline.load_index(tmp_path / "out" / "train").fields["y"] == pipeline.FieldSpec("int64", (2,))
    batch = next(iter(pipeline.make_loader(tmp_path / "out" / "train", 0, batch_size=2, shuffle=False)))
    assert batch["y"].tolist() == [[0, 1], [1, 0]]  # a tensor, not lists of Python numbers
    mixed = {"a": [1, 2.5], "b": []}  # lists of ints, floats or nothing: one dtype for all
    pipeline.build_sample_files(tmp_path / "data", mixed, {"train": ["a", "b"]}, tmp_path / "mixed", quiet=True)
    assert [s["y"].tolist() for _, s in pipeline.iter_samples(tmp_path / "mixed" / "train")] == [[1.0, 2.5], []]
    soft = {"a": [0.5, 0.5], "b": [1, 0]}  # a soft label in one split: the other's whole numbers are floats too
    pipeline.build_sample_files(tmp_path / "data", soft, {"train": ["a"], "validation": ["b"]}, tmp_path / "soft",
                                quiet=True)
    for split, values in (("train", [[0.5, 0.5]]), ("validation", [[1.0, 0.0]])):
        assert pipeline.load_index(tmp_path / "soft" / split).fields["y"] == pipeline.FieldSpec("float64", (2,))
        batch = next(iter(pipeline.make_loader(tmp_path / "soft" / split, 0, batch_size=1, shuffle=False)))
        assert batch["y"].dtype == torch.float64 and batch["y"].tolist() == values


def test_problems_of_the_partition_name_its_file(tmp_path: Path) -> None:
    make_sample_files(tmp_path / "data", ["a", "b"])
    partition = tmp_path / "partition.json"
    partition.write_text(json.dumps({"train": ["b"], "validation": ["a", "a"]}))
    with pytest.raises(SampleError, match=re.escape(f"split 'validation' of {partition}: 1 IDs are listed more than "
                                                    f"once, e.g. ['a']")):
        pipeline.build_sample_files(tmp_path / "data", {"a": 0, "b": 1}, partition, tmp_path / "out", quiet=True)
    partition.write_text(json.dumps({"train": ["a"], "validation": ["b", "z"]}))
    with pytest.raises(FileNotFoundError, match=re.escape(f"split 'validation' of {partition}: 1 IDs have no file")):
        pipeline.build_sample_files(tmp_path / "data", {"a": 0, "b": 1, "z": 2}, partition, tmp_path / "out",
                                    quiet=True)
    with pytest.raises(TypeError, match="build_sample_files takes its splits from the partition"):
        pipeline.build_sample_files(tmp_path / "data", {"a": 0, "b": 1}, {"train": ["a", "b"]}, tmp_path / "out",
                                    validation=0.5)



def test_ids_that_are_paths_below_the_folder_make_keys_and_ids_outside_it_are_refused(tmp_path: Path) -> None:
    """``data/cats/001.pt`` is ID ``cats/001``: its sample gets a key made from it, as an image
    file's; an ID reaching out of the folder reads nothing there."""
    (tmp_path / "data" / "cats").mkdir(parents=True)
    for n, sample_id in enumerate(["cats/001", "scan.002", "cats_001", "plain"]):
        torch.save(torch.full((2,), float(n)), tmp_path / "data" / f"{sample_id}.pt")
    ids = ["cats/001", "scan.002", "cats_001", "plain"]
    pipeline.build_sample_files(tmp_path / "data", {i: n for n, i in enumerate(ids)}, {"train": ids},
                                tmp_path / "out", quiet=True)
    got = {key: (float(s["x"][0]), int(s["y"])) for key, s in pipeline.iter_samples(tmp_path / "out" / "train")}
    assert len(got) == 4 and got["scan_002"] == (1.0, 1) and got["cats_001"] == (2.0, 2) and got["plain"] == (3.0, 3)
    [made] = set(got) - {"scan_002", "cats_001", "plain"}  # cats/001's: not the other ID's key
    assert made.startswith("cats_001_") and got[made] == (0.0, 0)
    torch.save(torch.zeros(2), tmp_path / "secret.pt")
    with pytest.raises(SampleError, match=re.escape(
            "split 'train' of the partition: 1 IDs name no file inside " f"{tmp_path / 'data'} (empty, absolute, or with '..'), e.g. "
            "['../secret']")):
        pipeline.build_sample_files(tmp_path / "data", {"../secret": 0}, {"train": ["../secret"]}, tmp_path / "o2",
                                    quiet=True)

def test_a_build_stopped_by_a_bad_file_in_its_second_split_resumes_once_the_file_is_mended(tmp_path: Path) -> None:
    ids = [f"id-{n}" for n in range(8)]
    make_sample_files(tmp_path / "data", ids)
    bad = tmp_path / "data" / "id-6.pt"
    good = bad.read_bytes()
    bad.write_bytes(b"")
    labels, partition = {i: n for n, i in enumerate(ids)}, {"train": ids[:5], "validation": ids[5:]}
    with pytest.raises(SampleError, match=re.escape(str(bad))):
        pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", quiet=True)
    assert pipeline.load_index(tmp_path / "out" / "train").samples == 5
    bad.write_bytes(good)
    with pytest.raises(pipeline.OutputExistsError, match=r"train/index\.json already exists, .*; pass overwrite=True "
                                                         r"\(--overwrite\) to replace it, .*, or, to finish a local build "
                                                         r"that stopped part way .*resume=True \(--resume\)"):
        pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", quiet=True)
    built = pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", quiet=True,
                                        resume=True)
    assert {split: index.samples for split, index in built.items()} == {"train": 5, "validation": 3}
    values = [float(s["x"][0, 0]) for _, s in pipeline.iter_samples(tmp_path / "out" / "validation")]
    assert values == [5.0, 6.0, 7.0]


def dump_pairs(folder: Path, xs: list[Any], ys: list[Any], batch: int = 4) -> Path:
    folder.mkdir()
    joblib.dump(xs, folder / f"x_{batch}.job")
    joblib.dump(ys, folder / f"y_{batch}.job")
    return folder


def test_joblib_files_of_tensors_build_exactly_what_they_hold(tmp_path: Path) -> None:
    """Batches straight from a DataLoader are tensors: as a list of batches, or one batch a file."""
    x = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    y = torch.arange(10) % 3
    batched = dump_pairs(tmp_path / "batched", list(x.split(4)), list(y.split(4)))
    index = pipeline.build_joblib(batched, tmp_path / "out", quiet=True)
    samples = [s for _, s in pipeline.iter_samples(tmp_path / "out")]
    assert index.samples == 10 and np.array_equal(np.stack([s["x"] for s in samples]), x.numpy())
    assert [int(s["y"]) for s in samples] == y.tolist()
    one_a_file = tmp_path / "one"
    one_a_file.mkdir()
    for n, (xb, yb) in enumerate(zip(x.split(4), y.split(4))):
        joblib.dump(xb, one_a_file / f"x_{n}.job")
        joblib.dump(yb, one_a_file / f"y_{n}.job")
    pipeline.build_joblib(one_a_file, tmp_path / "out-one", quiet=True)
    assert [s["x"].tolist() for _, s in pipeline.iter_samples(tmp_path / "out-one")] == x.tolist()


def test_joblib_files_that_cannot_be_used_are_errors_naming_them(tmp_path: Path) -> None:
    x, y = [np.ones((4, 2))] * 3, [np.arange(4)] * 3
    for name in ("x_4.job", "y_4.job"):
        folder = dump_pairs(tmp_path / name, x, y)
        os.truncate(folder / name, 300)
        with pytest.raises(SampleError, match=re.escape(f"{folder / name}: cannot load with joblib (") + r".*\); if "
                                              r"the file is truncated or damaged, save it again, then build again "
                                              r"with --resume \(resume=True\), which keeps the shards already "
                                              r"written$"):
            pipeline.build_joblib(folder, tmp_path / "out", quiet=True, overwrite=True)
    folder = dump_pairs(tmp_path / "bf16", [torch.ones(4, 2, dtype=torch.bfloat16)], [torch.arange(4)])
    with pytest.raises(SampleError, match=re.escape(f"{folder / 'x_4.job'}: holds bfloat16 tensors, which NumPy "
                                                    f"cannot hold: convert them (.float())")):
        pipeline.build_joblib(folder, tmp_path / "out", quiet=True, overwrite=True)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{folder / 'x_4.job'}: no such folder (it is a file: pass "
                                                          f"the folder that holds it)")):
        pipeline.build_joblib(folder / "x_4.job", tmp_path / "out", quiet=True, overwrite=True)
    for build in (lambda root: pipeline.build_sample_files(root, {"a": 0}, {"train": ["a"]}, tmp_path / "out"),
                  lambda root: pipeline.build_folder(root, tmp_path / "out")):  # (they said "no such folder" only)
        with pytest.raises(FileNotFoundError, match=re.escape(f"{folder / 'x_4.job'}: no such folder (it is a file: "
                                                              f"pass the folder that holds it)")):
            build(folder / "x_4.job")


def test_a_tensor_saved_while_it_required_grad_builds(tmp_path: Path) -> None:
    make_sample_files(tmp_path / "data", ["a", "b"])
    torch.save(torch.full((2, 3), 7.0, requires_grad=True), tmp_path / "data" / "b.pt")
    pipeline.build_sample_files(tmp_path / "data", {"a": 0, "b": 1}, {"train": ["a", "b"]}, tmp_path / "out", quiet=True)
    assert [s["x"].tolist() for _, s in pipeline.iter_samples(tmp_path / "out" / "train")] == [[[0.0] * 3] * 2,
                                                                                              [[7.0] * 3] * 2]
