"""The "batches saved with joblib" layout: ``x_<B>.job`` and ``y_<B>.job`` files.

Each file holds an array, a list of per-batch arrays (concatenated), or a list of per-sample
arrays (stacked), NumPy arrays or torch tensors; what ``B`` means is told apart by
:class:`JoblibBatchSource`. joblib files are pickles: loading one can run arbitrary code, so
convert only files you trust, and each file is loaded whole into RAM (its size is the
memory a build needs per worker). The point of converting is that the shards never need
either again.
"""

from __future__ import annotations

import bisect
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ...format.errors import SampleError, explain, unloadable
from ..rows import RowBlock
from ..source import Source, span_identity

_NAME = re.compile(r"^([xy])_(\d+)\.job$")


def _load(path: Path) -> Any:
    """What one file holds, torch tensors (what a DataLoader yields, so what the recipe often
    dumps) as NumPy arrays; a file that cannot be unpickled is an error naming it."""
    try:
        import joblib
    except ImportError:
        raise ImportError("reading joblib batch files needs joblib: pip install 'pipeline[joblib]'") from None
    try:
        obj = joblib.load(path)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged pickle fails in whatever its unpickling meets
        raise unloadable(path, "joblib", explain(exc)) from None
    if isinstance(obj, (list, tuple)):
        return [_as_array(v, path) for v in obj]
    return _as_array(obj, path)


def _as_array(value: Any, path: Path) -> Any:
    """A tensor as a NumPy array (the rows of a file are joined with NumPy); anything else as it is."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    if value.dtype == torch.bfloat16:
        raise SampleError(f"{path}: holds bfloat16 tensors, which NumPy cannot hold: convert them (.float()) "
                          f"and dump them again, or write the shards with pipeline.ShardWriter")
    return value.detach().cpu().numpy()


def _label_rows(obj: Any, path: Path) -> np.ndarray:
    """Labels of one file: an array, a list of scalars, or a list of per-batch arrays."""
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, (list, tuple)) and obj:
        if all(isinstance(v, np.ndarray) and v.ndim >= 1 for v in obj):
            return np.concatenate(obj)
        return np.asarray(obj)
    raise SampleError(f"{path}: expected an array or a list of arrays, got {type(obj).__name__}")


def _batched_by(obj: Any, size: int) -> bool:
    """Whether ``obj`` is what the recipe saves for batch size ``size``: a list of batches of
    ``size`` rows each, the last one possibly shorter (when the tail was kept, not dropped)."""
    if not isinstance(obj, (list, tuple)) or not obj or not all(isinstance(v, np.ndarray) and v.ndim >= 1
                                                                for v in obj):
        return False
    return all(len(v) == size for v in obj[:-1]) and 0 < len(obj[-1]) <= size


def _feature_rows(obj: Any, rows: int, path: Path) -> np.ndarray:
    """Features of one file, matched to its ``rows`` labels."""
    if isinstance(obj, np.ndarray):
        array = obj
    elif isinstance(obj, (list, tuple)) and obj and all(isinstance(v, np.ndarray) for v in obj):
        if sum(len(v) if v.ndim else 0 for v in obj) == rows and all(v.ndim for v in obj):
            array = np.concatenate(obj)  # a list of per-batch arrays
        elif len(obj) == rows:
            array = np.stack(obj)  # a list of per-sample arrays
        else:
            raise SampleError(f"{path}: {len(obj)} arrays that add up to neither the {rows} labels "
                              f"of its y file nor one array per label")
    else:
        raise SampleError(f"{path}: expected an array or a list of arrays, got {type(obj).__name__}")
    if len(array) != rows:
        raise SampleError(f"{path}: {len(array)} feature rows but {rows} labels in its y file")
    return array


class JoblibBatchSource(Source):
    """The ``x_<B>.job``/``y_<B>.job`` pairs of a folder.

    Two layouts share these names. The recipe this project replaces saves a whole dataset as
    *one* pair whose ``B`` is the batch size, each file a list of batches of ``B`` rows (a run
    with another batch size adds another pair, with the same samples). Other code saves one
    pair per batch, ``B`` numbering them. So: a single pair, or ``batch_size=B``, converts that
    pair; several pairs whose every batch holds ``B`` rows (the last one maybe fewer) are runs
    of the recipe, refused (converting them all would give every sample twice) with a message
    naming them; other pairs are batches, converted in numeric order of ``B``.

    Opening the source loads every ``y`` file once to count rows (labels are small); a build
    then loads each ``x`` file in the task that needs it, keeping the last pair loaded.
    """

    fixed_shape = True

    def __init__(self, folder: str | os.PathLike[str], fields: tuple[str, str] = ("x", "y"),
                 batch_size: int | None = None) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            hint = " (it is a file: pass the folder that holds it)" if self.folder.is_file() else ""
            raise FileNotFoundError(f"{self.folder}: no such folder{hint}")
        found: dict[str, dict[int, Path]] = {"x": {}, "y": {}}
        for path in self.folder.iterdir():
            match = _NAME.match(path.name)
            if match:
                found[match.group(1)][int(match.group(2))] = path
        if not found["x"] and not found["y"]:
            raise FileNotFoundError(f"{self.folder}: no x_<B>.job / y_<B>.job files")
        for have, other in (("x", "y"), ("y", "x")):
            lonely = sorted(set(found[have]) - set(found[other]))
            if lonely:
                raise FileNotFoundError(f"{found[have][lonely[0]]} has no matching {other}_{lonely[0]}.job")
        numbers = sorted(found["x"])
        if batch_size is not None:
            if batch_size not in found["x"]:
                raise FileNotFoundError(f"{self.folder}: no x_{batch_size}.job / y_{batch_size}.job (there are "
                                        f"{', '.join(f'x_{b}.job' for b in numbers)})")
            numbers = [batch_size]
        labels = {b: _load(found["y"][b]) for b in numbers}
        if len(numbers) > 1 and all(_batched_by(labels[b], b) for b in numbers):
            runs = ", ".join(f"x_{b}.job/y_{b}.job ({sum(map(len, labels[b])):,} samples in batches of {b})"
                             for b in numbers)
            raise SampleError(f"{self.folder} holds several runs of the joblib batch recipe, one per batch size: "
                              f"{runs}. Each pair holds the whole dataset, so converting them all would give "
                              f"every sample more than once: choose one with --batch-size {numbers[0]} "
                              f"(batch_size={numbers[0]} in Python)")
        self.batches = numbers
        self.x_paths = [found["x"][b] for b in numbers]
        self.y_paths = [found["y"][b] for b in numbers]
        self.fields = fields
        counts = [len(_label_rows(labels[b], found["y"][b])) for b in numbers]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64).tolist()
        self.description = f"joblib batches {self.folder}"
        self._cache: tuple[int, np.ndarray, np.ndarray] | None = None
        x_bytes = sum(p.stat().st_size for p in self.x_paths)
        self._row_bytes = max(x_bytes // max(len(self), 1), 1)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": None}  # never ship a loaded batch to a worker

    def __len__(self) -> int:
        return self.starts[-1]

    def approx_row_bytes(self) -> int:
        return self._row_bytes

    def identity(self, digest: Any, start: int, stop: int) -> None:
        span_identity(digest, self.starts, self.batches.__getitem__, start, stop)

    def _batch(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if self._cache is None or self._cache[0] != i:
            labels = _label_rows(_load(self.y_paths[i]), self.y_paths[i])
            expected = self.starts[i + 1] - self.starts[i]
            if len(labels) != expected:
                raise SampleError(f"{self.y_paths[i]} changed while building: {len(labels)} rows, had {expected}")
            features = _feature_rows(_load(self.x_paths[i]), len(labels), self.x_paths[i])
            self._cache = (i, features, labels)
        return self._cache[1], self._cache[2]

    def read(self, start: int, stop: int) -> RowBlock:
        parts_x, parts_y = [], []
        i = bisect.bisect_right(self.starts, start) - 1
        while start < stop:
            features, labels = self._batch(i)
            lo, hi = start - self.starts[i], min(stop, self.starts[i + 1]) - self.starts[i]
            parts_x.append(features[lo:hi])
            parts_y.append(labels[lo:hi])
            start = self.starts[i] + hi
            i += 1
        x_name, y_name = self.fields
        return RowBlock({x_name: np.concatenate(parts_x), y_name: np.concatenate(parts_y)})
