"""The "batches saved with joblib" layout: ``x_<B>.job`` and ``y_<B>.job`` files.

Each file holds an array, or a list (of NumPy arrays, torch tensors, Python lists or numbers).
A list of single numbers is one label per sample; how a list of arrays is read (batches or
samples) is told in :mod:`.joblib_lists`. What ``B`` means across files is told apart by
:class:`JoblibBatchSource`. joblib files are pickles: loading one can run arbitrary code, so
convert only files you trust, and each file is loaded whole into RAM (its size is the memory a
build needs per worker). The point of converting is that the shards never need either again.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import os
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...caller_warning import warn_caller
from ...format.errors import SampleError, explain, unloadable
from ...format.numbers import exact_array, refuse_inexact_join
from ...format.tensors import resolved
from ..rows import RowBlock, storable
from ..source import Source, require_folder, span_identity
from .class_list import class_numbers, given_classes, label_file_classes
from .joblib_lists import (
    LISTS,
    LabelBatches,
    batched_by,
    features_reading,
    joined,
    list_reading,
    pair_batches,
    vectors_of,
)
from .pandas_values import is_pandas, pandas_values
from .unchanged import check_unchanged, file_version

_NAME = re.compile(r"^([xy])_(\d+)\.job$")
#: Files that may hold pickled batches: named otherwise, a warning says they are left out.
_PICKLE_SUFFIXES = (".job", ".joblib", ".pkl", ".pickle")
#: What to do with a file of values shards cannot store (Python objects, dates).
_CONVERT = "convert its values to numbers and dump it again"


def _load(path: Path) -> Any:
    """What one file holds: an array, or a list of arrays and numbers, torch tensors (what a
    DataLoader yields, so what the recipe often dumps) and Python lists (``batch.tolist()``) as
    NumPy arrays; a file that cannot be unpickled is an error naming it."""
    try:
        import joblib
    except ImportError:
        raise ImportError("reading joblib batch files needs joblib: pip install 'pipeline[joblib]'") from None
    try:
        obj = joblib.load(path)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged pickle fails in whatever its unpickling meets
        raise unloadable(path, "joblib", explain(exc), _why_unloadable(path, exc)) from None
    if isinstance(obj, (list, tuple)):
        if not obj:
            raise SampleError(f"{path}: holds an empty list, so no samples: dump the data again, or move the file "
                              f"and its x/y partner out of the folder")
        return [_as_array(v, path, i) for i, v in enumerate(obj)]
    return _as_array(obj, path)


def _why_unloadable(path: Path, exc: Exception) -> str | None:
    """What to do about a file joblib could not load, where its failure says more than damage:
    a pickle of a module this Python lacks, or a NumPy file under a joblib name."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return (f"it pickles objects of module {exc.name!r}, which this Python cannot import: install it here, or "
                f"dump the data as NumPy arrays or torch tensors")
    if isinstance(exc, AttributeError) and str(exc).startswith("Can't get attribute"):
        return ("it pickles objects of a class this Python cannot find (one defined in the script that dumped them, "
                "say): load it where that class is defined, or dump the data as NumPy arrays or torch tensors")
    try:
        with open(path, "rb") as file:
            magic = file.read(6)
    except OSError:  # (gone, or unreadable: the error says so as it is)
        return None
    if magic == b"\x93NUMPY":
        return "it is a NumPy file (np.save): load it with np.load and dump the array with joblib.dump, or build " \
               "with pipeline build arrays"
    return None


def _as_array(value: Any, path: Path, position: int | None = None) -> Any:
    """A tensor, a pandas DataFrame or Series, or a list as a NumPy array (the rows of a file are
    joined with NumPy); anything else as it is."""
    import torch

    if isinstance(value, (list, tuple)):
        try:
            return exact_array(value, str(path) if position is None else f"{path}: item {position} of its list")
        except SampleError:
            raise
        except ValueError:  # lists of lists of several lengths
            raise SampleError(f"{path}: item {position} of its list is a list of lists of different lengths; "
                              f"dump it as an array, or as a list of arrays") from None
    if is_pandas(value):  # a DataFrame or Series
        return pandas_values(value, str(path) if position is None else f"{path}: item {position} of its list")
    if not isinstance(value, torch.Tensor):
        return value
    if value.dtype == torch.bfloat16:
        raise SampleError(f"{path}: holds bfloat16 tensors, which NumPy cannot hold: convert them (.float()) "
                          f"and dump them again, or write the shards with pipeline.ShardWriter")
    return resolved(value).numpy()


def _label_rows(obj: Any, path: Path, reading: str | None, classes: list[str] | None = None) -> np.ndarray:
    """Labels of one file, read as :func:`list_reading` said: class names (``"cat"``, one a
    sample) as their positions in ``classes`` (left as names when ``classes`` is not known yet)."""
    if reading is None:
        rows = obj if isinstance(obj, np.ndarray) else _not_arrays(obj, path)
    else:
        rows = joined(obj, path, reading)
    if not _class_names(rows, path):
        return storable(rows, path, _CONVERT)
    if classes is None:
        return rows
    positions, unknown = class_numbers(rows, classes)
    if len(unknown):
        raise SampleError(f"{path} changed while building: label {unknown[0]} ({rows[unknown[0]]!r}) is no class "
                          f"it had ({', '.join(map(repr, classes[:5]))}...)")
    return positions


def _class_names(rows: np.ndarray, path: Path) -> bool:
    """Whether labels are class names, one string a sample (a NumPy string array, or an object
    array of ``str``, as pandas holds them); a column of strings of another shape is refused."""
    if rows.dtype.kind not in "UO":
        return False
    if rows.dtype.kind == "O":
        other = [row for row, value in enumerate(rows.flat) if type(value) is not str]
        if len(other) == rows.size:
            return False
        if other:  # names with a gap (None, NaN from pandas) or a number among them
            raise SampleError(f"{path}: label {other[0]} is {type(rows.flat[other[0]]).__name__} "
                              f"{rows.flat[other[0]]!r} among class names: give every sample a name")
    if rows.ndim != 1:
        raise SampleError(f"{path}: labels of shape {list(rows.shape)} are strings: give one class name a sample, "
                          f"or {_CONVERT}")
    return True


def _not_arrays(obj: Any, path: Path) -> np.ndarray:
    raise SampleError(f"{path}: expected an array or a list, got {type(obj).__name__}")


def _feature_rows(obj: Any, rows: int, path: Path, reading: str | None, number: int, told: str | None = None,
                  labels_either: bool = False, label_batches: LabelBatches | None = None) -> np.ndarray:
    """Features of one file, matched to its ``rows`` labels: a list read as ``told`` (the
    ``lists`` given), else as :func:`features_reading` says. Batches beside batches of labels
    (``label_batches``) must pair up one by one: equal totals alone would let a batch of one row
    more beside one of a row less give every sample between them another's label."""
    if isinstance(obj, np.ndarray):
        array = obj
    elif isinstance(obj, list):
        features_read = told or features_reading(obj, rows, path, reading, number, labels_either)
        if features_read == "batches" and label_batches is not None:
            pair_batches([len(batch) for batch in obj], path, label_batches)
        array = joined(obj, path, features_read)
    else:
        _not_arrays(obj, path)
    if len(array) != rows:
        raise SampleError(f"{path}: {len(array)} feature rows but {rows} labels in its y file")
    return storable(array, path, _CONVERT)


def _numbered_files(folder: Path) -> dict[str, dict[int, Path]]:
    """The ``x_<B>.job`` and ``y_<B>.job`` files of ``folder`` by field and number. Two names of
    one number (``x_0.job`` and ``x_00.job``) are refused: keeping either, in the order the folder
    lists them, would drop a batch or pair one file's features with the other's labels."""
    found: dict[str, dict[int, Path]] = {"x": {}, "y": {}}
    for path in sorted(folder.iterdir()):
        match = _NAME.match(path.name)
        if match:
            other = found[match.group(1)].setdefault(int(match.group(2)), path)
            if other != path:
                raise SampleError(f"{other} and {path} both number batch {int(match.group(2))}: move one of "
                                  f"them (and its {'y' if match.group(1) == 'x' else 'x'} partner) out of the folder")
    return found


def _warn_of_gaps(folder: Path, numbers: list[int]) -> None:
    """Warn of numbered batches missing between others (``x_0``, ``x_1``, ``x_3``: no ``x_2``),
    counted by the step the numbers take (``x_0``, ``x_1000``, ``x_3000`` miss ``x_2000``): a pair
    deleted, or a dump loop that failed once and went on, would otherwise pass unseen. Numbers
    that follow no step (more missing than there are) are no sequence, and pass."""
    if len(numbers) < 3:
        return
    step = math.gcd(*(b - a for a, b in zip(numbers, numbers[1:])))
    if (numbers[-1] - numbers[0]) // step + 1 - len(numbers) > len(numbers) // 2:
        return
    missing = sorted(set(range(numbers[0], numbers[-1] + 1, step)) - set(numbers))
    if missing:
        shown = ", ".join(f"x_{b}.job/y_{b}.job" for b in missing[:4]) + (", ..." if len(missing) > 4 else "")
        warn_caller(f"{folder}: the pairs are numbered {numbers[0]} to {numbers[-1]}, but {shown} "
                    f"{'is' if len(missing) == 1 else 'are'} missing ({len(missing)} of {len(missing) + len(numbers)}): "
                    f"a batch lost? The build converts the {len(numbers)} pairs it finds; put back the missing ones "
                    f"first if they exist")


class JoblibBatchSource(Source):
    """The ``x_<B>.job``/``y_<B>.job`` pairs of a folder.

    Two layouts share these names. The recipe this project replaces saves a whole dataset as
    *one* pair whose ``B`` is the batch size, each file a list of batches of ``B`` rows (a run
    with another batch size adds another pair, with the same samples). Other code saves one
    pair per batch, ``B`` numbering them. So: a single pair, or ``batch_size=B``, converts that
    pair; several pairs whose every batch holds ``B`` rows (the last one maybe fewer) are runs
    of the recipe, refused (converting them all would give every sample twice) with a message
    naming them; other pairs are batches, converted in numeric order of ``B``, unless two of
    them hold the same samples (the recipe's pairs holding one array each: refused alike).
    ``lists`` says how a list of arrays whose lengths are no batches of ``B`` is read (see
    :func:`list_reading`); ``classes`` numbers labels that are class names (see :func:`.given_classes`).

    Opening the source loads every ``y`` file once to count rows (labels are small); a build
    then loads each ``x`` file in the task that needs it, keeping the last pair loaded.
    """

    fixed_shape = True

    def __init__(self, folder: str | os.PathLike[str], fields: tuple[str, str] = ("x", "y"),
                 batch_size: int | None = None, lists: str | None = None, classes: Sequence[str] | None = None) -> None:
        if lists not in (None, *LISTS):
            raise ValueError(f"lists must be one of {', '.join(LISTS)}, got {lists!r}")
        if isinstance(fields, str) or len(fields) != 2 or not all(isinstance(name, str) and name for name in fields) \
                or fields[0] == fields[1]:  # (one name: the labels would be written over the features)
            raise ValueError(f"fields names the two fields of a pair, its features' and its labels', two different "
                             f"names, e.g. ('x', 'y'), got {fields!r}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ValueError(f"batch_size is the B of the x_<B>.job files to read, a whole number >= 1, got "
                             f"{batch_size!r}")
        given = given_classes(classes)
        self.folder = Path(folder)
        require_folder(self.folder)
        found = _numbered_files(self.folder)
        if not found["x"] and not found["y"]:
            others = sorted(entry.name for entry in os.scandir(self.folder) if not entry.name.startswith("."))
            shown = f"it holds {', '.join(others[:5])}{', ...' if len(others) > 5 else ''}" if others else "it is empty"
            raise FileNotFoundError(f"{self.folder}: no x_<B>.job / y_<B>.job files ({shown}); files of another layout "
                                    f"(one (X, y) tuple or dict per file, say): load them in Python and write their "
                                    f"arrays with pipeline.write_shards(out, {{'x': X, 'y': y}}), or, a batch at a "
                                    f"time, ShardWriter(out).write_columns({{'x': X, 'y': y}})")
        unread = [path.name for path in sorted(self.folder.iterdir())
                  if path.suffix in _PICKLE_SUFFIXES and not _NAME.match(path.name)]
        if unread:
            warn_caller(f"{self.folder}: {', '.join(unread[:4])}{', ...' if len(unread) > 4 else ''} are not named "
                        f"x_<B>.job / y_<B>.job, and are not read; to convert them, move them to a folder of their own "
                        f"as x_<B>.job / y_<B>.job (another split, say), or rename them here (a number of their own)")
        chosen = set(found["x"]) | set(found["y"]) if batch_size is None else {batch_size}
        for have, other in (("x", "y"), ("y", "x")):
            lonely = sorted(b for b in chosen & set(found[have]) if b not in found[other])
            if lonely:
                path = found[have][lonely[0]]
                raise FileNotFoundError(f"{path} has no matching {other}_{lonely[0]}.job: put that file beside it, or "
                                        f"move {path.name} out of {self.folder}"
                                        f"{'' if batch_size is not None else ' (or convert one pair: --batch-size B)'}")
        numbers = sorted(found["x"])
        if batch_size is not None:
            if batch_size not in found["x"]:
                raise FileNotFoundError(f"{self.folder}: no x_{batch_size}.job / y_{batch_size}.job (there are "
                                        f"{', '.join(f'x_{b}.job' for b in numbers)})")
            # numbered from 0 (no run of the recipe has batches of 0), or 1, 2, 3, ... and not each a list of
            # batches of its number: batches, not runs
            if 0 in found["x"] or (len(numbers) > 2 and numbers == list(range(1, len(numbers) + 1))
                                   and not all(batched_by(_load(found["y"][b]), b) for b in numbers)):
                raise ValueError(f"{self.folder}: its files are numbered one per batch (x_{numbers[0]}.job to "
                                 f"x_{numbers[-1]}.job), and are joined in numeric order: leave out --batch-size "
                                 f"(batch_size=), which picks one run of the joblib batch recipe (x_{batch_size}.job "
                                 f"alone: {len(numbers) - 1} pairs of {len(numbers)} left out)")
            numbers = [batch_size]
        versions = {b: (file_version(found["x"][b]), file_version(found["y"][b])) for b in numbers}  # (before reading)
        labels = {b: _load(found["y"][b]) for b in numbers}
        if len(numbers) > 1 and all(batched_by(labels[b], b) for b in numbers):
            runs = ", ".join(f"x_{b}.job/y_{b}.job ({sum(map(len, labels[b])):,} samples in batches of {b})"
                             for b in numbers)
            raise SampleError(f"{self.folder} holds several runs of the joblib batch recipe, one per batch size: "
                              f"{runs}. Each pair holds the whole dataset, so converting them all would give "
                              f"every sample more than once: choose one with --batch-size {numbers[0]} "
                              f"(batch_size={numbers[0]} in Python)")
        if batch_size is None:
            _warn_of_gaps(self.folder, numbers)
        self.batches = numbers
        self.x_paths = [found["x"][b] for b in numbers]
        self.y_paths = [found["y"][b] for b in numbers]
        self.versions = [versions[b] for b in numbers]
        self.fields = fields
        self.lists = lists
        self.readings = [list_reading(labels[b], b, found["y"][b], lists) for b in numbers]
        self.labels_either = [lists is None and reading == "batches" and vectors_of(labels[b], b)
                              for b, reading in zip(numbers, self.readings)]
        self.label_batches = [LabelBatches([len(v) for v in labels[b]], found["y"][b]) if reading == "batches"
                              else None for b, reading in zip(numbers, self.readings)]
        rows = [_label_rows(labels[b], found["y"][b], reading) for b, reading in zip(numbers, self.readings)]
        self.classes = label_file_classes(rows, self.y_paths, given)
        if self.classes is not None:
            self.metadata = {"classes": self.classes}
            rows = [_label_rows(r, p, None, self.classes) for r, p in zip(rows, self.y_paths)]
        self._refuse_copies(rows)
        counts = [len(r) for r in rows]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64).tolist()
        self.description = f"joblib batches {self.folder}"
        self._cache: tuple[int, np.ndarray, np.ndarray] | None = None
        x_bytes = sum(p.stat().st_size for p in self.x_paths)
        self._row_bytes = max(x_bytes // max(len(self), 1), 1)

    def _refuse_copies(self, labels: list[np.ndarray]) -> None:
        """Refuse two pairs that hold the same samples: runs of the recipe that dumped the whole
        dataset as one array per file, which nothing else tells from numbered batches. Only the
        features of pairs whose labels are the same are loaded to compare (a label file is
        small, a feature file is not: each is let go once its digest is taken)."""
        by_labels: dict[tuple, list[int]] = {}
        for i, rows in enumerate(labels):
            by_labels.setdefault((rows.shape, rows.dtype.str, rows.tobytes()), []).append(i)
        for same in (group for group in by_labels.values() if len(group) > 1):
            seen: dict[tuple, int] = {}
            for i in same:
                features = self._features(i, len(labels[i]))
                digest = hashlib.sha256(np.ascontiguousarray(features)).hexdigest()
                first = seen.setdefault((features.shape, features.dtype.str, digest), i)
                del features
                if first != i:
                    a, b = self.batches[first], self.batches[i]
                    raise SampleError(f"x_{a}.job/y_{a}.job and x_{b}.job/y_{b}.job in {self.folder} hold the same "
                                      f"{len(labels[i]):,} samples: runs of the joblib batch recipe with batch sizes "
                                      f"{a} and {b}? Converting both would give every sample twice: choose one "
                                      f"with --batch-size {a} (batch_size={a} in Python)")

    def _features(self, i: int, rows: int) -> np.ndarray:
        """The features of pair ``i``, matched to its ``rows`` labels (see :func:`_feature_rows`)."""
        return _feature_rows(_load(self.x_paths[i]), rows, self.x_paths[i], self.readings[i], self.batches[i],
                             self.lists, self.labels_either[i], self.label_batches[i])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": None}  # never ship a loaded batch to a worker

    def __len__(self) -> int:
        return self.starts[-1]

    def approx_row_bytes(self) -> int:
        return self._row_bytes

    def identity(self, digest: Any, start: int, stop: int) -> None:
        """The batches and rows of ``[start, stop)``, and the class names their labels number (a
        name added since shifts every number: a resume then writes every shard again)."""
        span_identity(digest, self.starts, self.batches.__getitem__, start, stop)
        digest.update(repr(self.classes).encode())

    def _batch(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if self._cache is None or self._cache[0] != i:
            labels = _label_rows(_load(self.y_paths[i]), self.y_paths[i], self.readings[i], self.classes)
            expected = self.starts[i + 1] - self.starts[i]
            if len(labels) != expected:
                raise SampleError(f"{self.y_paths[i]} changed while building: {len(labels)} rows, had {expected}")
            features = self._features(i, len(labels))
            for path, version in zip((self.x_paths[i], self.y_paths[i]), self.versions[i]):
                check_unchanged(path, version)  # (after the loads: a change before or during them shows)
            self._cache = (i, features, labels)
        return self._cache[1], self._cache[2]

    def read(self, start: int, stop: int) -> RowBlock:
        parts_x, parts_y = [], []
        i = first = bisect.bisect_right(self.starts, start) - 1
        while start < stop:
            features, labels = self._batch(i)
            lo, hi = start - self.starts[i], min(stop, self.starts[i + 1]) - self.starts[i]
            parts_x.append(features[lo:hi])
            parts_y.append(labels[lo:hi])
            start = self.starts[i] + hi
            i += 1
        x_name, y_name = self.fields
        for parts, paths in ((parts_x, self.x_paths), (parts_y, self.y_paths)):
            refuse_inexact_join(parts, f"{self.folder}: files {paths[first].name} to {paths[i - 1].name} hold")
        return RowBlock({x_name: _joined(parts_x), y_name: _joined(parts_y)})


def _joined(parts: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """The rows of consecutive files' batches: one array, or, where the files' samples differ in
    shape (batches padded each to its own longest sequence), a list of the samples, as a read
    within one file gives them to a field whose shape varies."""
    if len({part.shape[1:] for part in parts}) == 1:
        return np.concatenate(parts)
    return [row for part in parts for row in part]
