"""Samples a packed record refuses, found among those a :class:`~.writer.ShardWriter` holds.

With ``pack`` > 1 a sample is checked when its record fills (encoding it with the others costs
once what checking each sample as it comes would cost again). One the record refuses would stay
pending, and refuse every later write and the close about it: the writer finds it, and leaves
it out, only when a record fails, which costs nothing while none does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..format.errors import FormatError, SampleError
from ..format.index import Schema, merge_schema
from .rows import RowBlock, encode_records


@dataclass(frozen=True)
class Refused:
    """A sample left out: its row, how to name it, and why."""

    row: RowBlock
    name: str
    reason: str


def split_refused(pending: Sequence[RowBlock], schema: Schema | None, first: int,
                  pack: int) -> tuple[list[RowBlock], list[Refused]]:
    """The rows of ``pending`` (sample ``first`` on; ``schema``, the samples' before them) that
    records of ``pack`` rows hold, one block each, and those they refuse: a row no record holds
    alone (fields other than those before it, a value msgpack cannot write), or whose arrays'
    shapes are not the others' (see :func:`_usual_shapes`)."""
    kept: list[RowBlock] = []
    refused: list[Refused] = []
    shapes = _usual_shapes(pending, schema) if pack > 1 else {}
    number = first
    for block in pending:
        for i in range(len(block)):
            row = block.slice(i, i + 1)
            try:
                numbers = row.with_numbers_as(schema)
                merged = merge_schema(schema, numbers.schema(number, schema), "its fields", error=SampleError)
                for _ in encode_records(numbers, number, 1):
                    pass
                _check_shapes(row, shapes, pack)
            except FormatError as exc:
                refused.append(Refused(row, repr(row.keys[0]) if row.keys else f"number {number} (no key given)",
                                       str(exc)))
                continue
            schema = merged
            kept.append(row)
            number += 1
    return kept, refused


def _usual_shapes(pending: Sequence[RowBlock], schema: Schema | None) -> dict[str, tuple]:
    """The shape each array field's samples take in a packed record (which stacks them): the
    samples' written, where they had one, else the most frequent of the pending ones (the
    first of those most frequent)."""
    seen: dict[str, Counter] = {}
    for block in pending:
        for name, column in block.columns.items():
            for value in column:
                if _is_array(value):
                    seen.setdefault(name, Counter())[tuple(np.shape(value))] += 1
    shapes = {}
    for name, counts in seen.items():
        spec = (schema or {}).get(name)
        written = spec.shape if spec is not None and spec.shape is not None and None not in spec.shape else None
        shapes[name] = tuple(written) if written is not None else counts.most_common(1)[0][0]
    return shapes


def _is_array(value: object) -> bool:
    return np.ndim(value) >= 1 and hasattr(value, "shape")  # (NumPy arrays and torch tensors: not lists)


def _check_shapes(row: RowBlock, shapes: dict[str, tuple], pack: int) -> None:
    for name, column in row.columns.items():
        shape = tuple(np.shape(column[0]))
        if name in shapes and _is_array(column[0]) and shape != shapes[name]:
            raise SampleError(f"field {name!r}: shape {shape} differs from {shapes[name]}, the others' in a packed "
                              f"record of pack={pack} (pack=1 lets shapes vary)")


def left_out(refused: Sequence[Refused], pack: int) -> str:
    """In words: the samples ``refused``."""
    which = ", ".join(r.name for r in refused)
    return (f"sample(s) {which} left out: {refused[0].reason} (with pack={pack}, a sample is checked as its record "
            f"fills, which may be at a later write)")
