"""How a list in a joblib batch file is read: each array a batch of samples (joined), or one
sample (stacked). A list of labels is read as batches where its lengths say so (batches of the
``B`` in the file's name), a list of features as its labels were where that fits; where both
readings fit and nothing tells them apart, guessing wrong would silently make one sample of each
batch, or a sample of each row of each label, so the build asks (``lists="batches"`` or
``"samples"``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import numpy as np

from ...format.errors import SampleError
from ...format.numbers import refuse_inexact_join

#: How a list of arrays is read: each array a batch of samples (joined), or one sample (stacked).
LISTS = ("batches", "samples")


def batched_by(obj: Any, size: int) -> bool:
    """Whether ``obj`` is what the recipe saves for batch size ``size``: a list of batches of
    ``size`` rows each, the last one possibly shorter (when the tail was kept, not dropped)."""
    if not isinstance(obj, list) or not all(np.ndim(v) >= 1 for v in obj):
        return False
    return all(len(v) == size for v in obj[:-1]) and 0 < len(obj[-1]) <= size


def vectors_of(arrays: list, width: int) -> bool:
    """Whether every array of ``arrays`` holds ``width`` values in one axis: batches of
    ``width`` labels, or as well one sample's label array each."""
    return all(np.ndim(v) == 1 and len(v) == width for v in arrays)


def list_reading(labels: Any, number: int, path: Path, lists: str | None) -> str | None:
    """How the list in ``path`` (a y file, ``number`` the B of its name) is read: ``"batches"``
    or ``"samples"``; ``None`` for an array. A list of arrays whose lengths do not give it away
    is read as ``lists`` says, else refused with both readings."""
    if not isinstance(labels, list):
        return None
    single = [np.ndim(v) == 0 for v in labels]
    if all(single):
        return "samples"
    if any(single):
        raise SampleError(f"{path}: its list holds single numbers (item {single.index(True)}) and arrays "
                          f"(item {single.index(False)}); dump one label per sample, or one array per batch")
    if lists is not None:
        return lists
    if batched_by(labels, number):
        return "batches"
    batches = (f"--lists batches (lists='batches': {sum(map(len, labels))} samples, each array a batch of them)")
    shapes = {np.shape(v) for v in labels}
    if len(shapes) > 1:
        raise SampleError(f"{path}: a list of {len(labels)} arrays whose lengths are not batches of {number} (the "
                          f"number in its name, if it is their batch size): if they are batches, say so with "
                          f"{batches}; if each is one sample's labels, of several shapes (a sequence each), write "
                          f"them with pipeline.ShardWriter, which takes samples of any shape")
    raise SampleError(f"{path}: a list of {len(labels)} arrays whose lengths are not batches of {number} (the "
                      f"number in its name, if it is their batch size), so they may be batches or samples: say "
                      f"which with {batches} or --lists samples (lists='samples': {len(labels)} samples, labels of "
                      f"shape {shapes.pop()})")


def joined(arrays: list, path: Path, reading: str) -> np.ndarray:
    """A list of arrays as one: stacked (samples) or joined (batches), refused with the shapes
    that differ."""
    shapes = {np.shape(v) if reading == "samples" else np.shape(v)[1:] for v in arrays}
    if len(shapes) > 1 or (reading == "batches" and not all(np.ndim(v) for v in arrays)):
        what, each = ("samples", "sample") if reading == "samples" else ("batches (past their first axis)", "batch")
        raise SampleError(f"{path}: its list holds {what} of different shapes: {sorted(map(list, shapes))[:3]}; "
                          f"every {each} needs the same shape here; samples of different shapes (sequences of "
                          f"several lengths) can be written with pipeline.ShardWriter, one write() a sample")
    refuse_inexact_join(arrays, f"{path}: its list holds")
    return np.stack(arrays) if reading == "samples" else np.concatenate(arrays)


def features_reading(arrays: list, rows: int, path: Path, labels_reading: str | None, number: int,
                     labels_either: bool = False) -> str:
    """How a list of feature arrays beside ``rows`` labels is read (``number`` the B of the
    file's name): as its labels were, where that fits (a list of labels one a sample: one array
    a sample, also of one row each, as per-sample images of shape (1, H, W) are), else batches
    if their rows add up to the labels, else one array a label. Refused, asking for ``lists``,
    where both fit and nothing tells them apart: arrays of one row each beside an array of
    labels, or named as batches of one (``x_1.job``); and arrays of ``number`` values beside
    labels read as batches of that many that could as well be one array of that many labels a
    sample (``labels_either``: one-hot rows as wide as the batch size in the file's name)."""
    one_each = len(arrays) == rows
    joinable = all(np.ndim(v) >= 1 for v in arrays) and sum(map(len, arrays)) == rows
    if labels_reading == "batches":
        if labels_either and vectors_of(arrays, number):
            _ask(path, f"{len(arrays)} arrays of {number} values, beside as many label arrays of {number} values",
                 f"{rows} samples of one value each", f"{len(arrays)} samples of {number} values, whose labels are "
                 f"arrays (one-hot rows, tags)")
        return "batches"
    if one_each and (labels_reading == "samples" and number != 1 or not joinable):
        return "samples"
    if joinable and not one_each:
        return "batches"
    if joinable:
        beside = "beside an array of labels" if labels_reading is None else "named as batches of one"
        _ask(path, f"{rows} arrays of one row each, {beside}", f"{rows} samples of shape "
             f"{list(np.shape(arrays[0])[1:])}", f"{rows} samples of shape {list(np.shape(arrays[0]))}")
    raise SampleError(f"{path}: {len(arrays)} arrays that add up to neither the {rows} labels "
                      f"of its y file nor one array per label")


def _ask(path: Path, what: str, as_batches: str, as_samples: str) -> NoReturn:
    raise SampleError(f"{path}: {what}: each array may be a batch or a sample, and guessing wrong would change "
                      f"every sample's shape; say which with --lists batches (lists='batches': {as_batches}) or "
                      f"--lists samples (lists='samples': {as_samples})")


class LabelBatches(NamedTuple):
    """The rows of each batch of a y file read as a list of batches, and the file."""

    rows: list[int]
    path: Path


def pair_batches(feature_rows: list[int], path: Path, labels: LabelBatches) -> None:
    """Refuse batches of features that do not pair up with the batches of labels, naming the first."""
    if feature_rows == labels.rows:
        return
    if len(feature_rows) != len(labels.rows):
        raise SampleError(f"{path} holds {len(feature_rows)} batches, {labels.path} {len(labels.rows)}: each batch of "
                          f"features needs its batch of labels; {_REPAIR}")
    k = next(k for k, (a, b) in enumerate(zip(feature_rows, labels.rows)) if a != b)
    raise SampleError(f"{path}: batch {k} holds {feature_rows[k]} rows, batch {k} of {labels.path} {labels.rows[k]} "
                      f"labels (counting from 0): the batches do not pair up, so samples would get other samples' "
                      f"labels; {_REPAIR}")


_REPAIR = ("dump the two files from the same batches (if both hold the same samples in order, only cut otherwise, "
           "dump each as one array: np.concatenate(batches))")
