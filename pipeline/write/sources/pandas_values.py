"""pandas objects (a DataFrame, a Series, a pandas array) as NumPy arrays, without changing a value.

pandas' own ``to_numpy()`` turns a missing value of a nullable column (``Int64``, ``Float64``,
``boolean``, ``string``, ``category``) into a float NaN, so an integer label column with one gap
becomes float64 and its gap a NaN label, silently; a nullable boolean or text column with a gap
becomes an array of objects, refused later for its first *present* value. A gap is refused here
instead, naming the column and its rows, as a null of a table column is. A NaN in a plain NumPy
float column is a value, kept as it is. pandas is imported by whoever made the object, never here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...format.errors import SampleError
from ...format.numbers import refuse_inexact_join

#: Rows of a column's gaps an error shows.
_SHOWN_ROWS = 5


def is_pandas(value: Any) -> bool:
    return type(value).__module__.startswith("pandas") and hasattr(value, "to_numpy")


def pandas_values(value: Any, where: str) -> np.ndarray:
    """The values of a DataFrame, Series or pandas array as one NumPy array: a nullable column
    without gaps as its NumPy dtype (``Int64`` as int64), beside others as their common dtype; a
    gap is an error naming ``where`` (a file, a field), the column and its rows (counted from 0),
    and saying how to fill or drop them."""
    columns = list(value.items()) if hasattr(value, "columns") else [(None, value)]
    nullable = [not isinstance(column.dtype, np.dtype) for _, column in columns]
    for (name, column), extension in zip(columns, nullable):
        if extension or column.dtype == object:
            _refuse_gaps(column, name, where)
    arrays = [_numpy_values(column) for _, column in columns]
    kinds = {array.dtype.kind for array in arrays}
    if len(arrays) > 1 and kinds <= set("iuf"):  # (pandas joins an int64 column beside a float one as float64)
        refuse_inexact_join(arrays, f"{where}: a DataFrame whose columns hold")
    if not any(nullable):
        return value.to_numpy()
    if not hasattr(value, "columns"):
        return arrays[0]
    if kinds <= set("iuf") or kinds == {"b"}:  # (booleans beside numbers: objects, refused as NumPy's columns are)
        return np.stack(arrays, axis=1).astype(np.result_type(*arrays), copy=False)
    return value.to_numpy()  # (text beside numbers: an array of objects, which the caller refuses)


def _numpy_values(column: Any) -> np.ndarray:
    """A column's values, a nullable (pandas extension) numeric one's in its NumPy dtype."""
    numpy_dtype = getattr(column.dtype, "numpy_dtype", None)
    if numpy_dtype is not None and numpy_dtype.kind in "biuf":
        return column.to_numpy(dtype=numpy_dtype)
    return column.to_numpy()


def _refuse_gaps(column: Any, name: Any, where: str) -> None:
    gaps = np.flatnonzero(np.asarray(column.isna(), dtype=bool))
    if not len(gaps):
        return
    shown = ", ".join(str(row) for row in gaps[:_SHOWN_ROWS].tolist()) + (", ..." if len(gaps) > _SHOWN_ROWS else "")
    which = "" if name is None else f"column {name!r}: "
    label = name if name is not None else getattr(column, "name", None)  # (a Series knows its column's name)
    values = "values" if label is None else f"frame[{label!r}]"
    them, rows = ("it", "that row") if len(gaps) == 1 else ("them", "those rows")
    raise SampleError(f"{where}: {which}{len(gaps)} missing value{'s' if len(gaps) > 1 else ''} ({column.dtype}), "
                      f"at {'row' if len(gaps) == 1 else 'rows'} {shown} (counting from 0): fill {them} "
                      f"({values}.fillna(VALUE)) or drop {rows} (.dropna()) first; {_why(column)}")


def _why(column: Any) -> str:
    """Why a gap is refused, for a column of its kind."""
    numpy_dtype = getattr(column.dtype, "numpy_dtype", None)
    if numpy_dtype is not None and numpy_dtype.kind in "biuf":
        return "pandas would make it a NaN, changing the column's values (and an integer column's type)"
    return "a field needs a value in every sample"


def pandas_columns(columns: Any, where: str) -> dict[Any, Any]:
    """The columns of a DataFrame (or of a mapping of arrays) as a dict, refusing names that are no
    field's (a DataFrame's numbered columns) and what a dict would
    hide or pair wrongly: two columns of one name (a dict keeps the last), and pandas Series
    whose indexes differ (rows are taken by position, so a Series reordered or filtered would pair
    each row with another row's values)."""
    if is_pandas(columns) and not hasattr(columns, "columns"):
        raise TypeError(f"{where} takes a mapping of field names to arrays, or a DataFrame; got a pandas "
                        f"{type(columns).__name__}: pass {{'y': values}} or values.to_frame()")
    names = list(columns.keys())
    repeated = sorted({str(name) for name in names if names.count(name) > 1})
    if repeated:
        raise SampleError(f"{where}: several columns are named {repeated[0]!r}: a field is one column; rename them "
                          f"(frame.columns = [...]) or leave all but one out")
    unnamed = [name for name in names if not isinstance(name, str)]
    if unnamed:
        raise SampleError(f"{where}: field {unnamed[0]!r}: a field's name is a str, not {type(unnamed[0]).__name__} "
                          f"{unnamed[0]!r}: name the arrays ({{'x': frame.to_numpy(np.float32), 'y': labels}} for a "
                          f"DataFrame of numbered feature columns)")
    indexed = [(name, value.index) for name, value in columns.items() if is_pandas(value) and hasattr(value, "index")]
    for name, index in indexed[1:]:
        if not index.equals(indexed[0][1]):
            raise SampleError(f"{where}: fields {indexed[0][0]!r} and {name!r} are pandas objects with different "
                              f"indexes, and rows are paired by position, not by index: align them first "
                              f"(pd.concat([...], axis=1), or .reset_index(drop=True) on each if their order is "
                              f"already the same)")
    return dict(columns.items())
