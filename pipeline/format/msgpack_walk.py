"""Walking a msgpack record by its headers alone: where each object ends, and the field names.

Decoding a record (``codec.decode_record``) needs the bounds of each field's value, so that
declared lengths are checked against the record's bytes and an array field can be a view of
the record itself. These functions find those bounds without allocating and without
recursion; ``decode_container`` finds them with msgpack's C decoder where that is safe, as
walking a long list of strings in Python costs more than decoding it.
"""

from __future__ import annotations

from typing import Any

import msgpack

from .errors import SampleError

#: The extension types records use: NumPy arrays and torch bfloat16 tensors (see ``codec``).
NUMPY_EXT = 1
BFLOAT16_EXT = 2
EXT_TYPES = (NUMPY_EXT, BFLOAT16_EXT)

# Header bytes by kind: fixext (payload size), ext 8/16/32 and str 8/16/32 (bytes of the length),
# and objects of a fixed size (nil, bools, numbers: header included).
EXT_FIXED = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
EXT_WIDTH = {0xC7: 1, 0xC8: 2, 0xC9: 4}
STR_WIDTH = {0xD9: 1, 0xDA: 2, 0xDB: 4}
#: Header bytes of long lists and maps (16 items or more: a short one has a one-byte header), which
#: msgpack's C decoder ends sooner than the walk; for a short one, setting it up costs more.
CONTAINER_TAGS = frozenset((0xDC, 0xDD, 0xDE, 0xDF))
#: Types of values that hold no extension: a list or map of these holds no timestamp that
#: msgpack made of an extension of type -1 (which records never hold), so needs no walk.
_PLAIN = frozenset({str, bytes, int, float, bool, type(None)})
#: Bytes first handed to the C decoder; it gets more (doubling) until the object is whole, so
#: the bytes copied are at most about twice the object's (not the rest of the record's).
_FIRST_FEED = 1 << 12
FIXED_SIZES = {0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCC: 2, 0xD0: 2, 0xCD: 3, 0xD1: 3, 0xCA: 5, 0xCE: 5, 0xD2: 5,
                0xCB: 9, 0xCF: 9, 0xD3: 9}


#: Header bytes of maps that are not fixmaps (0x80-0x8f): map16 and map32.
MAP_TAGS = (0xDE, 0xDF)


def starts_a_map(first: int) -> bool:
    """Whether a msgpack object whose first byte is ``first`` is a map (fixmap, map16, map32)."""
    return 0x80 <= first <= 0x8F or first in MAP_TAGS


def declared_length(view: memoryview, pos: int, size: int) -> int:
    """The big-endian length of ``size`` bytes that follows the header byte at ``pos``."""
    if pos + 1 + size > len(view):
        raise SampleError(f"record truncated inside a length at byte {pos}")
    return int.from_bytes(view[pos + 1:pos + 1 + size], "big")


def ext_code(view: memoryview, at: int) -> int:
    """The (signed) type of the extension whose type byte is at ``at``, if it is one of ours:
    msgpack would turn others (type -1, timestamps) into values we never wrote."""
    if at >= len(view):
        raise SampleError(f"record truncated inside an extension header at byte {at}")
    code = view[at] - 256 if view[at] >= 0x80 else view[at]
    if code not in EXT_TYPES:
        raise SampleError(f"unknown msgpack extension type {code} at byte {at}")
    return code


def object_end(view: memoryview, pos: int) -> int:
    """Where the msgpack object at ``pos`` ends, walking headers only (no allocation, no
    recursion: any depth of nesting is fine); every step consumes at least one byte, so
    hostile lengths cannot make it loop long. Extensions other than ours are refused here."""
    pending = 1
    while pending:
        if pos >= len(view):
            raise SampleError(f"record truncated at byte {len(view)}")
        b = view[pos]
        pending -= 1
        if b <= 0x7F or b >= 0xE0:
            pos += 1
        elif b in FIXED_SIZES:
            pos += FIXED_SIZES[b]
        elif b <= 0x8F:
            pending, pos = pending + 2 * (b & 0x0F), pos + 1
        elif b <= 0x9F:
            pending, pos = pending + (b & 0x0F), pos + 1
        elif b <= 0xBF:
            pos += 1 + (b & 0x1F)
        elif b in (0xC4, 0xD9):
            pos += 2 + declared_length(view, pos, 1)
        elif b in (0xC5, 0xDA):
            pos += 3 + declared_length(view, pos, 2)
        elif b in (0xC6, 0xDB):
            pos += 5 + declared_length(view, pos, 4)
        elif b in EXT_FIXED:
            ext_code(view, pos + 1)
            pos += 2 + EXT_FIXED[b]
        elif b in EXT_WIDTH:
            width = EXT_WIDTH[b]
            length = declared_length(view, pos, width)
            ext_code(view, pos + 1 + width)
            pos += 2 + width + length
        elif b in (0xDC, 0xDD):
            width = 2 if b == 0xDC else 4
            pending, pos = pending + declared_length(view, pos, width), pos + 1 + width
        elif b in (0xDE, 0xDF):
            width = 2 if b == 0xDE else 4
            pending, pos = pending + 2 * declared_length(view, pos, width), pos + 1 + width
        else:
            raise SampleError(f"invalid msgpack byte 0x{b:02x} at byte {pos}")
    if pos > len(view):
        raise SampleError(f"record truncated: an object ends at byte {pos}, the record at {len(view)}")
    return pos


def field_name(view: memoryview, pos: int) -> tuple[str, int]:
    """The field name at ``pos`` and where it ends; names are strings (as encoding requires)."""
    tag = view[pos] if pos < len(view) else None
    if tag is not None and 0xA0 <= tag <= 0xBF:
        start, end = pos + 1, pos + 1 + (tag & 0x1F)
    elif tag in STR_WIDTH:
        start = pos + 1 + STR_WIDTH[tag]
        end = start + declared_length(view, pos, STR_WIDTH[tag])
    elif tag is None:
        raise SampleError(f"record truncated at byte {pos}")
    else:
        raise SampleError(f"field names must be strings, the one at byte {pos} has msgpack type 0x{tag:02x}")
    if end > len(view):
        raise SampleError(f"record truncated inside a field name at byte {pos}")
    try:
        return str(view[start:end], "utf-8"), end
    except UnicodeDecodeError:
        raise SampleError(f"field name at byte {pos} is not UTF-8") from None


def _holds_only_plain(value: Any) -> bool:
    if type(value) is list:
        return set(map(type, value)) <= _PLAIN
    return type(value) is dict and set(map(type, value.values())) <= _PLAIN  # keys: str or bytes


def decode_container(view: memoryview, pos: int, **unpack_options: Any) -> tuple[Any, int] | None:
    """The list or map at ``pos`` decoded by msgpack (with ``unpack_options``) and where it
    ends, or None where msgpack cannot decode it (the caller's walk then says why). Lengths
    are bounded by the record's bytes as the walk bounds them; a value that holds lists, maps
    or extensions is also walked (``object_end``), which refuses the extensions records never
    hold and msgpack would turn into values (type -1, timestamps)."""
    rest = view[pos:]
    if not rest:
        return None
    unpacker = msgpack.Unpacker(max_buffer_size=len(rest), read_size=min(len(rest), _FIRST_FEED), **unpack_options)
    fed = 0
    while True:
        more = min(len(rest), max(_FIRST_FEED, 2 * fed))
        unpacker.feed(rest[fed:more])
        fed = more
        try:
            value = unpacker.unpack()
            break
        except msgpack.OutOfData:
            if fed == len(rest):
                return None
        except Exception:  # msgpack raises several unrelated types on bad input: the walk tells
            return None
    if not _holds_only_plain(value):
        object_end(view, pos)  # refuses the extensions msgpack decoded and records never hold
    return value, pos + unpacker.tell()
