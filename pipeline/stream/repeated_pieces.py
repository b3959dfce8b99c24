"""A block's pieces read once each, however many times the epoch draws them.

A small source drawn many times in an epoch (a curated set of 10 samples at half the weight)
gives a block the same pieces hundreds of times, each of which was read (its range found, its
records walked and checked), 50x slower than the block's other rows.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .reader import Columns

Read = list[Columns | int] | None  # a piece's rows as parts for stand_in; None: none could be read (skip)


def read_distinct(wanted: list[tuple], read_pieces: Callable[[list[tuple]], list[Read]]) -> list[Read]:
    """The rows of each piece ``wanted`` (``source, shard, start, stop, rows``), each distinct
    piece read once by ``read_pieces``. A repeat gets copies of the first read's arrays (rows of
    a field of varied shapes stay views of them, which a transform may change in place); one
    whose read holds values in lists, or lost records under skip (each draw's loss counted and
    stood in for), is read again."""
    keys = [_piece_key(n, piece) for n, piece in enumerate(wanted)]
    first: dict[tuple, int] = {}
    for n, key in enumerate(keys):
        first.setdefault(key, n)
    results: dict[int, Read] = dict(zip(first.values(), read_pieces([wanted[n] for n in first.values()])))
    again = [n for n, key in enumerate(keys) if n != first[key] and not _shareable(results[first[key]])]
    results.update(zip(again, read_pieces([wanted[n] for n in again])))
    return [results[n] if n in results else _copy_of(results[first[key]]) for n, key in enumerate(keys)]


def _shareable(read: Read) -> bool:
    """Whether a piece's rows may stand for a repeat of it too: all of them read, in arrays of
    numbers (an array of objects holds the samples' own values)."""
    return read is not None and all(isinstance(part, dict) and all(
        isinstance(value, np.ndarray) and value.dtype != object for value in part.values()) for part in read)


def _copy_of(read: Read) -> list[Columns | int]:
    return [{name: value.copy() for name, value in part.items()} for part in read]  # type: ignore[union-attr]


def _piece_key(number: int, piece: tuple) -> tuple:
    """What a piece of a block is read as: its range, where it keeps all of it (a repeat reads the
    same), else its place among the pieces (its own)."""
    source, shard, start, stop, rows = piece
    return (source, shard, start, stop) if rows is None or len(rows) == stop - start else (number,)
