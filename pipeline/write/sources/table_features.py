"""What ``datasets`` says of a table's columns in the schema metadata it writes (``save_to_disk``
folders and ``to_parquet`` files alike): the names behind a ``ClassLabel``'s numbers, and the
one shape of an ``Array2D``-``Array5D`` column, whose values Arrow stores as lists of lists of
any length. Tables that other tools wrote have no such metadata, and lose nothing but these.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import pyarrow as pa

_ARRAYS = ("Array2D", "Array3D", "Array4D", "Array5D")


def _features(schema: pa.Schema, columns: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The ``datasets`` feature of each of ``columns`` that has one written as a dict."""
    try:
        features = json.loads((schema.metadata or {})[b"huggingface"])["info"]["features"]
    except (KeyError, TypeError, ValueError):  # (no such metadata, or not as datasets writes it)
        return {}
    if not isinstance(features, dict):
        return {}
    return {name: features[name] for name in columns if isinstance(features.get(name), dict)}


def class_names(schema: pa.Schema, columns: Sequence[str]) -> dict[str, Any] | None:
    """What a build keeps of the ``ClassLabel`` columns among ``columns``: ``{"classes": names}``
    for one such column (as an image folder's build keeps them), ``{"classes": {column: names}}``
    for several, ``None`` for none."""
    found = {name: feature.get("names") for name, feature in _features(schema, columns).items()
             if feature.get("_type") == "ClassLabel"}
    if not found or not all(isinstance(names, list) for names in found.values()):
        return None
    return {"classes": next(iter(found.values())) if len(found) == 1 else found}


def array_shapes(schema: pa.Schema, columns: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The columns among ``columns`` that are ``Array2D``-``Array5D`` of one shape, and that shape
    (``Array2D((None, 3))``, whose first dimension may vary, has none)."""
    shapes = {}
    for name, feature in _features(schema, columns).items():
        shape = feature.get("shape")
        if feature.get("_type") in _ARRAYS and isinstance(shape, list) and all(
                isinstance(size, int) and size >= 0 for size in shape):
            shapes[name] = tuple(shape)
    return shapes
