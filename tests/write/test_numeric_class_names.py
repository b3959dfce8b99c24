"""Class names that read as whole numbers ("2", "10") are stored as positions in the names sorted
as text, where "10" comes before "2": every layout that numbers class names warns when a stored
label is not the number a user reads, and says how to keep the numbers. Before, of labels "0"-"11",
"2" became label 4 without a word."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.cli import main
from tests.helpers import read_back
from tests.images import image_folder
from tests.write.test_joblib_lists import dump

RENUMBERED = r"the class names read as whole numbers \('0', '1', '10', '11', \.\.\.\), but each is stored as its " \
             r"position in the names sorted as text, as torchvision's ImageFolder numbers class folders: '10' is " \
             r"label 2; "


def _sample_files(tmp_path: Path, classes: int) -> tuple[Path, Path]:
    (tmp_path / "data").mkdir()
    for n in range(24):
        np.save(tmp_path / "data" / f"{n}.npy", np.full(2, n, np.float32))
    (tmp_path / "labels.json").write_text(json.dumps({str(n): str(n % classes) for n in range(24)}))
    (tmp_path / "partition.json").write_text(json.dumps({"train": [str(n) for n in range(24)]}))
    return tmp_path / "labels.json", tmp_path / "partition.json"


def test_sample_files_labelled_with_numbers_as_text_warn(tmp_path: Path) -> None:
    labels, partition = _sample_files(tmp_path, classes=12)
    with pytest.warns(UserWarning, match=rf"labels\.json: {RENUMBERED}give the labels as numbers \(2, not \"2\"\)"):
        pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", quiet=True)
    fields = read_back(tmp_path / "out" / "train")[1]
    stored = {int(x[0]): int(y) for x, y in zip(fields["x"], fields["y"])}
    assert stored[2] == 4 and stored[10] == 2  # as documented: positions in the sorted names


def test_names_whose_positions_are_their_numbers_do_not_warn(tmp_path: Path) -> None:
    labels, partition = _sample_files(tmp_path, classes=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", quiet=True)


def test_joblib_labels_of_numbers_as_text_warn(tmp_path: Path) -> None:
    folder = dump(tmp_path / "jobs", 12, np.zeros((12, 2), np.float32), np.array([str(n) for n in range(12)]))
    with pytest.warns(UserWarning, match=rf"jobs: {RENUMBERED}save the labels as numbers \(y\.astype\(int\)\)"):
        pipeline.build_joblib(folder, tmp_path / "out", quiet=True)


def test_class_folders_named_by_numbers_warn_unless_the_classes_are_given(tmp_path: Path) -> None:
    image_folder(tmp_path / "digits", {str(n): 1 for n in range(12)}, size=(8, 8))
    with pytest.warns(UserWarning, match=rf"digits: {RENUMBERED}give the classes in the order of their numbers"):
        pipeline.build_imagefolder(tmp_path / "digits", tmp_path / "out", quiet=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipeline.build_imagefolder(tmp_path / "digits", tmp_path / "given", classes=[str(n) for n in range(12)],
                                   quiet=True)
    assert pipeline.load_index(tmp_path / "given").metadata["classes"][10] == "10"


def _week(folder: Path, classes: list[str]) -> tuple[Path, Path, Path]:
    """A week's one-file-a-sample data whose labels are class names, and its labels and partition."""
    (folder / "data").mkdir(parents=True)
    for n in range(6):
        np.save(folder / "data" / f"{n}.npy", np.full(2, n, np.float32))
    (folder / "labels.json").write_text(json.dumps({str(n): classes[n % len(classes)] for n in range(6)}))
    (folder / "partition.json").write_text(json.dumps({"train": ["0", "1", "2", "3"], "validation": ["4", "5"]}))
    return folder / "data", folder / "labels.json", folder / "partition.json"


def _build_files(data: Path, labels: Path, partition: Path, out: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "build", "files", str(data), str(out), "--labels",
                           str(labels), "--partition", str(partition), "--quiet", *options],
                          capture_output=True, text=True)


def test_a_class_list_given_to_build_files_keeps_a_later_weeks_numbering(tmp_path: Path) -> None:
    """Week 2 brought the class "bird": numbered by the names sorted, "cat" became 1 and "dog" 2,
    and a model trained on week 1 (cat 0, dog 1) resumed on week 2 without a word; there was no
    option to keep the numbering, and a mix of the weeks advised one only build imagefolder has."""
    pipeline.build_sample_files(*_week(tmp_path / "w1", ["cat", "dog"]), tmp_path / "week1", quiet=True)
    week2 = _week(tmp_path / "w2", ["cat", "dog", "bird"])
    pipeline.build_sample_files(*week2, tmp_path / "sorted", quiet=True)
    with pytest.raises(ValueError, match=re.escape(
            "build them with one class list (classes=[...] of build_imagefolder, build_sample_files or build_joblib; "
            "--classes a,b,c of pipeline build imagefolder, files or joblib;")):
        pipeline.make_loader({"w1": tmp_path / "week1" / "train", "w2": tmp_path / "sorted" / "train"}, num_workers=0)
    assert _build_files(*week2, tmp_path / "week2", "--classes", "cat,dog,bird").returncode == 0
    for split, labels in (("train", [0, 1, 2, 0]), ("validation", [1, 2])):
        assert [int(y) for y in read_back(tmp_path / "week2" / split)[1]["y"]] == labels
        assert pipeline.load_index(tmp_path / "week2" / split).metadata == {"classes": ["cat", "dog", "bird"]}
    pipeline.make_loader({"w1": tmp_path / "week1" / "train", "w2": tmp_path / "week2" / "train"}, num_workers=0)
    refused = _build_files(*week2, tmp_path / "unknown", "--classes", "cat,dog")
    assert refused.returncode == 1 and refused.stderr == (f"error: {week2[1]}: the label of ID '2' (split 'train'), "
                                                          f"'bird', is not among the classes ['cat', 'dog']\n")
    assert not (tmp_path / "unknown").exists()
    with pytest.raises(ValueError, match=re.escape("classes must be distinct, non-empty names, got ['cat', 'cat'] "
                                                   "(['cat'] more than once)")):
        pipeline.build_sample_files(*week2, tmp_path / "twice", classes=["cat", "cat"], quiet=True)
    with pytest.raises(TypeError, match=re.escape("classes is a list of class names, e.g. classes=['cat', 'dog'], "
                                                  "got the string 'cat'")):
        pipeline.build_sample_files(*week2, tmp_path / "string", classes="cat", quiet=True)


def test_a_class_list_given_to_build_joblib_numbers_its_labels_in_its_order(tmp_path: Path) -> None:
    folder = dump(tmp_path / "jobs", 6, np.zeros((6, 2), np.float32), np.array(["cat", "dog", "bird"] * 2))
    assert main(["build", "joblib", str(folder), str(tmp_path / "cli"), "--classes", "dog,cat,bird", "--quiet"]) == 0
    assert [int(y) for y in read_back(tmp_path / "cli")[1]["y"]] == [1, 0, 2, 1, 0, 2]
    assert pipeline.load_index(tmp_path / "cli").metadata == {"classes": ["dog", "cat", "bird"]}
    index = pipeline.build_joblib(folder, tmp_path / "py", classes=("cat", "dog", "bird", "eel"), quiet=True)
    assert index.metadata == {"classes": ["cat", "dog", "bird", "eel"]}
    assert [int(y) for y in read_back(tmp_path / "py")[1]["y"]] == [0, 1, 2, 0, 1, 2]
    with pytest.raises(pipeline.SampleError, match=re.escape(
            f"{folder / 'y_6.job'}: label 2 ('bird') is not among the classes ['cat', 'dog']")):
        pipeline.build_joblib(folder, tmp_path / "unknown", classes=["cat", "dog"], quiet=True)
    numbers = dump(tmp_path / "numbers", 6, np.zeros((6, 2), np.float32), np.arange(6))
    with pytest.raises(pipeline.SampleError, match=re.escape(
            f"{numbers / 'y_6.job'}: its labels are numbers, and classes= (--classes) numbers labels that are class "
            f"names: leave it out")):
        pipeline.build_joblib(numbers, tmp_path / "numbered", classes=["cat"], quiet=True)
    with pytest.raises(ValueError, match=re.escape("classes must be distinct, non-empty names, got []")):
        pipeline.build_joblib(folder, tmp_path / "empty", classes=[], quiet=True)
