"""Store a field in another dtype than the source's (``--dtype x=float32``).

Data saved by NumPy code is often float64 where float32 is what a model trains on: casting at
build time halves the shards and the bytes every epoch reads. A cast never changes a value
silently beyond what the user asked for: float to a narrower float rounds (that is the point),
but float to integer needs whole numbers, and integer to a narrower integer needs values that
fit; anything else is an error naming the field, the source and the first value that does not
convert.
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


def cast_column(values: Any, dtype: np.dtype, where: str) -> np.ndarray:
    """``values`` (an array, or a list of arrays or numbers) as an array of ``dtype``."""
    array = values if isinstance(values, np.ndarray) else np.asarray(values)
    if array.dtype == object:
        raise SampleError(f"{where}: values of different shapes or types cannot be cast to {dtype}")
    if array.dtype == dtype:
        return array
    if dtype.kind in "iu":
        _check_integers(array, dtype, where)
    elif dtype.kind == "b" and array.dtype.kind != "b":
        bad = ~np.isin(array, (0, 1))
        if bad.any():
            raise SampleError(f"{where}: value {array[bad].flat[0].item()!r} is not 0 or 1; it cannot be stored as bool")
    return array.astype(dtype)


def _check_integers(array: np.ndarray, dtype: np.dtype, where: str) -> None:
    if array.dtype.kind == "f":
        bad = ~np.isfinite(array) | (array != np.round(array))
        if bad.any():
            raise SampleError(f"{where}: value {array[bad].flat[0].item()!r} is not a whole number; it cannot be "
                              f"stored as {dtype} (store it as a float)")
    if array.size:
        info = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            value = low if low < info.min else high
            raise SampleError(f"{where}: value {value.item()!r} does not fit in {dtype} ({info.min} to {info.max})")


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
