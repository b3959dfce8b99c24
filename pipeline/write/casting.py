"""Store a field in another dtype than the source's (``--dtype x=float32``).

Data saved by NumPy code is often float64 where float32 is what a model trains on: casting at
build time halves the shards and the bytes every epoch reads. A cast never changes a value
beyond what the user asked for: float to a narrower float rounds (that is the point), but a
finite value that would become infinite, a float that is not a whole number cast to an
integer, an integer that does not fit, or a bool that is not 0 or 1 is an error naming the
field, the source and the value.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..format.codec import check_dtype
from ..format.errors import SampleError
from .rows import RowBlock
from .source import Source


def parse_dtypes(specs: Mapping[str, str]) -> dict[str, np.dtype]:
    """``{"x": "float32"}`` -> ``{"x": dtype('float32')}``; a dtype shards cannot hold is an error."""
    dtypes = {}
    for name, text in specs.items():
        try:
            dtypes[name] = check_dtype(np.dtype(text))
        except TypeError as exc:
            raise ValueError(f"--dtype {name}={text}: {exc}") from None
    return dtypes


def cast_column(values: Any, dtype: np.dtype, where: str) -> Any:
    """``values`` as ``dtype``: an array column as one array, a list column (samples that may
    differ in shape) value by value."""
    if isinstance(values, np.ndarray):
        return cast_array(values, dtype, where)
    return [cast_array(np.asarray(value), dtype, where) for value in values]


def cast_array(array: np.ndarray, dtype: np.dtype, where: str) -> np.ndarray:
    """``array`` as an array of ``dtype``, refusing a cast that would change a value (see the
    module docstring)."""
    if array.dtype == dtype:
        return array
    if array.dtype.kind not in "biuf":
        raise SampleError(f"{where}: values of dtype {array.dtype} cannot be cast to {dtype}")
    if dtype.kind in "iub" and array.dtype.kind == "f":
        _refuse(array, ~np.isfinite(array) | (array != np.round(array)), where,
                f"is not a whole number; it cannot be stored as {dtype} (store it as a float)")
    if dtype.kind == "b":
        _refuse(array, (array != 0) & (array != 1), where, "is not 0 or 1; it cannot be stored as bool")
    with np.errstate(all="ignore"):
        out = array.astype(dtype)
    if dtype.kind == "f":
        _refuse(array, np.isfinite(array) & ~np.isfinite(out), where,
                f"does not fit in {dtype} (largest {np.finfo(dtype).max:g})")
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        why = f"does not fit in {dtype} ({info.min} to {info.max})"
        if array.dtype.kind == "f":  # whole numbers: exact unless out of range, which the way back shows
            _refuse(array, out.astype(array.dtype) != array, where, why)
        elif array.size:  # integers: the extremes compared as Python ints, exact at any size
            low, high = int(array.min()), int(array.max())
            if low < info.min or high > info.max:
                raise SampleError(f"{where}: value {low if low < info.min else high} {why}")
    return out


def _refuse(array: np.ndarray, bad: np.ndarray, where: str, why: str) -> None:
    if bad.any():
        raise SampleError(f"{where}: value {array[bad].flat[0].item()!r} {why}")


class CastSource(Source):
    """The rows of ``source`` with some fields cast to other dtypes."""

    def __init__(self, source: Source, dtypes: Mapping[str, str]) -> None:
        self.source = source
        self.dtypes = parse_dtypes(dtypes)
        self.description = source.description
        self.fixed_shape = source.fixed_shape

    def __len__(self) -> int:
        return len(self.source)

    def read(self, start: int, stop: int) -> RowBlock:
        block = self.source.read(start, stop)
        unknown = sorted(set(self.dtypes) - set(block.columns))
        if unknown:
            raise ValueError(f"--dtype names fields {unknown} that {self.description} does not have "
                             f"(it has {sorted(block.columns)})")
        columns = dict(block.columns)
        for name, dtype in self.dtypes.items():
            columns[name] = cast_column(columns[name], dtype, f"{self.description}, field {name!r}")
        return RowBlock(columns, block.keys)

    def shard_bounds(self, shard_samples: int | None, shard_bytes: int | None, pack: int) -> list[int]:
        if getattr(self.source, "sizes", None) is None:  # fixed-size rows: measured on cast rows
            return super().shard_bounds(shard_samples, shard_bytes, pack)
        return self.source.shard_bounds(shard_samples, shard_bytes, pack)

    def window(self, start: int, stop: int) -> Source:
        return CastSource(self.source.window(start, stop), {n: d.str for n, d in self.dtypes.items()})

    def approx_row_bytes(self) -> int:
        return self.source.approx_row_bytes()
