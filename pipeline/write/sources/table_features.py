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
_LISTS = ("Sequence", "List", "LargeList")


def _features(schema: pa.Schema, columns: Sequence[str]) -> dict[str, Any]:
    """The ``datasets`` feature of each of ``columns`` that has one."""
    try:
        features = json.loads((schema.metadata or {})[b"huggingface"])["info"]["features"]
    except (KeyError, TypeError, ValueError):  # (no such metadata, or not as datasets writes it)
        return {}
    if not isinstance(features, dict):
        return {}
    return {name: features[name] for name in columns if name in features}


def _item(feature: Any) -> Any:
    """What a ``Sequence``/``List`` feature holds (older ``datasets`` write one as ``[item]``)."""
    if isinstance(feature, list) and len(feature) == 1:
        return feature[0]
    return feature.get("feature") if isinstance(feature, dict) and feature.get("_type") in _LISTS else None


def class_names(schema: pa.Schema, columns: Sequence[str]) -> dict[str, Any] | None:
    """What a build keeps of the ``ClassLabel`` columns among ``columns``, and of lists of
    ``ClassLabel`` (``Sequence(ClassLabel(...))``: tags, ``ner_tags``): ``{"classes": names}`` for
    one such column (as an image folder's build keeps them), ``{"classes": {column: names}}`` for
    several, ``None`` for none."""
    found = {}
    for name, feature in _features(schema, columns).items():
        while (item := _item(feature)) is not None:
            feature = item
        if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
            found[name] = feature.get("names")
    if not found or not all(isinstance(names, list) for names in found.values()):
        return None
    return {"classes": next(iter(found.values())) if len(found) == 1 else found}


def array_shapes(schema: pa.Schema, columns: Sequence[str]) -> dict[str, tuple[int | None, ...]]:
    """The columns among ``columns`` that are ``Array2D``-``Array5D``, and their shape
    (``Array2D((None, 3))``'s first dimension, which varies, is ``None``)."""
    shapes = {}
    for name, feature in _features(schema, columns).items():
        shape = feature.get("shape") if isinstance(feature, dict) else None
        if isinstance(shape, list) and feature.get("_type") in _ARRAYS and all(
                (isinstance(size, int) and size >= 0) or (size is None and depth == 0)
                for depth, size in enumerate(shape)):
            shapes[name] = tuple(shape)
    return shapes


def features_differ(other: pa.Schema, columns: Sequence[str], classes: dict[str, Any] | None,
                    shapes: dict[str, tuple[int | None, ...]]) -> tuple[str, str] | None:
    """What ``other``'s metadata gives ``columns`` that the first file's ``classes`` (from
    :func:`class_names`) and ``shapes`` (from :func:`array_shapes`) do not: ``(what, ours)`` in
    words, else ``None``. (The first file's stand for all: a label would mean one class in one
    file and another in the next.)"""
    ours, theirs = (classes or {}).get("classes"), (class_names(other, columns) or {}).get("classes")
    if ours != theirs:
        return f"class names {theirs}", f"{ours} (number the classes alike: Dataset.align_labels_with_mapping)"
    theirs_shapes = array_shapes(other, columns)
    if shapes != theirs_shapes:
        return f"array shapes {theirs_shapes}", f"{shapes} (cast to one: Dataset.cast)"
    return None
