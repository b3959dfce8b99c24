"""Store a field in another dtype than the source's (``--dtype x=float32``).

Data saved by NumPy code is often float64 where float32 is what a model trains on: casting at
build time halves the shards and the bytes every epoch reads. A cast never changes a value
beyond what the user asked for: float to a narrower float rounds (that is the point), but a
finite value that would become infinite, a float that is not a whole number cast to an
integer, an integer that does not fit, an integer that a float cannot hold exactly (float32
holds every integer only up to 2**24, float64 up to 2**53), or a bool that is not 0 or 1 is an
error naming the field, the source, the value and its row, so that it can be found in an
array of millions. Rows count from 0 in the input, before any split.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ..format.codec import check_dtype
from ..format.errors import SampleError
from ..format.tensors import resolved
from .rows import RowBlock
from .source import Source

#: What values of a NumPy kind that is no number are, in words (an error shows no ``|S643``).
_NOT_NUMBERS = {"S": "bytes (encoded files or images)", "V": "bytes (encoded files or images)", "U": "text",
                "O": "Python objects", "M": "dates", "m": "time spans", "c": "complex numbers"}
_IMAGES_HINT = " (images are decoded as they are read: make_loader(..., images={field: Images(size)}))"

#: Names a row of the block being cast as an error does: where the value is in the input (the
#: source or its file, the field and the row: ``arrays x.npy, field 'x', row 4``).
RowOf = Callable[[int], str]


def parse_dtypes(specs: Mapping[str, str]) -> dict[str, np.dtype]:
    """``{"x": "float32"}`` -> ``{"x": dtype('float32')}``; a dtype shards cannot hold is an error."""
    if not isinstance(specs, Mapping):
        raise TypeError(f"dtypes maps field names to the dtypes to store them as, e.g. {{'x': 'float32'}}, got "
                        f"{specs!r}")
    dtypes = {}
    for name, text in specs.items():
        if str(text) == "bfloat16":
            raise ValueError(f"--dtype {name}=bfloat16 (dtypes={{{name!r}: 'bfloat16'}}): a cast makes NumPy dtypes, "
                             f"which have no bfloat16; shards store the bfloat16 torch tensors written to them "
                             f"(write_shards, ShardWriter), or cast to float16 or float32 here")
        try:
            dtypes[name] = check_dtype(np.dtype(text))
        except TypeError as exc:
            raise ValueError(f"--dtype {name}={text} (dtypes={{{name!r}: {text!r}}}): {exc}") from None
    return dtypes


def cast_column(values: Any, dtype: np.dtype, where: str, row_of: RowOf) -> Any:
    """``values`` as ``dtype``: an array column as one array, a list column (samples that may
    differ in shape) value by value. ``row_of`` names a row of ``values`` in the input."""
    if isinstance(values, np.ndarray):
        return cast_array(values, dtype, where, row_of)
    # each value as a block of one row, and back: ``[0, ...]`` keeps a 0-d array an array
    return [cast_array(_as_numpy(value)[None], dtype, where, lambda row, i=i: row_of(i + row))[0, ...]
            for i, value in enumerate(values)]


def _as_numpy(value: Any) -> np.ndarray:
    """A sample's value as an array; a torch ``bfloat16`` tensor, which NumPy cannot hold, as the
    float32 array it widens to exactly."""
    if type(value).__module__ == "torch":
        tensor = resolved(value)
        return (tensor.float() if str(tensor.dtype) == "torch.bfloat16" else tensor).numpy()
    return np.asarray(value)


def cast_array(array: np.ndarray, dtype: np.dtype, where: str, row_of: RowOf) -> np.ndarray:
    """``array`` (rows along its first axis) as an array of ``dtype``, refusing a cast that
    would change a value (see the module docstring)."""
    if array.dtype == dtype:
        return array
    if array.dtype.kind not in "biuf":
        raise SampleError(f"{where}: its values are {_NOT_NUMBERS.get(array.dtype.kind, array.dtype)}, which cannot "
                          f"be cast to {dtype}: a cast is of numbers; leave this field out of --dtype (dtypes=)"
                          f"{_IMAGES_HINT if array.dtype.kind in 'SV' else ''}")
    if dtype.kind in "iub" and array.dtype.kind == "f":
        _refuse(array, ~np.isfinite(array) | (array != np.round(array)), row_of,
                f"is not a whole number; it cannot be stored as {dtype} (store it as a float)")
    if dtype.kind == "b":
        _refuse(array, (array != 0) & (array != 1), row_of, "is not 0 or 1; it cannot be stored as bool")
    with np.errstate(all="ignore"):
        out = array.astype(dtype)
    if dtype.kind == "f":
        _refuse(array, np.isfinite(array) & ~np.isfinite(out), row_of,
                f"does not fit in {dtype} (largest {np.finfo(dtype).max:g})")
        if array.dtype.kind in "iu" and not _holds_every_integer(dtype, array.dtype):
            _refuse_inexact(array, out, row_of)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        why = f"does not fit in {dtype} ({info.min} to {info.max})"
        if array.dtype.kind == "f":  # whole numbers: exact unless out of range, which the way back shows
            _refuse(array, out.astype(array.dtype) != array, row_of, why)
        elif array.size:  # integers: the extremes compared as Python ints, exact at any size
            if int(array.min()) < info.min:
                raise _changed(array, int(np.argmin(array)), row_of, why)
            if int(array.max()) > info.max:
                raise _changed(array, int(np.argmax(array)), row_of, why)
    return out


def _holds_every_integer(floats: np.dtype, integers: np.dtype) -> bool:
    """Whether every value of ``integers`` is exact in ``floats`` (NumPy's "safe" casts include
    int64 to float64, which is not)."""
    info = np.iinfo(integers)
    return info.bits - (info.min < 0) <= np.finfo(floats).nmant + 1


def _refuse_inexact(array: np.ndarray, out: np.ndarray, row_of: RowOf) -> None:
    """Refuse integers that ``out``, their cast to a float, rounded: cast back, they differ.
    A float at or above the integer type's limit (a power of two, exact in any float) cannot
    come back, whatever the platform's conversion of it makes."""
    limit = float(np.iinfo(array.dtype).max + 1)
    with np.errstate(all="ignore"):
        bad = (out.astype(array.dtype) != array) | (out >= limit)
    if bad.any():
        position = int(np.argmax(bad))
        wider = f"cast it to a wider float (float64) or keep {array.dtype}" if out.dtype.itemsize < 8 \
            else f"keep {array.dtype}"
        raise _changed(array, position, row_of,
                       f"would become {out.flat[position].item()!r} as {out.dtype}, which holds integers exactly "
                       f"only up to 2**{np.finfo(out.dtype).nmant + 1}: {wider}")


def _refuse(array: np.ndarray, bad: np.ndarray, row_of: RowOf, why: str) -> None:
    if bad.any():
        raise _changed(array, int(np.argmax(bad)), row_of, why)


def _changed(array: np.ndarray, position: int, row_of: RowOf, why: str) -> SampleError:
    """The error for the value at flat ``position`` of ``array``, naming its input row."""
    place = row_of(position // max(array.size // max(len(array), 1), 1))
    return SampleError(f"{place}: value {array.flat[position].item()!r} {why}")


class CastSource(Source):
    """The rows of ``source`` with some fields cast to other dtypes; ``first_row`` is the input
    row of the source's row 0 (a window's start), so that an error names the row to look at."""

    def __init__(self, source: Source, dtypes: Mapping[str, str], first_row: int = 0) -> None:
        self.source = source
        self.dtypes = parse_dtypes(dtypes)
        self.first_row = first_row
        self.description = source.description
        self.fixed_shape = source.fixed_shape

    def __len__(self) -> int:
        return len(self.source)

    def identity(self, digest: Any, start: int, stop: int) -> None:
        self.source.identity(digest, start, stop)

    def input_row(self, row: int) -> int:
        """The input row of ``row``. A split's subset (whose ``source_rows`` maps its rows to
        its source's) is seen through, so that a row of a training split is found in the input."""
        source_rows = getattr(self.source, "source_rows", None)
        return self.first_row + (int(source_rows(row, row + 1)[0]) if source_rows is not None else row)

    def _value_place(self, row: int, field: str) -> str:
        """Where the value of ``field`` in ``row`` is, for an error: in its file where the source
        knows it (a table's, see :meth:`Source.place`), else in the input."""
        known = self.source.place(row)
        if known is not None:
            return f"{known[0]}, field {field!r}, {known[1]}"
        return f"{self.description}, field {field!r}, row {self.input_row(row)}"

    def read(self, start: int, stop: int) -> RowBlock:
        block = self.source.read(start, stop)
        unknown = sorted(set(self.dtypes) - set(block.columns))
        if unknown:
            raise ValueError(f"--dtype names fields {unknown} that {self.description} does not have "
                             f"(it has {sorted(block.columns)})")
        columns = dict(block.columns)
        for name, dtype in self.dtypes.items():
            columns[name] = cast_column(columns[name], dtype, f"{self.description}, field {name!r}",
                                        lambda row, name=name: self._value_place(start + row, name))
        return RowBlock(columns, block.keys)

    def shard_bounds(self, shard_samples: int | None, shard_bytes: int | None, pack: int) -> list[int]:
        if getattr(self.source, "sizes", None) is None:  # fixed-size rows: measured on cast rows
            return super().shard_bounds(shard_samples, shard_bytes, pack)
        return self.source.shard_bounds(shard_samples, shard_bytes, pack)

    def window(self, start: int, stop: int) -> Source:
        """Rows ``[start, stop)``; a split's window starts at its first row's place in the
        source (see :meth:`~pipeline.write.splits.RowSubset.window`), which ``input_row`` gives."""
        first_row = self.input_row(start) if stop > start else self.first_row
        return CastSource(self.source.window(start, stop), {n: d.str for n, d in self.dtypes.items()}, first_row)

    def approx_row_bytes(self) -> int:
        return self.source.approx_row_bytes()
