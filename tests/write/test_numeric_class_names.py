"""Class names that read as whole numbers ("2", "10") are stored as positions in the names sorted
as text, where "10" comes before "2": every layout that numbers class names warns when a stored
label is not the number a user reads, and says how to keep the numbers. Before, of labels "0"-"11",
"2" became label 4 without a word."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import pipeline
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
