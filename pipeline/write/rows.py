"""Blocks of rows and how they become records.

Every source hands the writer a :class:`RowBlock`: columns of equal length (NumPy arrays
for array sources, Python lists for per-file sources) plus the sample keys, or ``None``
to have keys generated from the global sample number. Records are cut from a block by
slicing, so array sources never loop in Python per sample when ``pack > 1``.
"""

from __future__ import annotations

import hashlib
import operator
import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..format.codec import check_dtype, check_field_names, encode_parts
from ..format.errors import SampleError
from ..format.index import FieldSpec, Schema, merge_spec, spec_of
from ..format.numbers import joins_exactly, outside_int64
from ..format.packing import packed_fields, stack_column

KEY_DIGITS = 12
_MAX_KEY_BYTES = 100 - len(".msgpack")
_BAD_KEY = re.compile(r"[./\\\x00-\x1f\x7f]")


def storable(array: Any, path: Any, remedy: str) -> Any:
    """``array``, if shards can store its dtype (anything not an array passes); else an error
    naming the file it came from and saying what to do, raised as the file is loaded rather
    than when a shard meets the value (named by a key the file may not know)."""
    if isinstance(array, (np.ndarray, np.generic)):
        try:
            check_dtype(array.dtype)
        except TypeError as exc:
            raise SampleError(f"{path}: {exc}; {remedy}") from None
    return array


def generated_key(index: int) -> str:
    """The key of sample number ``index`` when the user gives none."""
    return str(index).zfill(KEY_DIGITS)


def check_key(key: Any, what: str = "sample key") -> str:
    """Refuse keys that would break the ``key.ext`` grouping or escape a folder; ``what`` names
    the key in the error (a split's name is one too: it names the split's folder and shards)."""
    if not isinstance(key, str) or not key:
        raise SampleError(f"{what} {key!r} must be a non-empty string")
    if _BAD_KEY.search(key) or key.startswith("__"):
        raise SampleError(
            f"{what} {key!r} is not allowed: it may not contain '.', '/', '\\\\' or control "
            f"characters, nor start with '__'"
        )
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:  # a file name of bytes that are no UTF-8 (Linux allows any) comes as surrogates
        raise SampleError(f"{what} {key!r} is not UTF-8 text, which a tar member's name must be") from None
    if size > _MAX_KEY_BYTES:
        raise SampleError(f"{what} {key!r} is longer than {_MAX_KEY_BYTES} bytes")
    return key


def key_for_name(name: str, taken: set[str]) -> str:
    """A sample key for ``name`` (a file's path, say), unique among ``taken``: the name with what
    a key may not hold made ``_`` (``cat/0001`` -> ``cat_0001``), and where that is still no key
    (too long, one another name already gave: ``x.jpg`` beside ``x.png``) shortened and ended
    with a digest of the name. So that any file a folder holds makes a sample, as any file makes
    one in torchvision's ImageFolder, rather than the build stopping at the first odd name."""
    # a file name that is no UTF-8 (Linux allows any bytes) comes as surrogates: shown as U+FFFD
    readable = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    key = re.sub(r"^__+", "_", _BAD_KEY.sub("_", readable))
    if len(key.encode("utf-8")) <= _MAX_KEY_BYTES and key not in taken:
        return key
    head = key.encode("utf-8")[:_MAX_KEY_BYTES - 13].decode("utf-8", "ignore")
    tries = 0
    while True:  # (a digest another name gave, as x.webp's beside x.jpg and x.png: the next one)
        digest = hashlib.sha256(f"{name}#{tries}".encode("utf-8", "surrogateescape")).hexdigest()[:12]
        if f"{head}_{digest}" not in taken:
            return f"{head}_{digest}"
        tries += 1


@dataclass
class RowBlock:
    """Consecutive samples as columns; ``keys`` is ``None`` for generated keys."""

    columns: dict[str, Any]
    keys: list[str] | None = None

    def __post_init__(self) -> None:
        lengths = {name: len(col) for name, col in self.columns.items()}
        if len(set(lengths.values())) > 1:
            raise SampleError(f"fields have different numbers of rows: {lengths}")
        if not self.columns:
            raise SampleError("a sample needs at least one field")
        check_field_names(self.columns, "?")
        self._rows = next(iter(lengths.values()))
        if self.keys is not None and len(self.keys) != len(self):
            raise SampleError(f"{len(self.keys)} keys for {len(self)} rows")

    def __len__(self) -> int:
        return self._rows

    def slice(self, start: int, stop: int) -> "RowBlock":
        if start == 0 and stop >= len(self):  # (the block is never changed in place: it is its own whole slice)
            return self
        keys = None if self.keys is None else self.keys[start:stop]
        return RowBlock({n: c[start:stop] for n, c in self.columns.items()}, keys)

    @classmethod
    def from_samples(cls, samples: Sequence[Mapping[str, Any]], keys: list[str] | None) -> "RowBlock":
        """Columns (as lists) from a list of samples that all have the same fields."""
        if not samples:
            raise SampleError("no samples")
        names = list(samples[0])
        for i, sample in enumerate(samples):
            if not isinstance(sample, Mapping):
                raise SampleError(f"sample {i} is a {type(sample).__name__}, not a mapping of fields")
            if list(sample) != names:
                where = keys[i] if keys else f"#{i}"
                raise SampleError(f"record {where!r}: fields {sorted(sample)} differ from {sorted(names)}")
        return cls({name: [s[name] for s in samples] for name in names}, keys)

    @staticmethod
    def concat(blocks: Sequence["RowBlock"]) -> "RowBlock":
        """One block from several (arrays concatenated, lists joined)."""
        if len(blocks) == 1:
            return blocks[0]
        names = list(blocks[0].columns)
        for block in blocks[1:]:
            if set(block.columns) != set(names):  # (in any order: a dict's is the caller's)
                where = f"record {block.keys[0]!r}" if block.keys else "a sample"
                raise SampleError(f"{where} has fields {sorted(block.columns)}, earlier samples "
                                  f"{sorted(names)}; every sample needs the same fields")
        columns: dict[str, Any] = {}
        for name in names:
            parts = [b.columns[name] for b in blocks]
            arrays = all(isinstance(p, np.ndarray) for p in parts)
            if arrays and not joins_exactly(parts):  # (NumPy would promote uint64 beside int64 to float64: IDs changed)
                other = next(p.dtype for p in parts if p.dtype != parts[0].dtype)
                raise SampleError(f"field {name!r} has dtype {other}, earlier samples {parts[0].dtype}, which one "
                                  f"array holds only by changing values; a field needs one dtype: cast the values as "
                                  f"you write them")
            if arrays and len({p.shape[1:] for p in parts}) == 1:
                columns[name] = np.concatenate(parts)
            else:  # (rows of other shapes: each its own value)
                columns[name] = [v for p in parts for v in p]
        keys = None if blocks[0].keys is None else [k for b in blocks for k in b.keys]  # type: ignore[union-attr]
        return RowBlock(columns, keys)

    def with_numbers_as(self, schema: Schema | None) -> "RowBlock":
        """The block with each field of single numbers in one form: Python numbers (``int``,
        ``float``, ``bool``) where its first sample (in ``schema``, the earlier samples', else in
        this block) gave one, else NumPy scalars of the first's dtype, so that ``write({"y": 3})``
        goes with ``write_columns({"y": np.arange(4)})`` or ``write({"y": labels[i]})`` (a
        ``np.int64``). Only values that convert exactly and of the same kind are converted."""
        columns = dict(self.columns)
        for name, column in self.columns.items():
            first = (schema or {}).get(name)
            if first is None and len(column):
                first = spec_of(column, packed=True) if isinstance(column, np.ndarray) else spec_of(column[0])
            if first is None:
                continue
            if first.shape is None and first.dtype in _PYTHON_KINDS:
                columns[name] = _as_python_numbers(column, _PYTHON_KINDS[first.dtype])
            elif first.shape == () and isinstance(column, list) and first.dtype in _NUMPY_NUMBERS:
                columns[name] = _as_numpy_numbers(column, np.dtype(first.dtype))
        if all(map(operator.is_, columns.values(), self.columns.values())):  # (nothing converted: the block as it is)
            return self
        return RowBlock(columns, self.keys)

    def data_bytes(self) -> int:
        """Bytes of the values of the block's samples (array data, bytes and strings; 8 per
        number), without what encoding adds: what a record of them mostly holds."""
        return sum(column.nbytes if isinstance(column, np.ndarray) else sum(map(_value_bytes, column))
                   for column in self.columns.values())

    def schema(self, first: int = 0, earlier: Schema | None = None, varied: dict[str, str] | None = None) -> Schema:
        """Field specs of the block, merged into ``earlier`` (those of the samples before it):
        once per array column, per value for list columns. An error names the sample by its key,
        else by its number (the block's first is sample ``first``). ``varied`` is told, for each
        field whose shape starts to vary in the block, the sample where it does: a build names
        it, since a single odd file among samples of one shape is a likely mistake."""
        schema: Schema = {}
        for name, col in self.columns.items():
            spec = (earlier or {}).get(name)
            if isinstance(col, np.ndarray):
                schema[name] = self._merged(name, spec, spec_of(col, packed=True), 0, first, varied)
                continue
            last = None
            for i, value in enumerate(col):
                if outside_int64(value):
                    raise SampleError(f"{self._where(i, first)}, field {name!r}: {value} does not fit int64, the integers of "
                                      f"a batch's tensor; write such values as an array of np.uint64 (if they are "
                                      f"IDs under 2**64) or str")
                new = spec_of(value)
                if new is not last:  # (merging the spec of the value before again changes nothing: see merge_spec)
                    spec, last = self._merged(name, spec, new, i, first, varied), new
            schema[name] = spec
        return schema

    def _merged(self, name: str, old: FieldSpec | None, new: FieldSpec, i: int, first: int,
                varied: dict[str, str] | None) -> FieldSpec:
        if old is None or old is new:  # (merging a spec into itself changes nothing: spare the words of an error)
            return new
        merged = merge_spec(name, old, new, self._where(i, first), SampleError)  # the input's error, not an index's
        if varied is not None and name not in varied and merged.varies and not old.varies:
            varied[name] = (f"{self._where(i, first)} has shape {list(new.shape)}, the samples before it "
                            f"{list(old.shape)}")
        return merged

    def _where(self, i: int, first: int) -> str:
        return f"sample {self.keys[i]!r}" if self.keys else f"sample {first + i}"


_PYTHON_KINDS = {"bool": "b", "int": "iu", "float": "f"}  # a Python number's type, the NumPy kinds it may hold
_NUMPY_NUMBERS = {np.dtype(t).name for t in "?bhilqBHILQefd"}


def _numpy_scalar(value: Any) -> bool:
    return isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0)


def _as_python_numbers(column: Any, kinds: str) -> Any:
    """A column's NumPy scalars of ``kinds`` as Python numbers (``.item()``: exact); the column
    itself where it is a list that holds none (any other sequence a list: a ``deque`` cannot be
    sliced as a shard or a record takes its rows)."""
    if isinstance(column, np.ndarray):
        return column.tolist() if column.ndim == 1 and column.dtype.kind in kinds else column
    if type(column) is list and all(type(value) in (bool, int, float) for value in column):
        return column
    return [value.item() if _numpy_scalar(value) and value.dtype.kind in kinds else value for value in column]


def _as_numpy_numbers(column: list, dtype: np.dtype) -> list:
    """A column's Python numbers of ``dtype``'s kind as NumPy scalars of ``dtype``, those it holds exactly."""
    def converted(value: Any) -> Any:
        if type(value) not in (bool, int, float) or dtype.kind not in _PYTHON_KINDS[type(value).__name__]:
            return value
        try:
            number = dtype.type(value)
        except OverflowError:
            return value
        return number if number.item() == value or (value != value and number != number) else value  # NaN too
    return [converted(value) for value in column]


def _value_bytes(value: Any) -> int:
    if isinstance(value, (np.ndarray, np.generic)):
        return value.nbytes
    if type(value).__module__ == "torch":
        return value.numel() * value.element_size()
    return len(value) if isinstance(value, (bytes, str)) else 8


def encode_records(block: RowBlock, first_index: int, pack: int) -> Iterator[tuple[str, list, int]]:
    """``(record key, payload parts, rows)`` for each record of ``block`` (the parts are
    buffers whose concatenation is the msgpack payload); sample ``i`` of the block is sample
    number ``first_index + i`` of the dataset."""
    n = len(block)
    if pack == 1:
        names = list(block.columns)
        cols = [block.columns[name] for name in names]
        for i in range(n):
            key = generated_key(first_index + i) if block.keys is None else block.keys[i]
            yield key, encode_parts(dict(zip(names, [c[i] for c in cols])), key), 1
        return
    for start in range(0, n, pack):
        stop = min(start + pack, n)
        keys = None if block.keys is None else block.keys[start:stop]
        record_key = generated_key(first_index + start) if keys is None else keys[0]
        columns = {}
        for name, col in block.columns.items():
            if isinstance(col, np.ndarray):
                columns[name] = col[start:stop]
            else:
                columns[name] = stack_column(name, col[start:stop], keys or [record_key] * (stop - start))
        yield record_key, encode_parts(packed_fields(columns, stop - start, keys), record_key), stop - start
