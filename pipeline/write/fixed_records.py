"""Records of fixed-shape array columns, laid out with NumPy instead of one by one.

When every field is an array column and keys are generated, all records of a block (but a
shorter last one) have the same size and the same bytes except for their key and data: the
tar header differs in the name and checksum, the msgpack payload only where the array bytes
go. So a run of records is one 2-D byte array built with one vectorised copy per field,
byte for byte what :func:`pipeline.write.rows.encode_records` would produce. This is what
makes ``pack=1`` builds of large samples run at the speed of memory instead of at the speed
of Python (tens of microseconds per record).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..format.codec import ROWS_FIELD, encode_parts
from ..format.tar import BLOCK, member_header
from .rows import KEY_DIGITS, RowBlock

_SUFFIX = b".msgpack"
_NAME_BYTES = KEY_DIGITS + len(_SUFFIX)


@dataclass(frozen=True)
class FixedLayout:
    """Where each part of a record lives inside its bytes."""

    template: np.ndarray  # one record's bytes, with zeros where key, checksum and data go
    data_offsets: dict[str, int]  # field -> offset of its array bytes in the payload
    constant_ranges: tuple[tuple[int, int], ...]  # the record's byte ranges outside the data
    checksum_base: int  # header checksum less the digits of the key
    record_bytes: int  # header + payload + padding

    @property
    def payload_bytes(self) -> int:
        return self.record_bytes - BLOCK


def fixed_layout(block: RowBlock, pack: int) -> FixedLayout | None:
    """The layout of the block's full records, or ``None`` when records are not all alike
    (given keys, non-array fields) or the block holds no full record."""
    if block.keys is not None or len(block) < pack:
        return None
    columns = block.columns
    if not all(isinstance(col, np.ndarray) and col.flags.c_contiguous and col.dtype.byteorder != ">"
               for col in columns.values()):
        return None
    first = {name: col[:pack] if pack > 1 else col[0] for name, col in columns.items()}
    if pack > 1:
        first[ROWS_FIELD] = pack
    parts = encode_parts(first, "0" * KEY_DIGITS)
    payload = b"".join(parts)
    offsets: dict[str, int] = {}
    position = 0
    names = iter(columns)
    for part in parts:
        if isinstance(part, memoryview):  # array data: exactly the fields, in order
            offsets[next(names)] = position
        position += len(part)
    if len(offsets) != len(columns):
        return None  # an array that was not passed through (0-sized): use the generic path
    header = member_header("0" * KEY_DIGITS + ".msgpack", len(payload))
    record = np.zeros(BLOCK + len(payload) + (-len(payload) % BLOCK), dtype=np.uint8)
    record[:BLOCK] = np.frombuffer(header, dtype=np.uint8)
    record[BLOCK:BLOCK + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
    for name, offset in offsets.items():
        nbytes = first[name].nbytes
        record[BLOCK + offset:BLOCK + offset + nbytes] = 0
    base = int(record[:148].sum(dtype=np.int64)) + 8 * ord(" ") + int(record[156:BLOCK].sum(dtype=np.int64))
    base -= ord("0") * KEY_DIGITS  # the template's key digits are counted per record instead
    record[:KEY_DIGITS] = 0
    record[148:156] = 0
    data_ranges = sorted((BLOCK + offset, BLOCK + offset + first[name].nbytes) for name, offset in offsets.items())
    constant, position = [], 0
    for start, stop in data_ranges + [(len(record), len(record))]:
        if start > position:
            constant.append((position, start))
        position = stop
    return FixedLayout(record, offsets, tuple(constant), base, len(record))


def _digits(values: np.ndarray, width: int, base: int) -> np.ndarray:
    """ASCII digits of each value, zero-padded to ``width``, as a (len, width) uint8 array."""
    powers = base ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return ((values[:, None] // powers) % base + ord("0")).astype(np.uint8)


def build_records(block: RowBlock, layout: FixedLayout, first_index: int, pack: int) -> tuple[np.ndarray, int]:
    """The bytes of the block's full records as a (records, record_bytes) array, and the
    number of rows they hold (a multiple of ``pack``)."""
    records = len(block) // pack
    if first_index + records * pack >= 10**KEY_DIGITS:
        raise ValueError("sample numbers beyond 12 digits")
    out = np.empty((records, layout.record_bytes), dtype=np.uint8)
    for start, stop in layout.constant_ranges:  # every byte is written once: constants, then data
        out[:, start:stop] = layout.template[start:stop]
    for name, col in block.columns.items():
        data = col[:records * pack].reshape(records, -1).view(np.uint8)
        start = BLOCK + layout.data_offsets[name]
        out[:, start:start + data.shape[1]] = data
    keys = _digits(first_index + pack * np.arange(records, dtype=np.int64), KEY_DIGITS, 10)
    out[:, :KEY_DIGITS] = keys
    checksums = layout.checksum_base + keys.sum(axis=1, dtype=np.int64)
    out[:, 148:154] = _digits(checksums, 6, 8)
    out[:, 154] = 0
    out[:, 155] = ord(" ")
    return out, records * pack
