"""Arrow columns as the columns of a :class:`~pipeline.write.rows.RowBlock`, without a Python loop
per row where Arrow's layout allows it.

- numbers and booleans -> a 1-D array (zero copy unless nulls are filled, or booleans, which
  Arrow stores as bits); timestamps, dates, times and durations -> int64 counts of their unit
  (``timestamp[ms]``: milliseconds since 1970-01-01 UTC; ``date32``: days);
- ``fixed_size_list`` of numbers (embeddings), nested to any depth -> one array of shape
  ``(rows, size, ...)``, a reshape of the flat values buffer; Arrow's fixed-shape tensors
  (``arrow.fixed_shape_tensor``, row-major) -> one array of shape ``(rows, *shape)``, the same way;
- ``list``/``large_list`` of those -> a list of arrays, one per row (views of one flat array);
  lists of such lists (``datasets``' ``Array2D`` to ``Array5D``) -> one more dimension a depth,
  where a row's lists of each depth have one length;
- strings -> ``str``, binaries -> ``bytes``.

Every other type (structs, maps, dictionaries, decimals, unions...) is refused when the source
is opened, naming the column and its type. A null anywhere in a column is an error unless a fill
value is given: then a null value becomes the fill, a null fixed-size list that many copies of
it, and a null variable-length list an empty one.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...format.errors import SampleError
from .table_list_shapes import RowShapeError, one_length, refuse_null_lists

NUMBER, FIXED, RAGGED, TEXT, BINARY = "number", "fixed", "ragged", "text", "binary"
#: lists of lists that the table's metadata gives one shape (see :func:`column_kinds`)
SHAPED = "shaped"
#: Arrow's fixed-shape tensors: a fixed-size list a row, and the shape of its values in the type
TENSOR = "tensor"
#: kinds whose rows all have the same shape, so that rows can share a packed record
FIXED_KINDS = (NUMBER, FIXED, SHAPED, TENSOR)

_TEMPORAL = (pa.types.is_timestamp, pa.types.is_date, pa.types.is_time, pa.types.is_duration)
# (the view types came with pyarrow 16)
_TEXT = tuple(getattr(pa.types, test) for test in ("is_string", "is_large_string", "is_string_view")
              if hasattr(pa.types, test))
_BINARY = tuple(getattr(pa.types, test) for test in ("is_binary", "is_large_binary", "is_fixed_size_binary",
                                                     "is_binary_view") if hasattr(pa.types, test))


def _is(type_: pa.DataType, tests: tuple) -> bool:
    return any(test(type_) for test in tests)


def _is_number(type_: pa.DataType) -> bool:
    return (pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)
            or _is(type_, _TEMPORAL))


def _is_list(type_: pa.DataType) -> bool:
    return pa.types.is_list(type_) or pa.types.is_large_list(type_)


def _is_tensor(type_: pa.DataType) -> bool:
    """Whether ``type_`` is Arrow's fixed-shape tensor (pyarrow's class: no ``pa.ExtensionType``)."""
    return getattr(type_, "extension_name", None) == "arrow.fixed_shape_tensor"


def _storage(type_: pa.DataType) -> pa.DataType:
    """What an extension type (``datasets``' ``Array2D``, once ``datasets`` is imported; a
    fixed-shape tensor) stores."""
    return type_.storage_type if isinstance(type_, pa.ExtensionType) or _is_tensor(type_) else type_


def _permuted(type_: pa.DataType) -> bool:
    """Whether a tensor type's values are stored in another order than its shape's (pyarrow itself
    disagrees with the format on what the shape then means)."""
    return _is_tensor(type_) and list(type_.permutation or []) != sorted(type_.permutation or [])


def _kind(type_: pa.DataType) -> str | None:
    if _is_tensor(type_):
        return TENSOR if not _permuted(type_) and _kind(type_.value_type) == NUMBER else None
    type_ = _storage(type_)
    if _is_number(type_):
        return NUMBER
    if pa.types.is_fixed_size_list(type_):
        return FIXED if _kind(type_.value_type) in (NUMBER, FIXED) else None
    if _is_list(type_):  # (lists of lists: a row's lists of each depth make one array, as Array2D's do)
        return RAGGED if _kind(type_.value_type) in (NUMBER, FIXED, RAGGED) else None
    if _is(type_, _TEXT):
        return TEXT
    return BINARY if _is(type_, _BINARY) else None


def column_kind(name: str, type_: pa.DataType, path: os.PathLike[str] | str) -> str:
    """How column ``name`` of ``path`` becomes a field, or an error saying it cannot."""
    kind = _kind(type_)
    if kind is None:
        raise SampleError(
            f"{path}: column {name!r} has type {type_}, which shards cannot store (supported: numbers, "
            f"booleans, timestamps and dates, strings, binaries, fixed-size or variable-length lists of "
            f"numbers, or of such lists, and Arrow fixed-shape tensors of numbers); leave it out with --columns "
            f"(columns=[...] in Python), or convert it first"
            f"{_conversion(name, type_)}"
        )
    return kind


def column_kinds(schema: pa.Schema, columns: Sequence[str], path: os.PathLike[str] | str,
                 shapes: Mapping[str, tuple[int | None, ...]]) -> dict[str, str]:
    """The kind of each of ``columns`` (see :func:`column_kind`); lists of lists that ``shapes``
    (the table's metadata) says all have one shape, as ``datasets``' ``Array2D`` do, are
    :data:`SHAPED`: one array of all rows, so that rows pack."""
    kinds = {}
    for name in columns:
        type_ = schema.field(name).type
        kinds[name] = column_kind(name, type_, path)
        depth, leaf = 0, _storage(type_)
        while _is_list(leaf):
            depth, leaf = depth + 1, leaf.value_type
        if kinds[name] == RAGGED and name in shapes and depth == len(shapes[name]) and None not in shapes[name]:
            kinds[name] = SHAPED
    return kinds


def packable(kinds: Mapping[str, str]) -> bool:
    """Whether rows of columns of ``kinds`` can share a packed record: one string (or bytes) a
    row packs as a list, as an array source's text does; only ragged lists keep a sample a record."""
    return all(kind in (*FIXED_KINDS, TEXT, BINARY) for kind in kinds.values())


def _conversion(name: str, type_: pa.DataType) -> str:
    """How to convert a column of ``type_`` into one shards can store, where there is a plain way."""
    if _permuted(type_):
        return (f": its tensors are stored in the order of permutation {list(type_.permutation)}; write them in "
                f"row-major order (numpy.ascontiguousarray before pyarrow.FixedShapeTensorArray.from_numpy_ndarray)")
    if pa.types.is_dictionary(type_):  # (pandas writes a category column so)
        return (f": a dictionary column holds its values once and a number a row; write the values (pandas: "
                f"df[{name!r}].astype(str), or .cat.codes for the numbers; pyarrow: cast the column to "
                f"{type_.value_type})")
    return ""


def signature(type_: pa.DataType) -> Any:
    """What makes two columns the same for a build: the nesting, list sizes and value type, not
    what changes nothing in the shards (the names Arrow gives list items, ``item`` or ``element``
    depending on the writer; 32- or 64-bit offsets of lists, strings and binaries)."""
    if _is_tensor(type_):
        return TENSOR, tuple(type_.shape), signature(type_.value_type)
    type_ = _storage(type_)
    if pa.types.is_fixed_size_list(type_):
        return FIXED, type_.list_size, signature(type_.value_type)
    if _is_list(type_):
        return RAGGED, signature(type_.value_type)
    kind = _kind(type_)
    return kind if kind in (TEXT, BINARY) else type_


def _leaf(type_: pa.DataType) -> pa.DataType:
    type_ = _storage(type_)
    while pa.types.is_fixed_size_list(type_) or _is_list(type_):
        type_ = type_.value_type
    return type_


def fill_value(name: str, type_: pa.DataType, value: Any) -> Any:
    """``value`` as a fill of column ``name``: checked against the column's values, so that a bad
    fill is an error when the source opens. Text columns take numbers as their text, numeric
    columns text that reads as a number (``--fill y=-1`` on the command line)."""
    leaf = _leaf(type_)
    given = value
    problem = None
    if isinstance(value, str) and pa.types.is_boolean(leaf) and value.lower() in ("true", "false"):
        value = value.lower() == "true"  # (--fill ok=false)
    elif isinstance(value, str) and not _is(leaf, _TEXT) and not _is(leaf, _BINARY):
        value = _number(value)
    if (_is(leaf, _TEXT) or _is(leaf, _BINARY)) and not isinstance(value, (str, bytes, int, float, np.number)):
        problem = "is no text, bytes or number"  # (None would be stored as the text 'None')
    elif _is(leaf, _TEXT):
        value = value if isinstance(value, str) else str(value)
    elif _is(leaf, _BINARY):
        value = value if isinstance(value, bytes) else str(value).encode()
    elif isinstance(value, (str, bytes)) or not isinstance(value, (int, float, np.integer, np.floating)):
        problem = "is not a number"
    elif pa.types.is_boolean(leaf):
        problem = None if value in (0, 1) else "is not 0 or 1"
        value = bool(value)
    elif not pa.types.is_floating(leaf):
        problem = None if float(value).is_integer() else "is not a whole number"
        value = int(value) if problem is None else value
    if problem is None:
        try:
            stored = pa.scalar(value, type=leaf)
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            problem = "does not fit"
        else:  # a float too large for the column becomes inf without a word
            if pa.types.is_floating(leaf) and math.isfinite(float(value)) and not math.isfinite(stored.as_py()):
                problem = "does not fit"
    if problem:
        kind = "true, false, 0 or 1" if pa.types.is_boolean(leaf) else (
            "a whole number of the column's unit (its values are stored so: a timestamp's since 1970)"
            if _is(leaf, _TEMPORAL) else "a value of that type")
        raise SampleError(f"the fill value {given!r} of column {name!r} {problem}; the column holds {type_}: give "
                          f"{kind}")
    return value


def _number(text: str) -> Any:
    """``"7"`` -> 7, ``"0.5"`` -> 0.5; other text stays text (and is then refused as no number)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def null_rows(array: pa.Array) -> np.ndarray:
    """Positions (sorted) of the rows of ``array`` with a null at any level of nesting; cheap when
    there is none (Arrow keeps null counts)."""
    array = _stored(array)
    rows = np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False)) if array.null_count else \
        np.zeros(0, np.int64)
    type_ = array.type
    if pa.types.is_fixed_size_list(type_) and type_.list_size:
        inner = null_rows(_fixed_values(array)) // type_.list_size
    elif _is_list(type_):
        offsets = array.offsets.to_numpy()
        inner = np.searchsorted(offsets - offsets[0], null_rows(_list_values(array, offsets)), "right") - 1
    else:
        return rows
    return np.union1d(rows, inner)


def _stored(array: pa.Array) -> pa.Array:
    return array.storage if isinstance(array, pa.ExtensionArray) else array


def _fixed_values(array: pa.FixedSizeListArray) -> pa.Array:
    """The values of the rows of ``array`` (``.values`` ignores a slice's offset)."""
    size = array.type.list_size
    return array.values.slice(array.offset * size, len(array) * size)


def _list_values(array: pa.Array, offsets: np.ndarray) -> pa.Array:
    return array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def to_columns(path: os.PathLike[str] | str, first_row: int, batch: pa.RecordBatch, kinds: Mapping[str, str],
               fill: Mapping[str, Any], shapes: Mapping[str, tuple[int | None, ...]]) -> dict[str, Any]:
    """The columns ``kinds`` of ``batch``, rows ``first_row``... of ``path``, as block columns."""
    columns = {}
    for name, kind in kinds.items():
        try:
            columns[name] = to_column(batch.column(name), kind, fill.get(name), shapes.get(name))
        except RowShapeError as wrong:
            raise SampleError(f"{path}: column {name!r}, row {first_row + wrong.row} (counting from 0 in the file): "
                              f"{wrong}, or leave the column out with --columns") from None
    return columns


def to_column(array: pa.Array, kind: str, fill: Any = None, shape: tuple[int | None, ...] | None = None) -> Any:
    """``array`` as a block column of ``kind`` (see :func:`column_kind`; ``shape`` a
    :data:`SHAPED` column's); nulls become ``fill`` (the caller has refused nulls when there is
    none)."""
    if kind == TENSOR:  # (the flat values of each row, in the shape its type gives them)
        return _fixed(_stored(array), fill).reshape(len(array), *array.type.shape)
    array = _stored(array)
    if kind == NUMBER:
        return _numbers(array, fill)
    if kind == FIXED:
        return _fixed(array, fill)
    if kind == RAGGED:
        return _ragged(array, fill, shape)
    if kind == SHAPED:
        return _shaped(array, fill, shape or ())
    if array.null_count:
        array = pc.fill_null(array, pa.scalar(fill, type=array.type))
    return array.to_pylist()


def _numbers(array: pa.Array, fill: Any) -> np.ndarray:
    if array.null_count:
        array = pc.fill_null(array, pa.scalar(fill, type=array.type))
    if _is(array.type, _TEMPORAL):
        view = array.view(pa.int64() if array.type.bit_width == 64 else pa.int32())
        return view.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return array.to_numpy(zero_copy_only=False)


def _fixed(array: pa.Array, fill: Any) -> np.ndarray:
    """Nested fixed-size lists as one array: the flat values reshaped, then null lists filled."""
    shape: list[int] = []
    null_lists = []
    level = array
    while pa.types.is_fixed_size_list(level.type):
        if level.null_count:
            null_lists.append((len(shape), level.is_null().to_numpy(zero_copy_only=False)))
        shape.append(level.type.list_size)
        level = _fixed_values(level)
    out = _numbers(level, fill).reshape(len(array), *shape)
    if null_lists:
        out = out.copy()
        for depth, mask in null_lists:
            out.reshape(-1, *shape[depth:])[mask] = fill
    return out


def _ragged(array: pa.Array, fill: Any, declared: tuple[int | None, ...] | None = None) -> list[np.ndarray]:
    """Lists of any length as one array a row, views of the flat values. Lists of lists make an
    array of one more dimension a depth, so a row's lists of one depth need one length (else
    :class:`RowShapeError`); a row with no lists has none below it (shape ``(0, 0)``), but the
    sizes the column's ``declared`` shape gives (``datasets``' ``Array2D((None, 3))``: ``(0, 3)``,
    which a batch's rows join with)."""
    flat, lo, hi, dims = _nested(array, fill)
    leaf = flat.shape[1:]
    if len(dims) == 1:
        out = [flat[a:b] for a, b in zip(lo.tolist(), hi.tolist())]
    else:
        out = [flat[a:b].reshape(*shape, *leaf)
               for a, b, *shape in zip(lo.tolist(), hi.tolist(), *(dim.tolist() for dim in dims))]
    empty = flat[:0].reshape(*(0,) * len(dims), *leaf)
    if declared is not None and len(declared) == len(dims) and None not in declared[1:]:
        empty = flat[:0].reshape(0, *declared[1:], *leaf)
        out = [empty if row.size == 0 and row.shape[:1] == (0,) else row for row in out]
    if array.null_count:
        for i in np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False)).tolist():
            out[i] = empty
    return out


def _shaped(array: pa.Array, fill: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Lists of lists whose rows all have ``shape`` as one array ``(rows, *shape)``: the flat
    values reshaped, without a copy unless a null row is filled (with copies of ``fill``)."""
    flat, lo, _, dims = _nested(array, fill)
    rows, leaf = len(array), flat.shape[1:]
    kept = ~array.is_null().to_numpy(zero_copy_only=False) if array.null_count else np.ones(rows, bool)
    found = np.stack(dims, axis=1) if rows else np.zeros((0, len(shape)), np.int64)
    # (below a dimension of size 0 there are no lists to measure)
    known = next((depth + 1 for depth, size in enumerate(shape) if size == 0), len(shape))
    wrong = np.flatnonzero(kept & (found[:, :known] != np.array(shape[:known], np.int64)).any(axis=1))
    if len(wrong):
        raise RowShapeError(int(wrong[0]), f"its shape is {tuple(found[wrong[0]].tolist())}, where the column's "
                                           f"datasets feature says {shape}; mend that row")
    if kept.all():
        return flat.reshape(rows, *shape, *leaf)
    out = np.full((rows, *shape, *leaf), fill, flat.dtype)
    size = int(np.prod(shape))
    if size:
        out[kept] = flat[lo[kept][:, None] + np.arange(size)].reshape(-1, *shape, *leaf)
    return out


def _nested(array: pa.Array, fill: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    """Lists (of lists...) of numbers: the flat values (nulls filled), each row's range of them
    (``lo``, ``hi``), and its length at each depth (one array of lengths a depth). A null row
    holds nothing, whatever its offsets span; a null list inside a row is refused (a fill
    cannot stand for a list of unknown length)."""
    rows = len(array)
    lo, hi = np.arange(rows), np.arange(1, rows + 1)  # each row's items at the current depth
    if array.null_count:
        hi = np.where(array.is_null().to_numpy(zero_copy_only=False), lo, hi)
    dims: list[np.ndarray] = []
    level: pa.Array = array
    while _is_list(level.type):
        if dims and level.null_count:
            refuse_null_lists(level, lo, hi, len(dims))
        offsets = level.offsets.to_numpy()
        dims.append(one_length(np.diff(offsets), lo, hi, len(dims)))
        lo, hi = offsets[lo] - offsets[0], offsets[hi] - offsets[0]
        level = _list_values(level, offsets)
    flat = _fixed(level, fill) if pa.types.is_fixed_size_list(level.type) else _numbers(level, fill)
    return flat, lo, hi, dims
