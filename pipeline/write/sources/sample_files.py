"""The "one file per sample" layout: ``<root>/<ID>.pt`` (or ``.npy``), a labels mapping
``{ID: label}`` and a partition ``{"train": [IDs], "validation": [IDs]}``.

Each split becomes its own shard set. Every ID is checked before anything is written: a
partition ID without a file or without a label is an error naming it, never a silent skip. A
file's contents are loaded as its shard is written: one that cannot be loaded stops the build
with an error naming it (``--resume`` goes on once it is mended). Labels are numbers, or class
names numbered by their sorted position (the names kept in the index's metadata).
``.pt`` files are read with ``torch.load(weights_only=True)``, which refuses pickled code.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ...format.errors import SampleError, explain, unloadable
from ...format.numbers import exact_array, refuse_inexact_join
from ...format.tensors import resolved
from ..rows import RowBlock, check_key, key_for_name, storable
from ..source import FileRowsSource, require_folder
from .class_list import given_classes, sorted_classes

SAMPLE_SUFFIXES = (".pt", ".npy")


def load_sample_file(path: Path) -> Any:
    """The array or tensor stored in one sample file; a file that cannot be loaded, or that holds
    something else (a dict of tensors, a string, complex numbers), is an error naming it and saying
    what to do."""
    return storable(_loaded(path), path, "save it as numbers of a dtype shards store (tensor.float(), say)")


def _loaded(path: Path) -> Any:
    """What one sample file holds, as an array (a bfloat16 tensor as it is)."""
    if path.suffix == ".npy":
        try:
            return np.load(path, allow_pickle=False)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - NumPy raises ValueError, EOFError, OSError...
            if "allow_pickle" in str(exc) and _begins_as_npy(path):
                raise SampleError(f"{path}: holds an array of Python objects, which only pickle could load: save "
                                  f"a numeric array") from None
            if "allow_pickle" in str(exc):  # (a file that is no .npy is taken for a pickle: an empty one too, NumPy 1)
                raise unloadable(path, "np.load", "it is no .npy file: it does not begin as one") from None
            raise unloadable(path, "np.load", explain(exc)) from None
    import torch

    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError, EOFError...
        raise _torch_load_failure(path, exc) from None
    if isinstance(value, torch.Tensor):  # bfloat16, which NumPy lacks, is stored as such by the codec
        if value.layout != torch.strided:
            raise SampleError(f"{path}: holds a {value.layout} tensor: save it dense (tensor.to_dense()), "
                              f"the layout shards store")
        value = resolved(value)
        if value.dtype == torch.bfloat16:
            return value
        try:
            return value.numpy()
        except TypeError:  # a dtype NumPy has not: float8, uint32 in older releases...
            raise SampleError(f"{path}: holds a tensor of dtype {value.dtype}, which shards cannot store: save it "
                              f"as a dtype NumPy has (tensor.float(), say)") from None
    if isinstance(value, (bool, int, float, np.ndarray, np.generic)):
        return value
    if isinstance(value, (list, tuple)) and any(isinstance(item, (torch.Tensor, np.ndarray)) for item in value):
        raise SampleError(f"{path}: holds a {type(value).__name__} of {len(value)} tensors or arrays, not one tensor: "
                          f"this layout stores each file's one tensor as field x (stacking them would hide which "
                          f"was which); save torch.stack(items) if they are one array, or write samples of several "
                          f"fields with pipeline.ShardWriter")
    if isinstance(value, (list, tuple)) and numeric(value):
        return exact_array(value, str(path))
    raise SampleError(f"{path}: holds a {type(value).__name__}, not a tensor: this layout stores each file's one "
                      f"tensor or array as field x and its label as y; save one tensor per file "
                      f"(torch.save(tensor, path)), or write samples of several fields with pipeline.ShardWriter")


def _begins_as_npy(path: Path) -> bool:
    with open(path, "rb") as file:
        return file.read(6) == b"\x93NUMPY"


#: How ``torch.load(weights_only=True)`` names the global it refuses to unpickle, and where its
#: message says what went wrong (its first lines say to load with ``weights_only=False``: unsafe).
_REFUSED_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|Unsupported class) ([\w.]+)")  # (the second: torch 2.3)
_UNPICKLER_ERROR = "WeightsUnpickler error:"
#: What torch's safe unpickler says of an opcode it lacks: those of newer pickle protocols.
_NEWER_PROTOCOL = re.compile(r"Unsupported operand (\d+)")


def _torch_load_failure(path: Path, exc: Exception) -> SampleError:
    """Why ``torch.load(weights_only=True)`` failed on ``path``, and what to do, in a line."""
    text = str(exc)
    operand = _NEWER_PROTOCOL.search(text)
    if operand is not None and 140 <= int(operand.group(1)) <= 152:  # (opcodes of pickle protocols 4 and 5)
        return SampleError(f"{path}: saved with pickle protocol 4 or 5 (torch.save(..., pickle_protocol=4)), which "
                           f"torch.load(weights_only=True) cannot read: save it again with the default protocol, "
                           f"then build again with --resume (resume=True)")
    refused = _REFUSED_GLOBAL.search(text)
    if refused is None:
        detail = text.split(_UNPICKLER_ERROR, 1)[1].strip().splitlines()[0] if _UNPICKLER_ERROR in text else \
            explain(exc)
        return unloadable(path, "torch.load(weights_only=True)", detail)
    if refused.group(1).startswith("numpy"):
        return SampleError(f"{path}: holds NumPy data, which torch.load(weights_only=True) refuses to unpickle: "
                           f"save the array with np.save as <ID>.npy in its place (remove this file: an ID's "
                           f".pt is read before its .npy), or as a tensor with torch.save(torch.from_numpy(array), "
                           f"path)")
    return SampleError(f"{path}: holds a pickled object ({refused.group(1)}) that torch.load(weights_only=True) "
                       f"refuses to load, as it refuses any code: save one tensor per file (torch.save(tensor, path))")


def load_mapping(value: str | os.PathLike[str] | Mapping[str, Any], what: str) -> Mapping[str, Any]:
    """A mapping given directly or as the path of a JSON file."""
    if isinstance(value, Mapping):
        return value
    if not isinstance(value, (str, os.PathLike)):
        shape = "{split: [IDs]}" if what == "partition" else "{ID: label}"
        raise TypeError(f"the {what} is a mapping {shape}, or the path of a JSON file of one, got "
                        f"{type(value).__name__} {str(value)[:60]}")
    path = Path(value)
    try:
        with open(path, encoding="utf-8") as src:
            data = json.load(src)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} file {path} does not exist") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"{what} file {path} is a folder: give the JSON file of the {what} (or, in "
                                f"Python, the dict itself)") from None
    except json.JSONDecodeError as exc:
        raise SampleError(f"{what} file {path} is not valid JSON: {exc}") from None
    except UnicodeDecodeError:  # pickle.dump and torch.save write bytes no text file starts with
        raise SampleError(f"{what} file {path} is not JSON but binary (pickle.dump or torch.save?): save the dict "
                          f"with json.dump(d, open('{path.stem}.json', 'w')) and give that, or pass the dict itself "
                          f"in Python (pipeline.build_sample_files(root, labels, partition, out) takes dicts)"
                          ) from None
    if not isinstance(data, dict):
        raise SampleError(f"{what} file {path} must hold a JSON object")
    return data


def _files_of(root: Path, sample_id: str) -> list[Path]:
    """The files an ID may name: ``<ID>.pt``, ``<ID>.npy``; one is its sample, two are an error."""
    return [path for suffix in SAMPLE_SUFFIXES if (path := root / f"{sample_id}{suffix}").is_file()]


class SampleFileSource(FileRowsSource):
    """The samples of one split: field ``x`` from each ID's file, field ``y`` its label. Files
    may hold arrays of different shapes, so ``pack="auto"`` stores one sample per record (a
    ``pack`` given packs samples of one shape)."""

    row_lists = ("ids", "keys", "paths", "labels", "sizes")

    def __init__(self, root: str | os.PathLike[str], ids: Sequence[str], labels: Mapping[str, Any],
                 split: str = "samples", fields: tuple[str, str] = ("x", "y"), listed_in: str | None = None,
                 classes: list[str] | None = None) -> None:
        self.root = Path(root)
        require_folder(self.root)
        named = f"split {split!r}" + (f" of {listed_in}" if listed_in else "")
        ids = [str(i) for i in ids]
        repeated = [i for i, n in Counter(ids).items() if n > 1]
        if repeated:
            raise SampleError(f"{named}: {len(repeated)} IDs are listed more than once, e.g. {repeated[:3]}")
        outside = [i for i in ids if not i or Path(i).is_absolute() or ".." in Path(i).parts]
        if outside:
            raise SampleError(f"{named}: {len(outside)} IDs name no file inside {self.root} (empty, absolute, or "
                              f"with '..'), e.g. {outside[:3]}; an ID is a file's path below the folder, without "
                              f"its .pt or .npy")
        no_label = [i for i in ids if i not in labels]
        if no_label:
            raise SampleError(f"{named}: {len(no_label)} IDs have no label, e.g. {no_label[:3]}")
        found = [_files_of(self.root, i) for i in ids]
        no_file = [i for i, files in zip(ids, found) if not files]
        if no_file:
            raise FileNotFoundError(
                f"{named}: {len(no_file)} IDs have no file {self.root}/<ID>.pt or .npy, "
                f"e.g. {no_file[:3]}"
            )
        both = [files[0] for files in found if len(files) > 1]
        if both:  # (a .npy saved beside a .pt that could not be loaded, say): which one is the sample?
            raise SampleError(f"{named}: {len(both)} IDs have both a .pt and a .npy file, e.g. "
                              f"{', '.join(map(str, both[:3]))} (beside {both[0].stem}.npy): keep one file per ID")
        paths = [files[0] for files in found]
        self.ids = ids
        self.keys = _keys_of(ids)
        self.paths: list[Path] = paths
        self.labels = _arrays_of_lists([labels[i] for i in ids], named)
        self.fields = fields
        self.sizes = [p.stat().st_size for p in self.paths]
        self.description = f"{split} ({self.root})"
        self.metadata = None if classes is None else {"classes": classes}

    def __len__(self) -> int:
        return len(self.ids)

    def place(self, row: int) -> tuple[str, str]:
        """A row by its ID and file (a cast's error): the names the user has, not a row number."""
        return f"{self.description}: ID {self.ids[row]!r}", f"file {self.paths[row].name}"

    def read(self, start: int, stop: int) -> RowBlock:
        x_name, y_name = self.fields
        return RowBlock({x_name: [load_sample_file(p) for p in self.paths[start:stop]],
                         y_name: self.labels[start:stop]}, self.keys[start:stop])


def _arrays_of_lists(labels: list[Any], where: str) -> list[Any]:
    """Labels that are lists (JSON's arrays: a multi-hot row) as arrays of one dtype for all (that
    of every number they hold: ``[1, 2]`` beside ``[0.5]`` is float64, ``[]`` too); others as they
    are. Lists one dtype holds only by changing values are refused (see :func:`refuse_inexact_join`)."""
    lists = [np.asarray(label) for label in labels if isinstance(label, (list, tuple))]
    if not lists:
        return labels
    refuse_inexact_join([array for array in lists if array.size], f"{where}: labels that are lists hold")
    # pairwise over the dtypes met (np.result_type takes at most 32 arguments in NumPy 1)
    met = {array.dtype for array in lists if array.size}
    dtype = functools.reduce(np.promote_types, met) if met else np.dtype(np.float64)
    return [np.asarray(label, dtype) if isinstance(label, (list, tuple)) else label for label in labels]


def _keys_of(ids: list[str]) -> list[str]:
    """Each sample's key: its ID, or, for an ID that is no key (``cats/001``, ``scan.001``), one
    made from it (``cats_001``) that no other ID is, as an image file's is made from its path."""
    taken = set()
    for sample_id in ids:
        try:
            taken.add(check_key(sample_id))
        except SampleError:
            pass
    keys = []
    for sample_id in ids:
        if sample_id not in taken:
            made = key_for_name(sample_id, taken)
            taken.add(made)
            keys.append(made)
        else:
            keys.append(sample_id)
    return keys


def _examples(ids: Sequence[str], detail: Mapping[str, str], limit: int = 5) -> str:
    shown = ", ".join(f"{i!r} ({detail[i]})" for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def check_partition(splits: Mapping[str, Sequence[Any]], labels: Mapping[str, Any],
                    partition_name: str, labels_name: str) -> None:
    """Every ID in one split only, and with a label: else an error listing the IDs (the first
    few) and the files they came from, before anything is built."""
    where: dict[str, list[str]] = {}
    for split, ids in splits.items():
        if not isinstance(ids, (list, tuple)):
            raise SampleError(f"{partition_name}: split {split!r} must be a list of IDs")
        if not ids:  # (else an empty set is written, which a build warns of as an empty input)
            raise SampleError(f"{partition_name}: split {split!r} lists no IDs: give it some, or leave it out")
        try:
            check_key(split, "split name")
        except SampleError as exc:  # the user's word for it is the partition's, not a key
            raise SampleError(f"{partition_name}: {exc}; it names the split's folder and shards "
                              f"(OUT/<split>/<split>-000000.tar): rename the split") from None
        for sample_id in ids:
            where.setdefault(str(sample_id), []).append(split)
    shared = [i for i, found in where.items() if len(set(found)) > 1]
    if shared:
        raise SampleError(f"{partition_name}: {len(shared)} IDs are in more than one split: "
                          f"{_examples(shared, {i: ', '.join(dict.fromkeys(where[i])) for i in shared})}; "
                          f"an ID may belong to one split only")
    unlabelled = [i for i in where if i not in labels]
    if unlabelled:
        raise SampleError(f"{labels_name} has no label for {len(unlabelled)} IDs of {partition_name}: "
                          f"{_examples(unlabelled, {i: f'split {where[i][0]!r}' for i in unlabelled})}")
    gaps = [i for i in where if numeric(labels[i]) and not _finite(labels[i])]
    if gaps:
        raise SampleError(f"{labels_name}: {len(gaps)} labels are not finite numbers (a gap, NaN, in a table's "
                          f"column?): {_examples(gaps, {i: repr(labels[i])[:40] for i in gaps})}; give each ID its "
                          f"label, or leave the ID out of {partition_name}")
    odd = [i for i in where if not (numeric(labels[i]) or isinstance(labels[i], str))]
    names = [i for i in where if isinstance(labels[i], str)]
    if odd or 0 < len(names) < len(where):
        shown = odd or [*names[:2], *(i for i in where if not isinstance(labels[i], str))][:4]
        raise SampleError(f"{labels_name}: a label is a number (or an array of numbers) or the name of a class, the "
                          f"same kind for every ID; {_examples(shown, {i: repr(labels[i])[:40] for i in shown})}")


def numeric(label: Any) -> bool:
    """Whether a label is a number or an array of numbers (a class, a target, a multi-hot row)."""
    if isinstance(label, (bool, int, float)):
        return True
    try:
        return np.asarray(label).dtype.kind in "biuf"
    except (TypeError, ValueError):  # a ragged list
        return False


def _floats_beside_floats(labels: dict[str, Any], ids: list[str], where: str) -> dict[str, Any]:
    """The labels of ``ids`` that are Python ints and floats (JSON's ``1`` beside ``2.5``) as
    floats, of one type in every split, as NumPy would make them: else each split's column of
    mixed ints and floats holds neither type, and a training loop gets no tensor of them."""
    if {type(labels[i]) for i in ids} == {int, float}:
        changed = next((i for i in ids if type(labels[i]) is int and float(labels[i]) != labels[i]), None)
        if changed is not None:
            raise SampleError(f"{where}: the label of {changed!r}, {labels[changed]}, would be stored as the float "
                              f"{float(labels[changed])!r} beside the labels that are fractions: give such labels "
                              f"as text (class names), or all labels as whole numbers")
        return {**labels, **{i: float(labels[i]) for i in ids}}
    return labels


def _lists_beside_lists(labels: dict[str, Any], ids: list[str], where: str) -> dict[str, Any]:
    """The labels of ``ids`` that are lists (a multi-hot row) as arrays of one dtype in every
    split: a split whose lists hold only whole numbers would else be int64 beside another's
    float64 (a soft label in it), and a loss written for the training batches fail on the
    validation ones."""
    arrays = _arrays_of_lists([labels[i] for i in ids], where)
    return labels if not any(isinstance(label, np.ndarray) for label in arrays) else {**labels, **dict(zip(ids, arrays))}


def _finite(label: Any) -> bool:
    try:
        return bool(np.isfinite(np.asarray(label, np.float64)).all())
    except OverflowError:  # an int beyond float64: a number, which storing it checks
        return True


def class_positions(labels: Mapping[str, Any], splits: Mapping[str, Sequence[str]], where: str,
                    given: list[str] | None = None) -> list[str] | None:
    """The class list when the labels of the partition's IDs are names (``"cat"``), each stored as
    its position in it: ``given``, where every label must be, else the sorted names (see
    :mod:`.class_list`); ``None`` when they are numbers."""
    ids = [str(i) for split_ids in splits.values() for i in split_ids]
    if not ids or not isinstance(labels[ids[0]], str):
        if given is not None:
            raise SampleError(f"{where}: the labels are numbers, and classes= (--classes) numbers labels that are "
                              f"class names: leave it out")
        return None
    if given is None:
        return sorted_classes((labels[i] for i in ids), where, "give the labels as numbers (2, not \"2\") to store "
                                                               "those numbers")
    known = set(given)
    unknown = next(((split, i) for split, split_ids in splits.items() for i in map(str, split_ids)
                    if labels[i] not in known), None)
    if unknown is not None:
        split, i = unknown
        raise SampleError(f"{where}: the label of ID {i!r} (split {split!r}), {labels[i]!r}, is not among the "
                          f"classes {given}")
    return given


def partition_sources(root: str | os.PathLike[str], labels: str | os.PathLike[str] | Mapping[str, Any],
                      partition: str | os.PathLike[str] | Mapping[str, Sequence[str]],
                      classes: Sequence[str] | None = None) -> dict[str, SampleFileSource]:
    """One source per split of the partition, all checked before any is built; ``classes``
    numbers labels that are class names (see :func:`.given_classes`)."""
    pinned = given_classes(classes)
    given = load_mapping(labels, "labels")
    label_map = {str(k): v for k, v in given.items()}
    if len(label_map) < len(given):  # 1 and "1" name one ID, whose label would be whichever came last
        same = Counter(map(str, given))
        twice = [key for key in given if same[str(key)] > 1]
        raise SampleError(f"{_name(labels, 'the labels mapping')}: keys {twice[:4]} name the same ID: give each ID "
                          f"one label, under one key")
    splits = load_mapping(partition, "partition")
    if not splits:
        raise SampleError(f"{_name(partition, 'the partition')} has no splits")
    partition_name, labels_name = _name(partition, "the partition"), _name(labels, "the labels mapping")
    check_partition(splits, label_map, partition_name, labels_name)
    listed = [str(i) for ids in splits.values() for i in ids]
    label_map = _lists_beside_lists(_floats_beside_floats(label_map, listed, labels_name), listed, labels_name)
    classes = class_positions(label_map, splits, labels_name, pinned)
    if classes is not None:
        position = {name: n for n, name in enumerate(classes)}
        label_map = {i: position[label_map[i]] for i in listed}  # (labels of IDs outside the partition: unused)
    return {split: SampleFileSource(root, ids, label_map, split, listed_in=partition_name, classes=classes)
            for split, ids in splits.items()}


def _name(value: Any, default: str) -> str:
    """How errors name a mapping: its file, or ``default`` when it was given as a dict."""
    return default if isinstance(value, Mapping) else str(value)
