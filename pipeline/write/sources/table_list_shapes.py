"""Checks of the shape of a table's lists of lists, row by row without a loop per row: each row's
lists of one depth need one length to make an array, and none of them may be null."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


class RowShapeError(ValueError):
    """A row of lists of lists that makes no array, or not the one its column's metadata says."""

    def __init__(self, row: int, text: str) -> None:
        super().__init__(text)
        self.row = row


def refuse_null_lists(level: pa.Array, lo: np.ndarray, hi: np.ndarray, depth: int) -> None:
    """Refuse a null among the lists ``level`` of depth ``depth`` that a row's range holds."""
    nulls = np.flatnonzero(level.is_null().to_numpy(zero_copy_only=False))
    row = np.searchsorted(hi, nulls, side="right")  # (the first row whose range ends past each)
    inside = (row < len(lo)) & (lo[np.minimum(row, len(lo) - 1)] <= nulls)
    if inside.any():
        raise RowShapeError(int(row[inside][0]), f"a list {'inside lists ' * (depth - 1)}in it is null, which a fill "
                                                 f"cannot stand for (a list of unknown length); mend that row")


def one_length(lengths: np.ndarray, lo: np.ndarray, hi: np.ndarray, depth: int) -> np.ndarray:
    """The length that the lists ``lo[r]:hi[r]`` of each row ``r`` share (0 for a row of none)."""
    held = hi > lo
    out = np.zeros(len(lo), lengths.dtype)
    if not held.any():
        return out
    bounds = np.stack([lo[held], hi[held]], axis=1).ravel()  # (every other reduction is a row's)
    padded = np.append(lengths, 0)  # (a range may end at the last list)
    shortest = np.minimum.reduceat(padded, bounds)[::2]
    longest = np.maximum.reduceat(padded, bounds)[::2]
    wrong = np.flatnonzero(shortest != longest)
    if len(wrong):
        first = wrong[0]
        raise RowShapeError(int(np.flatnonzero(held)[first]),
                            f"its lists {'inside lists ' * (depth - 1)}hold {shortest[first]} and {longest[first]} "
                            f"items, so they make no array; give the lists of each depth of a row one length")
    out[held] = shortest
    return out
