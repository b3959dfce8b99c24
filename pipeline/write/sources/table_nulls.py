"""Nulls in the columns of a table that have no fill: refused, naming the file, each column and
its first rows, every such column of a file in one error (so that one run says every fill to
give, not one a run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa

from ...format.errors import SampleError
from .table_columns import null_rows

_SHOWN_ROWS = 5


class FileNulls:
    """The nulls found so far in ``path``'s columns (of ``columns``) that ``fill`` has no value for."""

    def __init__(self, path: Path, columns: Sequence[str], fill: Mapping[str, Any]) -> None:
        self.path, self.columns, self.fill = path, columns, fill
        self.found: dict[str, str] = {}  # column -> its nulls in words (the first batch's where it has some)

    def add(self, first_row: int, batch: pa.RecordBatch,
            in_file: Callable[[str], int | None] = lambda name: None) -> None:
        """Note the nulls of ``batch`` (rows from ``first_row`` of the file) in columns with none
        noted before. ``in_file`` gives a column's nulls in the whole file where the file's
        metadata says (the batch's are only the first), else ``None``."""
        for name in batch.schema.names:
            rows = null_rows(batch.column(name)) if name not in self.fill and name not in self.found else []
            if not len(rows):
                continue
            shown = ", ".join(str(first_row + r) for r in rows[:_SHOWN_ROWS].tolist())
            # (a file's counts are of whole values: a list with a null inside is not one)
            type_ = batch.schema.field(name).type
            total = None if pa.types.is_nested(getattr(type_, "storage_type", type_)) else in_file(name)
            if total is None or total < len(rows):  # (fewer than these: a count not kept, pyarrow 14's reads 0)
                self.found[name] = f"nulls, the first at {'row' if len(rows) == 1 else 'rows'} {shown}"
            else:
                self.found[name] = (f"{total} null{'s' if total > 1 else ''}, at {'row' if total == 1 else 'rows'} "
                                    f"{shown}{', ...' if total > min(len(rows), _SHOWN_ROWS) else ''}")

    def refuse(self) -> None:
        """Raise a :class:`SampleError` naming every column with nulls noted, in column order."""
        found = {name: self.found[name] for name in self.columns if name in self.found}
        if found:
            where = "; ".join(f"column {name!r} has {nulls}" for name, nulls in found.items())
            options = " ".join(f"--fill {name}=VALUE" for name in found)
            fills = ", ".join(f"{name!r}: VALUE" for name in found)
            them = "column" if len(found) == 1 else "columns"
            raise SampleError(f"{self.path}: {where} (counting from 0 in the file); fill them with {options} "
                              f"(fill={{{fills}}} in Python), or leave the {them} out with --columns")
