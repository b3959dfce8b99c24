"""Python numbers made a NumPy array only where the array holds every one exactly.

NumPy promotes a list of ints that do not all fit int64 (an ID of 2**64 - 1 beside a 7) to
float64, and ints beside floats to floats: past 2**53 such a float is another number, silently.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Union

import numpy as np

from .errors import SampleError

_EXACT_IN_FLOAT64 = 1 << 53
#: A whole number, Python's or NumPy's: what a seed or a count takes (see :func:`is_whole`).
WholeNumber = Union[int, np.integer]
#: A fraction of the samples or a number of them, Python's or NumPy's: what ``validation=`` takes.
SplitSize = Union[float, int, np.integer, np.floating]


def outside_int64(value: Any) -> bool:
    """Whether ``value`` is a Python ``int`` that int64, the integers of a batch's tensor, cannot hold."""
    return type(value) is int and not -(1 << 63) <= value < (1 << 63)


def is_whole(value: Any) -> bool:
    """Whether ``value`` is an integer, Python's or NumPy's, and not a bool (which Python counts
    as one): what an option that takes a count, a seed or a size accepts."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


#: Kinds of NumPy dtypes whose values join without changing type: signed and unsigned ints.
_KIND_GROUPS = {"u": "i"}


def inexact_int(values: Iterable[Any], numbers: np.ndarray) -> int | None:
    """An int of ``values`` that ``numbers`` (their array) does not hold exactly, if any."""
    finite = numbers[np.isfinite(numbers)] if numbers.dtype.kind == "f" else numbers  # (no int is NaN or infinite)
    if numbers.dtype.kind != "f" or not finite.size or np.abs(finite).max() < _EXACT_IN_FLOAT64:
        return None  # (every value below 2**53, a float's ints, held exactly: no value need be looked at;
    # 2**53 itself may be 2**53 + 1 rounded)
    return next((v for v in values if type(v) is int and not -_EXACT_IN_FLOAT64 <= v <= _EXACT_IN_FLOAT64), None)


def joins_exactly(arrays: Iterable[np.ndarray], ints_as_floats: bool = False) -> bool:
    """Whether the arrays, concatenated, keep every value as it is: not where they differ in kind
    (an int column joined to a float one would make its ints floats, booleans ints; with
    ``ints_as_floats``, where whole numbers beside fractions may be stored as floats, ints join
    floats where the float holds each exactly), and int64 joined to uint64, which NumPy joins as
    float64, only where the float holds every int exactly."""
    arrays = list(arrays)
    dtypes = {array.dtype for array in arrays}
    if len(dtypes) == 1:
        return True
    kinds = {_KIND_GROUPS.get(dtype.kind, dtype.kind) for dtype in dtypes}
    if len(kinds - {"i"} if ints_as_floats and "f" in kinds else kinds) > 1:
        return False
    joined = np.result_type(*dtypes)
    if joined.kind != "f":
        return True
    limit = 1 << (np.finfo(joined).nmant + 1)
    return all(array.dtype.kind not in "iu" or not array.size or -limit <= int(array.min()) and int(array.max()) <= limit
               for array in arrays)


def refuse_inexact_join(arrays: list, where: str) -> None:
    """Refuse arrays that one array holds only by changing values (NumPy joins uint64 beside int64
    as float64, 2**53 + 1 beside 0.5 as 2**53), naming their dtypes; whole numbers beside
    fractions are stored as floats where that keeps them."""
    if not joins_exactly([np.asarray(array) for array in arrays], ints_as_floats=True):
        dtypes = sorted({str(np.asarray(array).dtype) for array in arrays})
        raise SampleError(f"{where} arrays of {', '.join(dtypes)} whose values one array would change (integers "
                          f"beyond what a float holds exactly, booleans beside numbers): save them all with one dtype")


def exact_array(values: list | tuple, where: str) -> np.ndarray:
    """Nested lists of numbers as the array NumPy makes of them, refused where it holds one of
    their ints as another number (``[2**53 + 1, 0.5]``: a float64 of 2**53)."""
    numbers = np.asarray(values)
    changed = inexact_int(_leaves(values), numbers)
    if changed is not None:
        raise SampleError(f"{where}: the integer {changed} beside other numbers would be stored as the float "
                          f"{float(changed)!r}; save such numbers as an array of int64 or uint64, or as text")
    return numbers


def _leaves(values: Iterable[Any]) -> Iterator[Any]:
    """The items of nested lists."""
    for item in values:
        if isinstance(item, (list, tuple)):
            yield from _leaves(item)
        else:
            yield item
