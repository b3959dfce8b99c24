"""Samples a packed record refuses, found among those a :class:`~.writer.ShardWriter` holds.

With ``pack`` > 1 a sample is checked when its record fills (encoding it with the others costs
once what checking each sample as it comes would cost again). One the record refuses would stay
pending, and refuse every later write and the close about it: the writer finds it, and leaves
it out, only when a record fails, which costs nothing while none does.
"""

from __future__ import annotations

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
    shapes differ from the first row's of its record (a packed record stacks them)."""
    kept: list[RowBlock] = []
    refused: list[Refused] = []
    record_first: RowBlock | None = None
    number = first
    for block in pending:
        for i in range(len(block)):
            row = block.slice(i, i + 1)
            try:
                numbers = row.with_numbers_as(schema)
                merged = merge_schema(schema, numbers.schema(number, schema), "its fields", error=SampleError)
                for _ in encode_records(numbers, number, 1):
                    pass
                if record_first is not None:
                    _check_shapes(row, record_first, pack)
            except FormatError as exc:
                refused.append(Refused(row, repr(row.keys[0]) if row.keys else f"number {number} (no key given)",
                                       str(exc)))
                continue
            schema = merged
            kept.append(row)
            record_first = None if len(kept) % pack == 0 else record_first or row
            number += 1
    return kept, refused


def _check_shapes(row: RowBlock, record_first: RowBlock, pack: int) -> None:
    for name, column in row.columns.items():
        mine, theirs = np.shape(column[0]), np.shape(record_first.columns[name][0])
        if isinstance(column[0], np.ndarray) and mine != theirs:
            raise SampleError(f"field {name!r}: shape {mine} differs from {theirs} in the same packed record of "
                              f"pack={pack} (pack=1 lets shapes vary)")


def left_out(refused: Sequence[Refused], pack: int) -> str:
    """In words: the samples ``refused``."""
    which = ", ".join(r.name for r in refused)
    return (f"sample(s) {which} left out: {refused[0].reason} (with pack={pack}, a sample is checked as its record "
            f"fills, which may be at a later write)")
