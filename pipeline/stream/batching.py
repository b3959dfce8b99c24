"""Cut emitted windows into batches with vectorised gathers, and hand them to torch.

A window is a set of columns plus the emission order of its rows. A batch is gathered with one
``np.take`` per field into a fresh buffer: in a DataLoader worker that buffer is a torch tensor
in shared memory, so the batch crosses to the main process without another copy.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterator

import numpy as np
import torch

from .reader import Columns


@lru_cache(maxsize=None)
def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a NumPy dtype."""
    return torch.from_numpy(np.empty(0, dtype)).dtype


def _gather_array(column: np.ndarray, index: np.ndarray, shared: bool) -> Any:
    shape = (len(index),) + column.shape[1:]
    if shared and column.dtype.kind in "biuf":
        out = torch.empty(shape, dtype=torch_dtype(column.dtype)).share_memory_()
        np.take(column, index, axis=0, out=out.numpy())
        return out
    return np.take(column, index, axis=0)


def gather(columns: Columns, index: np.ndarray, shared: bool = False) -> Columns:
    """Rows ``index`` of every column (arrays: one vectorised copy; lists: a list)."""
    return {name: _gather_array(col, index, shared) if isinstance(col, np.ndarray)
            else [col[i] for i in index] for name, col in columns.items()}


def _join(parts: list[Columns]) -> Columns:
    out: Columns = {}
    for name in parts[0]:
        cols = [p[name] for p in parts]
        if all(isinstance(c, torch.Tensor) for c in cols):
            out[name] = torch.cat(cols)
        elif all(isinstance(c, (np.ndarray, torch.Tensor)) for c in cols):
            out[name] = np.concatenate([np.asarray(c) for c in cols])
        else:
            out[name] = [v for c in cols for v in c]
    return out


def batches_from_windows(windows: Iterator[tuple[Columns, np.ndarray]], batch_size: int,
                         drop_last: bool, shared: bool = False) -> Iterator[Columns]:
    """Batches of ``batch_size`` rows in emission order across windows; the last batch is
    shorter unless ``drop_last``."""
    carry: list[Columns] = []
    carried = 0
    for columns, order in windows:
        position = 0
        if carried:
            need = batch_size - carried
            carry.append(gather(columns, order[:need]))
            carried += min(need, len(order))
            position = need
            if carried < batch_size:
                continue
            yield _join(carry)
            carry, carried = [], 0
        while position + batch_size <= len(order):
            yield gather(columns, order[position:position + batch_size], shared)
            position += batch_size
        if position < len(order):
            carry, carried = [gather(columns, order[position:])], len(order) - position
    if carried and not drop_last:
        yield _join(carry)


def to_torch(batch: Columns) -> dict[str, Any]:
    """Arrays become tensors (without a copy); lists of str/bytes stay lists."""
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            out[name] = torch.from_numpy(value if value.flags.writeable else value.copy())
        else:
            out[name] = value
    return out
