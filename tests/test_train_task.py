"""What the example trainer chooses to train, from the shards it is given: classes or a
regression, how many classes, and clear errors for labels it cannot train on."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pipeline

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from train_task import Task, UnusableData, choose_task  # noqa: E402


def splits(folder: Path, train_y: np.ndarray, val_y: np.ndarray) -> tuple[str, str]:
    for name, y in (("train", train_y), ("validation", val_y)):
        x = np.zeros((len(y), 2, 3), np.float32)
        pipeline.write_shards(folder / name, {"x": x, "y": y}, quiet=True)
    return str(folder / "train"), str(folder / "validation")


def test_integer_and_whole_float_labels_are_classes_counted_over_both_splits(tmp_path: Path) -> None:
    task = choose_task(*splits(tmp_path / "a", np.array([0, 1, 7, 2]), np.array([1, 2])))
    assert (task.features, task.outputs, task.classes) == (6, 8, 8)  # class 7 is in the training split only
    task = choose_task(*splits(tmp_path / "b", np.array([0.0, 3.0]), np.array([1.0, 2.0])))
    assert task.classes == 4 and "floats holding whole numbers" in task.description


def test_real_values_and_large_whole_numbers_are_a_regression(tmp_path: Path) -> None:
    task = choose_task(*splits(tmp_path / "a", np.array([0.5, 1.25]), np.array([2.0, 3.0])))
    assert task.classes == 0 and task.outputs == 1 and "real values" in task.description
    prices = np.array([100_000.0, 250_000.0])
    task = choose_task(*splits(tmp_path / "b", prices, prices))
    assert task.classes == 0 and "more than 1000 classes" in task.description
    assert choose_task(*splits(tmp_path / "c", np.array([1, 2]), np.array([0, 1])), task="regression").classes == 0
    task = choose_task(*splits(tmp_path / "d", np.zeros((4, 3)), np.zeros((2, 3))))
    assert task.classes == 0 and task.outputs == 3 and "arrays of 3 values" in task.description
    multi_hot = np.array([[1, 1, 0], [0, 1, 0]])  # two labels in a row: no one-hot
    assert choose_task(*splits(tmp_path / "e", multi_hot, multi_hot)).classes == 0


def test_one_hot_labels_are_classes_their_rows_positions(tmp_path: Path) -> None:
    one_hot = np.eye(5)[[3, 0, 4, 1]]
    for task in ("auto", "classification"):
        chosen = choose_task(*splits(tmp_path / task, one_hot, one_hot[:2]), task=task)
        assert (chosen.outputs, chosen.classes, chosen.one_hot) == (5, 5, True)
        assert "one-hot rows of float64" in chosen.description
        assert chosen.targets({"y": torch.from_numpy(one_hot)}).tolist() == [3, 0, 4, 1]
    given = choose_task(*splits(tmp_path / "given", one_hot, one_hot[:2]), classes=5)
    assert given.one_hot and given.targets({"y": torch.from_numpy(one_hot)}).tolist() == [3, 0, 4, 1]


def test_labels_it_cannot_train_on_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(UnusableData, match=r"labels y hold -1: class numbers run from 0 to C-1; remap them"):
        choose_task(*splits(tmp_path / "a", np.array([-1, 1]), np.array([1, -1])))
    with pytest.raises(UnusableData, match=r"--task classification needs one whole number per label"):
        choose_task(*splits(tmp_path / "b", np.array([0.5, 1.5]), np.array([0.5])), task="classification")
    train, validation = splits(tmp_path / "c", np.array([0, 1]), np.array([0]))
    pipeline.write_shards(validation, {"x": np.zeros((0, 2, 3), np.float32), "y": np.zeros(0, np.int64)},
                          overwrite=True, quiet=True)
    with pytest.raises(UnusableData, match=rf"{validation}: no samples"):
        choose_task(train, validation)


def test_labels_that_are_no_finite_number_are_an_error_naming_the_split_and_sample(tmp_path: Path) -> None:
    """NaN labels (a missing value) made a regression whose loss and RMSE were NaN, said nowhere;
    --task regression reads no labels first, and its batches say so instead."""
    train, validation = splits(tmp_path / "a", np.array([0.5, 1.5, 2.5]), np.array([0.5, np.nan, np.inf, 1.0]))
    with pytest.raises(UnusableData, match=re.escape(
            f"{validation}: 2 label(s) y are no finite number (NaN or infinity: a missing value?), the first that of "
            f"sample 1 in the set's order; a loss over them is NaN: drop or fill those samples, and build the shards "
            f"again")):
        choose_task(train, validation)
    task = choose_task(train, validation, task="regression")
    with pytest.raises(UnusableData, match=re.escape(
            "a label y in the validation split is no finite number (NaN or infinity: a missing value?); a loss over "
            "it is NaN: drop or fill those samples, and build the shards again")):
        task.checked({"y": torch.tensor([0.5, float("nan")])}, "validation")


def test_class_names_as_labels_are_told_how_to_be_numbered(tmp_path: Path) -> None:
    train, validation = splits(tmp_path / "a", np.array(["cat", "dog"]), np.array(["dog"]))
    with pytest.raises(UnusableData, match=re.escape(
            f"{train}: field 'y' holds str, not numbers: class names are numbered by their position in the sorted "
            f"names before a build (np.unique(names, return_inverse=True)[1]")):
        choose_task(train, validation)


def test_a_label_beyond_the_classes_given_is_an_error_naming_the_split() -> None:
    task = Task(6, 5, 5, "classification into 5 classes (--classes)")
    assert task.targets(task.checked({"y": torch.tensor([0, 4])}, "validation")).tolist() == [0, 4]
    with pytest.raises(UnusableData, match=r"^label 9 in the validation split is not one of the 5 classes \(0 to 4\) "
                                           r"given by --classes 5: give --classes 10 or more, or leave it out"):
        task.checked({"y": torch.tensor([3, 9, 1])}, "validation")
    with pytest.raises(UnusableData, match=r"^label -100 in the train split is not one of the 5 classes \(0 to 4\) "
                                           r"given by --classes 5: class numbers run from 0"):  # (a loss skipped it)
        task.checked({"y": torch.tensor([3, -100, 1])}, "train")
    with pytest.raises(UnusableData, match=r"^a label y in the train split is no finite number"):  # (not -2\*\*63)
        task.checked({"y": torch.tensor([3.0, float("nan")])}, "train")


def test_classes_given_or_a_regression_read_no_labels_first(tmp_path: Path, monkeypatch) -> None:
    """Each rank read both splits whole before training (over the network: 32 downloads of the
    set for 4 nodes of 8), though these options need no label counted."""
    train, validation = splits(tmp_path, np.arange(40) % 3, np.arange(10) % 3)

    def unread(location: str) -> np.ndarray:
        raise AssertionError(f"read the labels of {location}")
    monkeypatch.setattr("train_task._labels", unread)
    assert choose_task(train, validation, classes=3).classes == 3
    assert choose_task(train, validation, task="regression").classes == 0


@pytest.mark.parametrize("options", [{}, {"classes": 3}, {"task": "regression"}])
def test_a_split_without_samples_is_an_error_whichever_task(tmp_path: Path, options: dict) -> None:
    """--classes and --task regression read no labels first: an empty split went on to report
    an accuracy over no samples."""
    train, validation = splits(tmp_path, np.arange(12) % 3, np.zeros(0, np.int64))
    with pytest.raises(UnusableData, match=re.escape(f"{validation}: no samples; the example needs samples in both "
                                                     f"splits")):
        choose_task(train, validation, **options)
