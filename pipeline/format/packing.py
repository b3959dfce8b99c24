"""Packed records: K consecutive samples stored as columns in one record.

A 48-byte tabular sample costs a 512-byte tar header, padding to 512 bytes and a msgpack
map when stored alone; packed 256 to a record it costs about its own size. A packed record
is a msgpack map whose array fields have a leading dimension K, plus ``__rows__: K`` (so any
reader, with or without an index, knows the record is packed) and, when the writer was given
explicit keys, ``__keys__``: the K sample keys. Without ``__keys__`` the sample keys are the
record key's number plus the row, written with the same width (``000512`` -> ``000512``,
``000513``, ...); a record of another tool's whose key is no number, ``rec`` -> ``rec/0``,
``rec/1``, ...
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .codec import KEYS_FIELD, ROWS_FIELD
from .errors import SampleError
from .tensors import resolved

#: A field no record stores: the sample's key (``sample_keys``), in batches when ``fields=`` names
#: it, as webdataset names a sample's key; field names starting with ``__`` are reserved for it.
SAMPLE_KEY = "__key__"

_PYTHON_NUMBERS = {bool: np.bool_, int: np.int64, float: np.float64}


def stack_column(name: str, values: Sequence[Any], keys: Sequence[str]) -> Any:
    """Stack one field of several samples: arrays into an array, Python numbers of one type
    into an array of that type, else a list. Numbers of several types (``True`` and ``2``,
    ``1`` and ``2.5``, ``None`` among ints) stay a list, as one sample a record stores them:
    NumPy's promotion would change them (``True`` to ``1``, ints to floats)."""
    first = values[0]
    if type(first) in _PYTHON_NUMBERS:
        if any(type(value) is not type(first) for value in values):
            return list(values)
        return np.array(values, dtype=_PYTHON_NUMBERS[type(first)])  # ints: checked to fit (RowBlock.schema)
    if isinstance(first, np.ndarray) or (isinstance(first, np.generic) and not isinstance(first, np.character)) \
            or _is_tensor(first):  # (NumPy's strings are str and bytes: a list of them)
        refuse_unpackable({name: values}, keys.__getitem__)
        arrays = [np.asarray(_as_numpy(v)) for v in values]
        shape = arrays[0].shape
        for key, arr in zip(keys, arrays):
            if arr.shape != shape:
                raise SampleError(
                    f"record {key!r}, field {name!r}: shape {arr.shape} differs from {shape} "
                    f"in the same packed record (packing needs equal shapes; use pack=1, --pack 1)"
                )
        return np.stack(arrays)
    return list(values)


def _is_tensor(value: Any) -> bool:
    return type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter")


def refuse_unpackable(columns: Mapping[str, Any], key_of: Callable[[int], str]) -> None:
    """Raise, naming the sample (``key_of(row)``) and field, for a ``bfloat16`` tensor in
    ``columns`` (a column that is one, or a list holding one), which a packed record cannot hold:
    NumPy, which stacks a record's samples, has no bfloat16."""
    for name, values in columns.items():
        if isinstance(values, np.ndarray):
            continue
        if _is_tensor(values):  # a column of rows: its dtype is theirs
            row = 0 if str(values.dtype) == "torch.bfloat16" and len(values) else None
        else:
            row = next((row for row, value in enumerate(values)
                        if _is_tensor(value) and str(value.dtype) == "torch.bfloat16"), None)
        if row is not None:
            raise SampleError(f"sample {key_of(row)!r}, field {name!r}: a bfloat16 tensor, which a packed record "
                              f"cannot hold (NumPy, which stacks a record's samples, has no bfloat16): write with "
                              f"pack=1 (--pack 1), or as float32 (tensor.float())")


def _as_numpy(value: Any) -> Any:
    return resolved(value).numpy() if _is_tensor(value) else value


def packed_fields(columns: Mapping[str, Any], rows: int, keys: Sequence[str] | None) -> dict[str, Any]:
    """The map to encode for a packed record of ``rows`` rows (``keys`` only if given)."""
    fields = dict(columns)
    fields[ROWS_FIELD] = rows
    if keys is not None:
        fields[KEYS_FIELD] = list(keys)
    return fields


def record_rows(fields: Mapping[str, Any]) -> int:
    """Number of samples a decoded record holds (1 for an unpacked record)."""
    rows = fields.get(ROWS_FIELD)
    if rows is None:
        return 1
    if not isinstance(rows, int) or rows < 1:
        raise SampleError(f"packed record has an invalid {ROWS_FIELD} value {rows!r}")
    return rows


def checked_rows(fields: Mapping[str, Any]) -> int:
    """The samples a decoded record holds, once every column of a packed record is seen to hold
    that many rows (an unpacked record holds one sample, whatever its values)."""
    rows = record_rows(fields)
    if ROWS_FIELD not in fields:
        return rows
    for name, column in fields.items():
        if name in (ROWS_FIELD, KEYS_FIELD):
            continue
        try:
            length = len(column)
        except TypeError:  # a number, or a 0-d array
            length = None
        if length != rows:
            raise SampleError(f"packed record: field {name!r} has {length} rows, the record says {rows}")
    keys = fields.get(KEYS_FIELD)
    if keys is not None and (not isinstance(keys, list) or len(keys) != rows):
        raise SampleError(f"packed record: {KEYS_FIELD} holds {len(keys) if isinstance(keys, list) else keys!r} "
                          f"keys for {rows} rows")
    return rows


def sample_keys(record_key: str, fields: Mapping[str, Any]) -> list[str]:
    """The keys of the samples in a record, derived as described in the module docstring."""
    rows = record_rows(fields)
    if ROWS_FIELD not in fields:
        return [record_key]
    keys = fields.get(KEYS_FIELD)
    if keys is not None:
        if len(keys) != rows:
            raise SampleError(f"packed record {record_key!r} has {len(keys)} keys for {rows} rows")
        return [str(key) for key in keys]
    if not (record_key.isascii() and record_key.isdecimal()):
        return [f"{record_key}/{i}" for i in range(rows)]
    start, width = int(record_key), len(record_key)
    return [str(start + i).zfill(width) for i in range(rows)]


def unpack_rows(fields: Mapping[str, Any], record_key: str = "?") -> list[dict[str, Any]]:
    """Split a decoded record into its samples (for inspection and tests, not the hot path)."""
    try:
        rows = checked_rows(fields)
    except SampleError as exc:
        raise SampleError(f"record {record_key!r}: {exc}") from None
    data = {k: v for k, v in fields.items() if k not in (ROWS_FIELD, KEYS_FIELD)}
    if ROWS_FIELD not in fields:
        return [data]
    return [{name: column[i] for name, column in data.items()} for i in range(rows)]
