"""Runs of records alike but for their key and array bytes, checked with NumPy instead of one
by one: the reading side of :mod:`pipeline.write.fixed_records`.

Why: walking a record costs about a hundred Python calls (its tar header, its msgpack map, every
array's header, the schema, the checksum), tens of microseconds however small the record. With
``pack=1`` and large samples (images as arrays, say) that is most of a reader's time, far more
than copying the sample's bytes; packed records of small samples pay it once a record too. But
records written from fixed-shape array columns share every byte except their key, their header
checksum and their arrays' data. So once one record has been walked with every check, a run of
records of its size is checked in bulk: the bytes they must share compared in one NumPy
comparison, the keys (plain ASCII, distinct) and header
checksums computed as arrays, each record's data against the index's checksum, and the arrays
handed out as strided views of the bytes read.

A run of a few records is checked one record at a time instead, the same checks as byte
comparisons: NumPy's cost tens of microseconds however few the records, and a set whose pieces
hold a record or two (many small sets mixed, many small shards) paid them for every record.

A run that differs from the layout in any byte it must share, or fails any check, is not read
here at all: the caller walks it one record at a time, so every error, and what the skip policy
keeps, is exactly what the walk says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xxhash

from .codec import ROWS_FIELD
from .tar import BLOCK
from .walk import WalkedRecord

_SUFFIX = b".msgpack"
_CHECKSUM_DIGITS = (148, 154)  # then NUL and space, bytes the records share
#: Bytes a key may hold here (else the walk reads the run): ASCII letters, digits, ``-`` and ``_``.
_KEY_BYTES = np.zeros(256, dtype=bool)
for _allowed in (b"0123456789", b"abcdefghijklmnopqrstuvwxyz", b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"-_"):
    _KEY_BYTES[np.frombuffer(_allowed, np.uint8)] = True
#: The value of each byte as an octal digit, -1 for bytes that are not one.
_OCTAL_VALUE = np.full(256, -1, dtype=np.int64)
_OCTAL_VALUE[np.frombuffer(b"01234567", np.uint8)] = np.arange(8)
_OCTAL_POWERS = 8 ** np.arange(5, -1, -1, dtype=np.int64)
_KEY_CHARACTERS = bytes(np.flatnonzero(_KEY_BYTES).astype(np.uint8))
_OCTAL_DIGITS = b"01234567"
#: Runs of up to this many records are checked record by record (each a few byte comparisons):
#: past it, the NumPy checks of the whole run cost less.
FEW_RECORDS = 8
#: Layouts kept per reader: one per record size seen (a mix of a few shapes), then all forgotten.
KEEP_LAYOUTS = 8


@dataclass(frozen=True)
class ArrayPlace:
    """Where one field's array lies in a record, and what it is."""

    name: str
    offset: int  # of its first byte, from the record's first byte
    dtype: np.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # C order, as the walked record's array had them
    nbytes: int


@dataclass(frozen=True)
class RunLayout:
    """What every record of a run must share with a record walked with every check."""

    record_bytes: int  # header, member and padding
    shared: np.ndarray  # the positions of the bytes every record must share with it
    expected: np.ndarray  # its bytes there
    spans: tuple[tuple[int, bytes], ...]  # the same bytes: each run of them, and where it starts
    key_bytes: int  # the key is the first ``key_bytes`` of the tar name
    checksum_base: int  # the header's checksum less its key's bytes
    member: tuple[int, int]  # the byte range of the member's data (what the index checksums)
    arrays: tuple[ArrayPlace, ...]
    rows: int  # samples a record holds
    packed: bool  # whether it holds them as columns (and ``__rows__``, whose bytes the records share)


def run_layout(walked: WalkedRecord, record: memoryview) -> RunLayout | None:
    """The layout of ``walked``, whose bytes (header to padding) are ``record``; ``None`` when
    records like it cannot be checked in bulk: not one ``.msgpack`` member after one plain ustar
    header, a key of other bytes than ASCII letters, digits, ``-`` and ``_``, or a field that is
    not a non-empty array viewing the record's bytes (bfloat16 arrays are copies, numbers and
    strings have bytes of their own in each record; a packed record's ``__rows__`` is the same
    in each, and its ``__keys__``, given keys, are not arrays)."""
    members = walked.record.members
    columns = {name: value for name, value in walked.fields.items() if name != ROWS_FIELD}
    if set(members) != {"msgpack"} or len(record) < BLOCK or not all(
            isinstance(value, np.ndarray) and value.flags.c_contiguous and value.nbytes for value in columns.values()):
        return None  # (before anything costs: a reader of records unlike these asks for each read)
    header = bytes(record[:BLOCK])
    name = header[:100].split(b"\0", 1)[0]
    key = name[:-len(_SUFFIX)]
    if header[156:157] != b"0" or not name.endswith(_SUFFIX) or not key or not _KEY_BYTES[
            np.frombuffer(key, np.uint8)].all():
        return None
    if header[148:154].strip(b"01234567") or header[154:156] != b"\0 ":
        return None  # a checksum not written as six octal digits, NUL, space
    base = _address(record)
    data = members["msgpack"]
    member_start = _address(data) - base
    if member_start != BLOCK or len(record) != BLOCK + len(data) + (-len(data) % BLOCK):
        return None
    arrays = []
    for field, value in columns.items():
        start = _address(value) - base
        if not member_start <= start <= start + value.nbytes <= member_start + len(data):
            return None
        arrays.append(ArrayPlace(field, start, value.dtype, value.shape, value.strides, value.nbytes))
    holes = sorted([(0, len(key)), _CHECKSUM_DIGITS] + [(place.offset, place.offset + place.nbytes) for place in arrays])
    shared, spans, position = [], [], 0
    for start, stop in holes + [(len(record), len(record))]:
        if start < position:
            return None  # arrays that overlap (a hostile record can claim so): walk each
        shared.append(np.arange(position, start))
        if start > position:
            spans.append((position, bytes(record[position:start])))
        position = stop
    sums = np.frombuffer(header, np.uint8).astype(np.int64)
    checksum_base = int(sums.sum() - sums[148:156].sum() + 8 * ord(" ") - sums[:len(key)].sum())
    positions = np.concatenate(shared)
    return RunLayout(len(record), positions, np.frombuffer(record, np.uint8)[positions], tuple(spans), len(key),
                     checksum_base, (member_start, member_start + len(data)), tuple(arrays), walked.rows,
                     ROWS_FIELD in walked.fields)


def _address(buffer: memoryview | np.ndarray) -> int:
    array = buffer if isinstance(buffer, np.ndarray) else np.frombuffer(buffer, np.uint8)
    return int(array.__array_interface__["data"][0])


def read_run(layout: RunLayout, data: memoryview, starts: np.ndarray, checksums: np.ndarray | None
             ) -> dict[str, np.ndarray] | None:
    """The fields of the records that start at ``starts`` (from ``data``'s first byte, which is
    the first record's) as arrays with a row per record, viewing ``data``; ``None`` unless every
    record is laid out as ``layout`` says, with distinct keys and sound header checksums, and,
    given the index's ``checksums``, member data that matches them."""
    size, count = layout.record_bytes, len(starts)
    if not count or len(data) < count * size:
        return None
    sound = _few_sound if count <= FEW_RECORDS else _many_sound
    if not sound(layout, data, starts, checksums):
        return None
    return {place.name: np.ndarray((count, *place.shape), place.dtype, data, place.offset, (size, *place.strides))
            for place in layout.arrays}


def _many_sound(layout: RunLayout, data: memoryview, starts: np.ndarray, checksums: np.ndarray | None) -> bool:
    """:func:`read_run`'s checks of a run, as NumPy's on every record at once."""
    size, count = layout.record_bytes, len(starts)
    if not np.array_equal(starts, np.arange(count) * size):
        return False
    records = np.frombuffer(data, np.uint8, count * size).reshape(count, size)
    if not (records[:, layout.shared] == layout.expected).all():
        return False
    keys = records[:, :layout.key_bytes]
    if not _KEY_BYTES[keys].all():
        return False
    if len(set(np.ascontiguousarray(keys).view(f"S{layout.key_bytes}").ravel().tolist())) < count:
        return False  # (no key byte is NUL, so none is lost to the bytes dtype)
    digits = _OCTAL_VALUE[records[:, 148:154]]
    if (digits < 0).any() or not np.array_equal(digits @ _OCTAL_POWERS,
                                                  layout.checksum_base + keys.sum(axis=1, dtype=np.int64)):
        return False
    if checksums is not None:
        first, last = layout.member
        found = [xxhash.xxh3_64_intdigest(row) & 0xFFFFFFFF for row in records[:, first:last]]
        if not np.array_equal(np.asarray(found, np.int64), checksums.astype(np.int64)):
            return False
    return True


def _few_sound(layout: RunLayout, data: memoryview, starts: np.ndarray, checksums: np.ndarray | None) -> bool:
    """:func:`read_run`'s checks of a run, record by record: the same, as byte comparisons."""
    size, count = layout.record_bytes, len(starts)
    if starts.tolist() != list(range(0, count * size, size)) or (checksums is not None and len(checksums) != count):
        return False
    first, last = layout.member
    keys = set()
    for i, at in enumerate(range(0, count * size, size)):
        for start, expected in layout.spans:
            if bytes(data[at + start:at + start + len(expected)]) != expected:
                return False
        key = bytes(data[at:at + layout.key_bytes])
        digits = bytes(data[at + 148:at + 154])
        if key.translate(None, _KEY_CHARACTERS) or digits.translate(None, _OCTAL_DIGITS) or key in keys:
            return False
        keys.add(key)
        if int(digits, 8) != layout.checksum_base + sum(key):
            return False
        if checksums is not None and xxhash.xxh3_64_intdigest(data[at + first:at + last]) & 0xFFFFFFFF != int(
                checksums[i]):
            return False
    return True


class RunLayouts:
    """The layouts one reader has learnt, by record size."""

    def __init__(self) -> None:
        self.by_size: dict[int, RunLayout] = {}  # replaced, never changed: reader threads share it
        self.tried = False  # whether a record was walked to learn from (records with strings teach nothing)

    def read(self, data: memoryview, starts: np.ndarray, checksums: np.ndarray | None
             ) -> tuple[RunLayout, dict[str, np.ndarray]] | None:
        """:func:`read_run` with the layout of the run's record size, if one was learnt (a
        single record, which may be followed by the end of its archive, with any that fits),
        and that layout."""
        by_size = self.by_size
        if len(starts) > 1:
            layouts = [by_size.get(int(starts[1] - starts[0]))]
        else:
            layouts = [layout for size, layout in by_size.items() if size <= len(data)]
        for layout in layouts:
            fields = None if layout is None else read_run(layout, data, starts, checksums)
            if fields is not None:
                return layout, fields
        return None

    def learn(self, walked: WalkedRecord, record: memoryview) -> None:
        """Keep the layout of a record walked with every check (replacing one of its size)."""
        layout = run_layout(walked, record)
        if layout is None:
            return
        full = len(self.by_size) >= KEEP_LAYOUTS and layout.record_bytes not in self.by_size
        self.by_size = {**({} if full else self.by_size), layout.record_bytes: layout}
