"""The "one file per sample" layout: ``<root>/<ID>.pt`` (or ``.npy``), a labels mapping
``{ID: label}`` and a partition ``{"train": [IDs], "validation": [IDs]}``.

Each split becomes its own shard set. Every ID is checked before anything is written: a
partition ID without a file or without a label is an error naming it, never a silent skip.
``.pt`` files are read with ``torch.load(weights_only=True)``, which refuses pickled code.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ...format.errors import SampleError
from ..rows import RowBlock, check_key
from ..source import FileRowsSource

SAMPLE_SUFFIXES = (".pt", ".npy")


def load_sample_file(path: Path) -> Any:
    """The array or tensor stored in one sample file."""
    if path.suffix == ".npy":
        return np.load(path, allow_pickle=False)
    import torch

    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, ...
        raise SampleError(f"{path}: cannot load with torch.load(weights_only=True): {exc}") from None
    if isinstance(value, torch.Tensor) and value.dtype != torch.bfloat16:
        return value.numpy()
    return value


def load_mapping(value: str | os.PathLike[str] | Mapping[str, Any], what: str) -> Mapping[str, Any]:
    """A mapping given directly or as the path of a JSON file."""
    if isinstance(value, Mapping):
        return value
    path = Path(value)
    try:
        with open(path, encoding="utf-8") as src:
            data = json.load(src)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise SampleError(f"{what} file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SampleError(f"{what} file {path} must hold a JSON object")
    return data


def _find_file(root: Path, sample_id: str) -> Path | None:
    for suffix in SAMPLE_SUFFIXES:
        path = root / f"{sample_id}{suffix}"
        if path.is_file():
            return path
    return None


class SampleFileSource(FileRowsSource):
    """The samples of one split: field ``x`` from each ID's file, field ``y`` its label. Files
    may hold arrays of different shapes, so ``pack="auto"`` stores one sample per record (a
    ``pack`` given packs samples of one shape)."""

    row_lists = ("ids", "paths", "labels", "sizes")

    def __init__(self, root: str | os.PathLike[str], ids: Sequence[str], labels: Mapping[str, Any],
                 split: str = "samples", fields: tuple[str, str] = ("x", "y")) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"{self.root}: no such folder")
        ids = [str(i) for i in ids]
        repeated = [i for i, n in Counter(ids).items() if n > 1]
        if repeated:
            raise SampleError(f"split {split!r}: IDs appear more than once, e.g. {repeated[:3]}")
        for sample_id in ids:
            check_key(sample_id)
        no_label = [i for i in ids if i not in labels]
        if no_label:
            raise SampleError(f"split {split!r}: {len(no_label)} IDs have no label, e.g. {no_label[:3]}")
        paths = [_find_file(self.root, i) for i in ids]
        no_file = [i for i, p in zip(ids, paths) if p is None]
        if no_file:
            raise FileNotFoundError(
                f"split {split!r}: {len(no_file)} IDs have no file {self.root}/<ID>.pt or .npy, "
                f"e.g. {no_file[:3]}"
            )
        self.ids = ids
        self.paths: list[Path] = paths  # type: ignore[assignment]
        self.labels = [labels[i] for i in ids]
        self.fields = fields
        self.sizes = [p.stat().st_size for p in self.paths]
        self.description = f"{split} ({self.root})"

    def __len__(self) -> int:
        return len(self.ids)

    def read(self, start: int, stop: int) -> RowBlock:
        x_name, y_name = self.fields
        return RowBlock({x_name: [load_sample_file(p) for p in self.paths[start:stop]],
                         y_name: self.labels[start:stop]}, self.ids[start:stop])


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
        check_key(split)
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


def partition_sources(root: str | os.PathLike[str], labels: str | os.PathLike[str] | Mapping[str, Any],
                      partition: str | os.PathLike[str] | Mapping[str, Sequence[str]]) -> dict[str, SampleFileSource]:
    """One source per split of the partition, all checked before any is built."""
    label_map = {str(k): v for k, v in load_mapping(labels, "labels").items()}
    splits = load_mapping(partition, "partition")
    if not splits:
        raise SampleError(f"{_name(partition, 'the partition')} has no splits")
    check_partition(splits, label_map, _name(partition, "the partition"), _name(labels, "the labels mapping"))
    return {split: SampleFileSource(root, ids, label_map, split) for split, ids in splits.items()}


def _name(value: Any, default: str) -> str:
    """How errors name a mapping: its file, or ``default`` when it was given as a dict."""
    return default if isinstance(value, Mapping) else str(value)
