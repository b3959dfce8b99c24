"""The schema of a shard set: each field's type (:class:`FieldSpec`), found from values and
merged over samples, as builds, scans of other tools' shards and readers all take it.

A field's dtype is one for every sample (a reader collates it into one tensor), its number of
dimensions too; only sizes may vary, which the spec records as ``None``. Values that are no
arrays have a Python type name as dtype, and several types make ``any``: a list in batches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from .errors import FormatError, IndexFormatError, SampleError
from .numbers import outside_int64


@dataclass(frozen=True)
class FieldSpec:
    """Type of one field: ``dtype`` (a NumPy dtype name, ``bfloat16``, or a Python type name
    such as ``int``/``str``/``bytes``) and per-sample ``shape`` (``None`` entries vary,
    ``None`` altogether for non-array fields). ``optional``: some samples lack the field (shards
    written by other tools may); readers fill it in (see ``ShardDataset(fill=...)``)."""

    dtype: str
    shape: tuple[int | None, ...] | None
    optional: bool = False

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"dtype": self.dtype, "shape": None if self.shape is None else list(self.shape)}
        if self.optional:
            data["optional"] = True
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "FieldSpec":
        shape = data.get("shape")
        return cls(str(data["dtype"]), None if shape is None else tuple(shape), bool(data.get("optional", False)))

    @property
    def varies(self) -> bool:
        """Whether the field's arrays differ in shape from sample to sample."""
        return self.shape is not None and None in self.shape


Schema = dict[str, FieldSpec]


def spec_of(value: Any, packed: bool = False) -> FieldSpec:
    """The FieldSpec of one value (of a packed column when ``packed``: drop its first axis).
    Values of one type, dtype and shape share one spec object (see :func:`_numpy_spec`)."""
    if type(value).__module__ == "torch":
        dtype = str(value.dtype).removeprefix("torch.")
        shape = tuple(value.shape)
    elif isinstance(value, np.ndarray) or (isinstance(value, np.generic) and not isinstance(value, np.character)):
        return _numpy_spec(type(value.dtype), value.dtype, value.shape[1:] if packed else value.shape)
    else:
        if packed and isinstance(value, list) and value:
            value = value[0]
        if outside_int64(value):  # (another tool's .cls of 2**63): no tensor holds it, so every batch a list
            return FieldSpec("any", None)
        plain = str if isinstance(value, str) else bytes if isinstance(value, bytes) else type(value)  # (np.str_)
        return _plain_spec(plain)
    return FieldSpec(dtype, shape[1:] if packed else shape)


@lru_cache(maxsize=1024)
def _numpy_spec(kind: type, dtype: np.dtype, shape: tuple[int, ...]) -> FieldSpec:
    """The spec of NumPy values of ``dtype`` (of class ``kind``: equal dtypes of one class have one
    name) and ``shape``, made once: a dtype's ``name`` is computed in Python, and a writer asks for
    it once a sample."""
    return FieldSpec(dtype.name, shape)


@lru_cache(maxsize=1024)
def _plain_spec(plain: type) -> FieldSpec:
    return FieldSpec(plain.__name__, None)


def text_kind(dtype: str) -> str | None:
    """``str`` or ``bytes`` for the name of a NumPy text dtype (``str96``: ``<U3``, 96 bits a
    character... of its widest value), else ``None``. Another tool's ``.npy`` text arrays have the
    width of their longest string, which differs from sample to sample; a batch holds them as
    lists, whatever their width."""
    for kind in ("str", "bytes"):
        if dtype.startswith(kind) and dtype[len(kind):].isdigit():
            return kind
    return None


def _text_width(dtype: str) -> int:
    return int(dtype.removeprefix(text_kind(dtype) or ""))


def merge_spec(name: str, old: FieldSpec, new: FieldSpec, where: str,
               error: type[FormatError] = IndexFormatError) -> FieldSpec:
    """Combine two specs of one field: dims that differ become ``None``; a dtype change of an
    array field is an ``error`` (the reader could not collate it): an index's, or, in a build, a
    :class:`SampleError`, the input's; optional if either is. Merging ``new`` into the result
    again gives the result, without an error (a writer skips that, for a sample like the one before)."""
    if old is new:  # (specs are shared: see spec_of)
        return old
    if old.optional != new.optional:
        old, new = replace(old, optional=True), replace(new, optional=True)
    if old == new:
        return old
    if old.shape is None or new.shape is None:
        if old.shape is None and new.shape is None:
            return old if old.dtype == new.dtype else FieldSpec("any", None, old.optional)
        raise error(f"{where}: field {name!r} is {_kind_of(new)} here and {_kind_of(old)} in earlier "
                    f"samples; give it one kind of value in every sample")
    if old.dtype != new.dtype and text_kind(old.dtype) is not None and text_kind(old.dtype) == text_kind(new.dtype):
        wider = max(old.dtype, new.dtype, key=_text_width)  # (text of any width: lists of str)
        old, new = replace(old, dtype=wider), replace(new, dtype=wider)
    if old.dtype != new.dtype:
        cast = f"--dtype {name}={_common_dtype(old.dtype, new.dtype)} (dtypes=)"
        raise error(f"{where}: field {name!r} has dtype {new.dtype}, earlier samples {old.dtype}; a field needs one "
                    f"dtype: " + (f"cast the values as you write them (a ShardWriter's), or build with {cast}" if error is SampleError
                                  else "write the shards again with the values cast to one (shards of this library: "
                                       f"build them again from your data with {cast})"))
    if len(old.shape) != len(new.shape):
        raise error(
            f"{where}: field {name!r} has shape {shape_words(new.shape)}, earlier samples "
            f"{shape_words(old.shape)}; an array field needs one number of dimensions in every sample (their "
            f"sizes may differ): reshape the odd one (a single number as a 1-element array, say) or leave it out")
    shape = tuple(a if a == b else None for a, b in zip(old.shape, new.shape))
    return FieldSpec(old.dtype, shape, old.optional)


def _common_dtype(a: str, b: str) -> str:
    """The dtype both hold (``float32`` and ``float64``: ``float64``), to suggest a cast to; a
    cast makes NumPy dtypes, so ``bfloat16`` counts as the ``float32`` that holds it exactly."""
    a, b = ("float32" if dtype == "bfloat16" else dtype for dtype in (a, b))
    try:
        return np.promote_types(a, b).name
    except TypeError:  # dtypes that have none in common
        return a


def shape_words(shape: tuple[int | None, ...]) -> str:
    """A shape for a message: ``[any, 3]`` where the index has ``None`` (sizes that vary)."""
    return f"[{', '.join('any' if d is None else str(d) for d in shape)}]"


def _kind_of(spec: FieldSpec) -> str:
    """What a value of ``spec`` is, in words, for an error."""
    if spec.shape is None:
        return f"a Python {spec.dtype}"
    if spec.shape == ():
        return f"a NumPy {spec.dtype} scalar (a 0-d array)"
    return f"a {spec.dtype} array of shape {shape_words(spec.shape)}"


def merge_schema(old: Schema | None, new: Schema, where: str, optional: bool = False,
                 error: type[FormatError] = IndexFormatError) -> Schema:
    """Combine two schemas of the same shard set; fields must be the same, unless ``optional``:
    then a field that one of them lacks becomes optional. A disagreement is an ``error``, as in
    :func:`merge_spec`."""
    if old is None:
        return dict(new)
    if old == new:  # (a sample like those before: the usual case, made quick)
        return dict(old)
    if set(old) != set(new) and not optional:
        missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
        raise error(f"{where}: fields differ from earlier samples (missing {missing}, extra {extra})")
    merged = {name: merge_spec(name, old[name], new[name], where, error) for name in old if name in new}
    for name, spec in list(old.items()) + list(new.items()):
        if name not in merged:
            merged[name] = replace(spec, optional=True)
    return merged
