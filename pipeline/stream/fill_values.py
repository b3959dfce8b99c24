"""``fill``'s values made what the index says their fields hold, so that a batch holding one is
of the same type as every other batch: checked as a dataset is made, not found at some batch."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..format.index import FieldSpec, Schema, shape_words
from ..format.numbers import outside_int64

#: The values a field of Python values of each type may be filled with, and how each becomes one.
_PLAIN_FILLS: dict[str, tuple[tuple[type, ...], Any]] = {
    "int": ((int, np.integer), int), "float": ((int, float, np.integer, np.floating), float),
    "bool": ((bool, np.bool_), bool), "str": ((str,), str), "bytes": ((bytes, bytearray), bytes)}


def conformed_fill(fill: Mapping[str, Any], schema: Schema) -> dict[str, Any]:
    """``fill``'s values as the index's fields hold theirs: for an array field an array of its
    dtype and shape (a single number stands for an array of it: ``{"npy": 0}``, zeros; a float
    field takes any number, rounded to its precision), for a field of Python values one of its
    type. Another value is refused, naming the field: the batches holding it would be a tensor of
    another dtype, or a list, where every other batch is one tensor. ``None`` (the default) and
    fields of values of several types (``any``) take anything."""
    out = dict(fill)
    for name, value in fill.items():
        spec = schema.get(name)
        if spec is None or value is None or spec.dtype in ("any", "bfloat16"):
            continue
        out[name] = _plain(name, value, spec) if spec.shape is None else _array(name, value, spec)
    return out


def _plain(name: str, value: Any, spec: FieldSpec) -> Any:
    kinds, make = _PLAIN_FILLS.get(spec.dtype, (None, None))
    if kinds is None:  # dicts, lists: values of their own
        return value
    if not isinstance(value, kinds) or spec.dtype in ("int", "float") and isinstance(value, (bool, np.bool_)):
        raise ValueError(f"fill gives field {name!r} the value {value!r}, but the field holds Python values of type "
                         f"{spec.dtype}: give one of that type")
    if spec.dtype == "int" and outside_int64(int(value)):
        raise ValueError(f"fill gives field {name!r} the value {value!r}, which int64, the integers of a batch's "
                         f"tensor, does not hold: give one between -2**63 and 2**63 - 1")
    try:
        return make(value)
    except OverflowError:  # an int no float holds
        raise ValueError(f"fill gives field {name!r} the value {value!r}, which a float does not hold: give a "
                         f"smaller one") from None


def _array(name: str, value: Any, spec: FieldSpec) -> np.ndarray:
    wrong = (f"fill gives field {name!r} the value {value!r}, but the field holds {spec.dtype} arrays of shape "
             f"{shape_words(spec.shape or ())}")
    target = np.dtype(spec.dtype)
    try:
        array = np.asarray(value)
        with np.errstate(all="ignore"):  # (an overflow is refused below, not warned of from here)
            conformed = array.astype(target)
    except (TypeError, ValueError):
        array = conformed = None
    fits = array is not None and array.dtype.kind in "biuf" and (array.dtype.kind == "b") <= (target.kind == "b") \
        and (bool(np.array_equal(np.isfinite(conformed), np.isfinite(array))) if target.kind == "f"
             else bool(np.array_equal(conformed, array)))  # (a float field rounds, but to no infinity; others exact)
    if not fits:
        raise ValueError(f"{wrong}: give a number, or an array, that {spec.dtype} holds")
    if spec.varies:
        sizes = zip(spec.shape, conformed.shape)
        if conformed.ndim != len(spec.shape) or any(d is not None and d != n for d, n in sizes):
            raise ValueError(f"{wrong}: give an array of that shape")
        return conformed
    if conformed.shape != spec.shape:
        if conformed.ndim:
            raise ValueError(f"{wrong}: give an array of that shape, or one number (an array of it)")
        conformed = np.full(spec.shape, conformed)
    return conformed
