"""What the example model trains, chosen from the data: its inputs, outputs, loss and metric.

``choose_task`` reads the schema of the training split and one pass over the labels of both
splits (``--task regression``, or ``--classes`` with one label a sample, skip it): integer labels (from 0), or float
labels that all hold whole numbers from 0 to :data:`MAX_GUESSED_CLASSES` (as the joblib batch
recipe stores class numbers), make a classification into ``largest label + 1`` classes; other
real-valued labels a regression on as many outputs as a label has values, but for one-hot rows
(0s and one 1 each: a classification into as many classes as a row has values). ``--task``
decides instead of the guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipeline import ShardDataset, load_index
from pipeline.format.index import FieldSpec
from pipeline.storage import is_remote


class UnusableData(Exception):
    """The shards are not something this example can train on (a missing split, no ``x``...)."""


def split_location(data: str, split: str, option: str) -> str:
    """The shard set of ``split`` under ``data`` (a folder or a URL); for a local folder, a
    missing split is an error naming the splits that are there."""
    location = f"{data.rstrip('/')}/{split}/"
    if is_remote(data):
        return location
    root = Path(data)
    if (root / split / "index.json").is_file():
        return location
    if not root.exists():
        raise UnusableData(f"{data}: no such folder; point --data at the folder a build wrote its splits to")
    if root.is_file():
        raise UnusableData(f"{data} is a file: point --data at the folder holding the splits (the folder a build "
                           f"wrote train/ and validation/ to)")
    if (root / "index.json").is_file():
        raise UnusableData(f"{data} is one shard set, not a folder of splits: build it again with --validation 0.1 "
                           f"--overwrite to write {data}/train and {data}/validation, or point --data at the folder "
                           f"holding the splits")
    found = sorted(p.parent.name for p in root.glob("*/index.json"))
    if not found:
        raise UnusableData(f"{data}: no shard sets (no {data}/<split>/index.json); build some first")
    build_one = (" or build one (--validation 0.1 holds out 10% of the samples; for one file per sample, a "
                 "'validation' list in the partition)") if option == "--validation-split" else ""
    raise UnusableData(f"{data} has no split {split!r}; it has {', '.join(map(repr, found))}: choose another with "
                       f"{option}{build_one}")


@dataclass(frozen=True)
class Task:
    """A linear model's job: ``features`` inputs, ``outputs`` outputs, ``classes`` > 0 for a
    classification (then ``outputs == classes``), 0 for a regression; ``one_hot`` for classes
    given as one-hot rows."""

    features: int
    outputs: int
    classes: int
    description: str
    one_hot: bool = False

    def inputs(self, batch: dict) -> torch.Tensor:
        x = batch["x"]
        return x.reshape(len(x), -1).float()

    def targets(self, batch: dict) -> torch.Tensor:
        """What the model's outputs are compared with for ``batch`` (its labels checked by
        :meth:`checked`, in the loader's workers)."""
        y = batch["y"]
        if not self.classes:
            return y.reshape(len(y), -1).float()
        return y.reshape(len(y), -1).argmax(dim=1) if self.one_hot else y.reshape(-1).long()

    def checked(self, batch: dict, split: str) -> dict:
        """``batch`` of ``split``, its labels checked (the loaders' ``batch_transform``: in their
        workers, on the CPU, where a check costs no wait for the GPU): a label beyond the classes
        or below 0 can only come from ``--classes``, and one that is no finite number only from
        ``--task regression``, as neither reads the labels first (counted, they hold every label
        of both splits); either is an error that says so."""
        y = torch.as_tensor(batch["y"])
        if not self.classes or y.is_floating_point():  # (a NaN class number: no finite number, said so)
            if len(y) and not bool(torch.isfinite(y.float()).all()):
                raise UnusableData(f"a label y in the {split} split is no finite number (NaN or infinity: a missing "
                                   f"value?); a loss over it is NaN: drop or fill those samples, and build the shards "
                                   f"again")
            if not self.classes:
                return batch
        target = self.targets({"y": y})
        if len(target) and int(target.min()) < 0:  # (-100 a loss would skip)
            raise UnusableData(f"label {int(target.min())} in the {split} split is not one of the {self.classes} "
                               f"classes (0 to {self.classes - 1}) given by --classes {self.classes}: class numbers "
                               f"run from 0; remap them (e.g. -1/1 to 0/1), or train a regression with --task "
                               f"regression")
        if len(target) and int(target.max()) >= self.classes:
            label = int(target.max())
            raise UnusableData(f"label {label} in the {split} split is not one of the {self.classes} classes "
                               f"(0 to {self.classes - 1}) given by --classes {self.classes}: give --classes "
                               f"{label + 1} or more, or leave it out to count the classes from the labels")
        return batch

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.classes:
            return nn.functional.cross_entropy(output, target)
        return nn.functional.mse_loss(output, target)

    def score(self, output: torch.Tensor, target: torch.Tensor) -> float:
        """Correct predictions (classification) or the sum of squared errors (regression)."""
        if self.classes:
            return float((output.argmax(dim=1) == target).sum())
        return float(((output - target) ** 2).sum())


def _kind(dtype: str) -> str:
    """``"i"`` for integers (and booleans), ``"f"`` for reals, ``""`` for what is not a number."""
    if dtype in ("int", "bool"):
        return "i"
    if dtype in ("float", "bfloat16"):
        return "f"
    try:
        kind = np.dtype(dtype).kind
    except TypeError:
        return ""
    return "i" if kind in "biu" else "f" if kind == "f" else ""


def _size(spec: FieldSpec, field: str, where: str) -> int:
    if spec.varies:
        raise UnusableData(f"{where}: field {field!r} has samples of different shapes; this example needs "
                           f"one shape for every sample")
    return 1 if spec.shape is None else int(math.prod(spec.shape))


#: Whole-number float labels up to this many classes are taken for class numbers; beyond, for
#: quantities (prices, counts) to regress on.
MAX_GUESSED_CLASSES = 1000


def choose_task(train: str, validation: str, classes: int | None = None, task: str = "auto") -> Task:
    """The task for the shards at ``train`` and ``validation`` (see the module docstring):
    ``task`` is ``"auto"``, ``"classification"`` or ``"regression"``."""
    indexes = {location: load_index(location) for location in (train, validation)}
    for location, index in indexes.items():
        if not index.samples:
            raise UnusableData(f"{location}: no samples; the example needs samples in both splits")
    fields = indexes[train].fields
    for name in ("x", "y"):
        if name not in fields:
            raise UnusableData(f"{train}: no field {name!r} (it has {sorted(fields)}); this example trains "
                               f"on features x and labels y")
    x, y = fields["x"], fields["y"]
    if not _kind(x.dtype) or not _kind(y.dtype):
        field = "x" if not _kind(x.dtype) else "y"
        names = "" if field != "y" or fields[field].dtype != "str" else (
            ": class names are numbered by their position in the sorted names before a build (np.unique(names, "
            "return_inverse=True)[1]; frame['y'].astype('category').cat.codes), as the joblib and sample-file builds "
            "do themselves")
        raise UnusableData(f"{train}: field {field!r} holds {fields[field].dtype}, not numbers{names}")
    features = _size(x, "x", train)
    outputs = _size(y, "y", train)
    if task == "regression":  # (no pass over the labels: every rank would read both splits whole first)
        return _regression(features, outputs, f"labels y: {y.dtype}; --task regression")
    if classes and outputs == 1:
        return Task(features, classes, classes, f"classification into {classes} classes (--classes; labels y: "
                                                f"{y.dtype}; CrossEntropyLoss, validation accuracy)")
    labels = np.concatenate([_labels(train), _labels(validation)])  # (each checked: no NaN, which no loss survives)
    if classes:
        one_hot = outputs > 1 and _one_hot(labels)
        return Task(features, classes, classes, f"classification into {classes} classes (--classes; labels y: "
                                                f"{'one-hot rows of ' if one_hot else ''}{y.dtype}; CrossEntropyLoss, "
                                                f"validation accuracy)", one_hot=one_hot)
    whole = bool(np.all(labels == np.round(labels)))
    if outputs == 1 and whole and (_kind(y.dtype) == "i" or task == "classification" or
                                   (labels.min() >= 0 and labels.max() < MAX_GUESSED_CLASSES)):
        if labels.min() < 0:
            raise UnusableData(f"{train}: labels y hold {labels.min():g}: class numbers run from 0 to C-1; remap "
                               f"them (e.g. -1/1 to 0/1), or train a regression with --task regression")
        count = int(labels.max()) + 1
        holding = "" if _kind(y.dtype) == "i" else ", floats holding whole numbers"
        return Task(features, count, count, f"classification into {count} classes (labels y: {y.dtype}"
                                            f"{holding}; CrossEntropyLoss, validation accuracy)")
    if outputs > 1 and _one_hot(labels):
        return Task(features, outputs, outputs, f"classification into {outputs} classes (labels y: one-hot rows of "
                                                f"{y.dtype}; CrossEntropyLoss, validation accuracy)", one_hot=True)
    if task == "classification":
        raise UnusableData(f"{train}: --task classification needs one whole number per label; labels y hold "
                           f"{'arrays of ' + str(outputs) + ' values' if outputs > 1 else 'fractions'}")
    if not whole:
        why = "real values"
    elif outputs > 1:
        why = f"arrays of {outputs} values"
    elif labels.min() < 0:
        why = f"whole numbers from {labels.min():g}, not class numbers (from 0)"
    else:
        why = f"whole numbers up to {labels.max():g}, more than {MAX_GUESSED_CLASSES} classes"
    return _regression(features, outputs, f"labels y: {y.dtype}, {why}")


def _one_hot(labels: np.ndarray) -> bool:
    """Whether every row of ``labels`` is 0s and a single 1."""
    return bool(np.all((labels == 0) | (labels == 1)) and np.all(labels.sum(axis=1) == 1))


def _regression(features: int, outputs: int, why: str) -> Task:
    return Task(features, outputs, 0, f"regression on {outputs} output{'s' if outputs > 1 else ''} "
                                      f"({why}; MSELoss, validation RMSE)")


def _labels(location: str) -> np.ndarray:
    """Every label of a split (one with samples), one pass: an array of one row per sample."""
    dataset = ShardDataset(location, batch_size=65536, shuffle=False, fields=["y"], remainder="keep",
                           rank=0, world_size=1)
    labels = np.concatenate([batch["y"].numpy().reshape(len(batch["y"]), -1) for batch in dataset])
    unusable = np.flatnonzero(~np.isfinite(labels).all(axis=1)) if labels.dtype.kind == "f" else []
    if len(unusable):
        raise UnusableData(f"{location}: {len(unusable)} label(s) y are no finite number (NaN or infinity: a missing "
                           f"value?), the first that of sample {unusable[0]} in the set's order; a loss over them is "
                           f"NaN: drop or fill those samples, and build the shards again")
    return labels
