"""Does a decoded record hold what its index promises? Field names, and dtype and shape of arrays.

The index's schema is what a reader collates batches by: a record that lacks a field, has an
extra one, or holds an array of another dtype or shape (a corrupt or hostile header can make
one decode as such) would otherwise turn into a misaligned or silently wrong batch.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from .codec import KEYS_FIELD, ROWS_FIELD
from .errors import SampleError
from .field_spec import text_kind
from .index import FieldSpec, Schema, spec_of

_RESERVED = {ROWS_FIELD, KEYS_FIELD}


@lru_cache(maxsize=64)
def _dtype_name(dtype: np.dtype) -> str:
    return dtype.name  # NumPy builds this string anew at each access: the slow part of a check


def _found(value: Any, packed: bool) -> FieldSpec:
    """The spec of one decoded value, per row of a packed record (arrays read directly: this
    runs for every field of every record read)."""
    if isinstance(value, np.ndarray):
        return FieldSpec(_dtype_name(value.dtype), value.shape[1:] if packed else value.shape)
    return spec_of(value, packed)


def _matches(found: FieldSpec, spec: FieldSpec, packed: bool) -> bool:
    """Whether a value's spec fits the schema's: the same kind (array or not), and for arrays
    the same dtype and the same dimensions where the schema fixes them. Types of non-array
    values are not compared: the writer records a tuple as ``tuple``, it decodes as a list.
    A packed record stores a column of numbers as an array, one number a row."""
    if spec.shape is None:
        return found.shape is None or (packed and found.shape == ())
    if found.shape is None or (found.dtype != spec.dtype and (
            text_kind(found.dtype) is None or text_kind(found.dtype) != text_kind(spec.dtype))):
        return False
    return found.shape == spec.shape or (len(found.shape) == len(spec.shape) and all(
        want is None or want == got for got, want in zip(found.shape, spec.shape)))


def check_conforms(fields: Mapping[str, Any], schema: Schema) -> None:
    """Raise SampleError unless ``fields`` (a decoded record, packed or not) match ``schema``
    (which a record may lack only its optional fields of)."""
    names = fields.keys() - _RESERVED
    if names != schema.keys():
        missing = sorted(name for name in schema.keys() - names if not schema[name].optional)
        extra = sorted(names - schema.keys())
        if missing or extra:
            raise SampleError(f"fields differ from the index's schema (missing {missing}, extra {extra})")
    packed = ROWS_FIELD in fields
    for name, spec in schema.items():
        if name not in fields:
            continue
        found = _found(fields[name], packed)
        if not _matches(found, spec, packed):
            shown = "not an array" if found.shape is None else f"{found.dtype}{list(found.shape)}"
            wanted = "not an array" if spec.shape is None else f"{spec.dtype}{list(spec.shape)}"
            raise SampleError(f"field {name!r} is {shown}, the index's schema says {wanted}")
