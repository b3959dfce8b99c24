"""Sample codec: one record is one msgpack map ``field -> value``.

NumPy arrays travel as a msgpack extension (type 1) whose payload is a small header
(version, dtype, shape and the length of the padding that follows it), zero padding, and the
raw C-order bytes. The padding (under 16 bytes) puts the data at a multiple of 16 bytes from
the start of the record, and records start at 512-byte boundaries in a shard: decoded in place
with ``np.frombuffer``, the array is a view of the bytes read (no copy) and 16-byte aligned.
torch ``bfloat16`` tensors, which NumPy cannot hold, use extension type 2 with the same
layout and decode back to torch ``bfloat16`` tensors. Other torch tensors are stored as
their NumPy equivalent.

Python scalars, ``str``, ``bytes``, lists and dicts are native msgpack. Nothing else is
accepted: pickle is never used, so decoding a shard can never execute code.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import msgpack
import numpy as np

from .errors import SampleError
from .msgpack_walk import (
    BFLOAT16_EXT,
    CONTAINER_TAGS,
    EXT_FIXED,
    EXT_TYPES,
    EXT_WIDTH,
    NUMPY_EXT,
    declared_length,
    decode_container,
    ext_code,
    field_name,
    object_end,
    starts_a_map,
)
from .numbers import outside_int64
from .tar import DEFAULT_MAX_MEMBER_BYTES
from .tensors import resolved

_PAYLOAD_VERSION = 2
_ALIGN = 16
_HEAD = struct.Struct("<BBBB")  # payload version, len(dtype str), ndim, bytes of padding

#: The most bytes a record may take: what every reader takes of a tar member.
MAX_RECORD_BYTES = DEFAULT_MAX_MEMBER_BYTES
#: Reserved keys of a packed record: rows in the record and (optionally) their keys.
ROWS_FIELD = "__rows__"
KEYS_FIELD = "__keys__"

_SUPPORTED_KINDS = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8)}


class _Unsupported(TypeError):
    """Raised inside the msgpack ``default`` hook; turned into a SampleError by the caller."""


def check_dtype(dtype: np.dtype) -> np.dtype:
    """Return the little-endian form of ``dtype``, or raise if the format cannot store it.

    Supported: bool, int8..int64, uint8..uint64, float16/32/64.
    """
    dtype = np.dtype(dtype)
    sizes = _SUPPORTED_KINDS.get(dtype.kind)
    if sizes is None or dtype.itemsize not in sizes or dtype.fields is not None:
        raise _Unsupported(
            f"unsupported array dtype {dtype} (supported: bool, int8-64, uint8-64, float16/32/64)"
        )
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


@lru_cache(maxsize=4096)
def _array_head(shape: tuple[int, ...], dtype_str: str) -> bytes:
    """Our header of an array payload, unpadded: version, dtype, shape."""
    if len(shape) > 255:
        raise _Unsupported(f"array with {len(shape)} dimensions (at most 255)")
    head = _HEAD.pack(_PAYLOAD_VERSION, len(dtype_str), len(shape), 0) + dtype_str.encode("ascii")
    return head + struct.pack(f"<{len(shape)}Q", *shape)


def _with_padding(head: bytes, pad: int) -> bytes:
    return head[:3] + bytes((pad,)) + head[4:] + b"\0" * pad


@lru_cache(maxsize=4096)  # (a writer's records mostly have arrays of a few shapes at a few places)
def _padded(head: bytes, code: int, data_bytes: int, position: int | None) -> tuple[bytes, bytes]:
    """``(extension header, header with its padding)`` such that the array data starts at a
    multiple of 16 bytes from the start of the record (``position``: where the extension
    header goes), or of the payload when the position is unknown. The header records the
    padding, so a reader finds the data exactly and a truncated payload cannot pass."""
    if position is None:
        head = _with_padding(head, -len(head) % _ALIGN)
        return _ext_header(code, len(head) + data_bytes), head
    ext = _ext_header(code, len(head) + data_bytes)
    for _ in range(4):  # the padding may move the length into another size class: settle it
        pad = -(position + len(ext) + len(head)) % _ALIGN
        settled = _ext_header(code, len(head) + pad + data_bytes)
        if len(settled) == len(ext):
            return settled, _with_padding(head, pad)
        ext = settled
    head = _with_padding(head, -len(head) % _ALIGN)
    return _ext_header(code, len(head) + data_bytes), head


def _raw_bytes(arr: np.ndarray) -> memoryview | bytes:
    """The C-order bytes of ``arr``, without a copy when it is already C-contiguous."""
    data = np.ascontiguousarray(arr)
    return memoryview(data.reshape(-1)).cast("B") if data.size else b""


def array_parts(value: Any) -> tuple[int, bytes, memoryview | bytes]:
    """``(extension type, unpadded header, raw bytes)`` of an ndarray, NumPy scalar or torch
    tensor."""
    if type(value).__module__ == "torch":
        import torch

        tensor = resolved(value)
        if tensor.dtype == torch.bfloat16:
            bits = tensor.contiguous().view(torch.int16).numpy()
            return BFLOAT16_EXT, _array_head(bits.shape, "bf16"), _raw_bytes(bits)
        value = tensor.numpy()
    arr = np.asarray(value)
    dtype = check_dtype(arr.dtype)
    if dtype != arr.dtype:
        arr = arr.astype(dtype)
    return NUMPY_EXT, _array_head(arr.shape, dtype.str), _raw_bytes(arr)


def _is_array(value: Any) -> bool:
    """Arrays, NumPy scalars (as 0-d arrays) and tensors; not NumPy's strings (``names[i]`` of an
    array of them), which are ``str`` (``bytes``) and stored so."""
    return isinstance(value, np.ndarray) or (isinstance(value, np.generic) and not isinstance(value, np.character)) or (
        type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter"))


def _default(obj: Any) -> Any:
    """msgpack ``default`` hook: the only conversions we allow beyond native types."""
    if _is_array(obj):  # an array inside a list or map: padded relative to its own payload
        code, head, data = array_parts(obj)
        _, head = _padded(head, code, len(data), None)
        return msgpack.ExtType(code, head + bytes(data))
    if isinstance(obj, tuple):
        return list(obj)
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, (bytes, bytearray, memoryview)):  # (NumPy's bytes_, a subclass, among them)
        return bytes(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    raise _Unsupported(f"unsupported type {type(obj).__module__}.{type(obj).__qualname__}")


_MAP_TAGS = re.compile(rb"[\x80-\x8f\xde\xdf]")  # the bytes a msgpack map starts with (among others)


def _check_map_keys(packed: bytes, value: Any) -> None:
    """Refuse a dict key that is not ``str`` (or ``bytes``) anywhere in ``value``: msgpack writes
    one (``{1: "a"}``), but the reader's msgpack (``strict_map_key``) refuses it, so the record
    would be written and then fail every read. Checked by reading ``packed`` back as the reader
    does, at C speed, where it may hold a map at all; only an error walks ``value`` for the key."""
    if not _MAP_TAGS.search(packed):
        return
    try:
        msgpack.unpackb(packed, raw=False, strict_map_key=True)  # (arrays come back as unread ExtTypes)
    except ValueError as exc:
        raise _Unsupported(f"{_bad_map_key(value) or exc}; the keys of a dict in a shard are str (or bytes): "
                           f"write str(key)") from None


def _bad_map_key(value: Any) -> str | None:
    """The first dict key in ``value`` that is not ``str`` or ``bytes``, in words."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            bad = [name for name in item if not isinstance(name, (str, bytes))]
            if bad:
                return f"dict key {bad[0]!r} ({type(bad[0]).__name__}) is not allowed"
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None


def check_field_names(fields: Mapping[str, Any], key: str) -> None:
    """Field names are non-empty strings; names starting with ``__`` are reserved."""
    for name in fields:
        if not isinstance(name, str) or not name:
            raise SampleError(f"record {key!r}: field names must be non-empty strings, got {name!r}")
        if name.startswith("__"):
            raise SampleError(f"record {key!r}: field name {name!r} is reserved (starts with '__')")


_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}


def _ext_header(code: int, length: int) -> bytes:
    """msgpack's header of an extension of ``length`` bytes (the same bytes ``packb`` writes)."""
    if length in _FIXEXT:
        return bytes((_FIXEXT[length], code))
    if length < 1 << 8:
        return bytes((0xC7, length, code))
    if length < 1 << 16:
        return b"\xc8" + struct.pack(">HB", length, code)
    return b"\xc9" + struct.pack(">IB", length, code)


def _map_header(size: int) -> bytes:
    if size < 16:
        return bytes((0x80 | size,))
    return b"\xde" + struct.pack(">H", size) if size < 1 << 16 else b"\xdf" + struct.pack(">I", size)


@lru_cache(maxsize=4096)
def _packed_name(name: str) -> bytes:
    return msgpack.packb(name, use_bin_type=True)


def encode_parts(fields: Mapping[str, Any], key: str) -> list[bytes | memoryview]:
    """A record's msgpack map as a list of buffers whose concatenation is exactly what
    ``msgpack.packb`` gives; array data is referenced, not copied, so a writer can hand it
    to the kernel directly. Errors name the key and the field."""
    parts: list[bytes | memoryview] = [_map_header(len(fields))]
    position = len(parts[0])
    for name, value in fields.items():
        try:
            parts.append(_packed_name(name))
            position += len(parts[-1])
            if _is_array(value):
                code, head, data = array_parts(value)
                _check_record_size(position + len(head) + len(data))  # (before an extension header of over 4 GiB)
                ext, head = _padded(head, code, len(data), position)
                parts += (ext, head, data)
                position += len(ext) + len(head) + len(data)
            else:
                parts.append(msgpack.packb(value, default=_default, use_bin_type=True, strict_types=True))
                if isinstance(value, (list, tuple, Mapping)):  # (nothing else holds a map)
                    _check_map_keys(parts[-1], value)
                position += len(parts[-1])
            _check_record_size(position)
        except (_Unsupported, TypeError, ValueError, OverflowError) as exc:
            raise SampleError(f"record {key!r}, field {name!r}: {exc}") from None
    return parts


def _check_record_size(size: int) -> None:
    """Refuse a record of more bytes than readers take (a shard holding it could never be read)."""
    if size > MAX_RECORD_BYTES:
        raise _Unsupported(f"the record reaches {size:,} bytes, beyond the {MAX_RECORD_BYTES:,} (4 GiB) a record may "
                           f"hold; store the data in several samples (arrays of fewer rows), or, where a record "
                           f"holds several samples, build with a smaller pack")


def encode_fields(fields: Mapping[str, Any], key: str) -> bytes:
    """Encode one record's map of fields to msgpack bytes; errors name the key and field."""
    return b"".join(encode_parts(fields, key))


def encode_sample(sample: Mapping[str, Any], key: str = "?") -> bytes:
    """Encode one sample (a mapping of field name to value) as a record payload."""
    if not isinstance(sample, Mapping):
        raise SampleError(f"record {key!r}: a sample must be a mapping of field -> value, "
                          f"got {type(sample).__name__}")
    check_field_names(sample, key)
    for name, value in sample.items():
        if outside_int64(value):
            raise SampleError(f"record {key!r}, field {name!r}: {value} does not fit int64, the integers of a "
                              f"batch's tensor; store it as np.uint64 (an ID under 2**64) or as str")
    return encode_fields(sample, key)


#: The dtype strings an array payload may carry: exactly those the encoder writes (``dtype.str``
#: of the little-endian form). Decoding looks them up, never parses a dtype description.
_STORED_DTYPES = {dtype.str.encode("ascii"): dtype for dtype in (
    np.dtype(name).newbyteorder("<") for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                                  "uint32", "uint64", "float16", "float32", "float64"))}
_BFLOAT16_BITS = np.dtype("<i2")
_MAX_DIMS = 64  # NumPy's limit
_MAX_ARRAY_BYTES = 2**63 - 1


def array_view(buffer: bytes | memoryview, dtype: np.dtype, shape: Sequence[int], offset: int,
               fortran: bool = False) -> np.ndarray:
    """The ``shape`` array of ``dtype`` stored at ``buffer[offset:]``, as a view (no copy).

    Whatever the header that gave ``shape`` claims, the array must need exactly the bytes that
    follow ``offset``: a hostile shape can neither make the reader allocate memory nor read
    past its record, and an overflowing or negative one is a SampleError, not a NumPy error.
    """
    if dtype.itemsize == 0:
        raise SampleError(f"array of dtype {dtype.str}, whose items have no bytes")
    if len(shape) > _MAX_DIMS:
        raise SampleError(f"array of {len(shape)} dimensions (NumPy allows {_MAX_DIMS})")
    if shape and min(shape) < 0:
        raise SampleError(f"array shape {tuple(shape)} has a negative dimension")
    needed = math.prod(shape) * dtype.itemsize
    if needed != len(buffer) - offset:
        raise SampleError(f"array of shape {tuple(shape)} and dtype {dtype.str} needs {needed} bytes, "
                          f"has {len(buffer) - offset}")
    if not needed and math.prod(max(d, 1) for d in shape) * dtype.itemsize > _MAX_ARRAY_BYTES:
        raise SampleError(f"array shape {tuple(shape)} of {dtype.str} overflows a 64-bit size")
    flat = np.frombuffer(buffer, dtype=dtype, count=needed // dtype.itemsize, offset=offset)
    return flat.reshape(tuple(shape)[::-1]).T if fortran else flat.reshape(shape)


def _decode_array_payload(data: bytes | memoryview) -> tuple[bytes, tuple[int, ...], int]:
    """``(dtype string, shape, offset of the data)`` of an array extension's payload."""
    if len(data) < _HEAD.size:
        raise SampleError(f"array extension of {len(data)} bytes is shorter than its header")
    version, dtype_len, ndim, pad = _HEAD.unpack_from(data)
    if version != _PAYLOAD_VERSION:
        raise SampleError(f"array extension version {version} is not supported (this library reads version "
                          f"{_PAYLOAD_VERSION}): another version of this library wrote the record; build the set "
                          f"again from its inputs with this one, or read it with that one")
    if pad >= _ALIGN:
        raise SampleError(f"array extension claims {pad} bytes of padding (at most {_ALIGN - 1})")
    head_len = _HEAD.size + dtype_len + 8 * ndim
    if len(data) < head_len + pad:
        raise SampleError("array extension truncated inside its header")
    if data[head_len:head_len + pad] != bytes(pad):
        raise SampleError("array extension has non-zero padding")
    shape = struct.unpack_from(f"<{ndim}Q", data, _HEAD.size + dtype_len)
    return bytes(data[_HEAD.size:_HEAD.size + dtype_len]), shape, head_len + pad


def _ext_hook(code: int, data: bytes | memoryview) -> Any:
    if code not in EXT_TYPES:
        raise SampleError(f"unknown msgpack extension type {code}")
    dtype_str, shape, offset = _decode_array_payload(data)
    if code == NUMPY_EXT:
        dtype = _STORED_DTYPES.get(dtype_str)
    else:
        dtype = _BFLOAT16_BITS if dtype_str == b"bf16" else None
    if dtype is None:
        raise SampleError(f"array extension has bad dtype {dtype_str[:40]!r} "
                          f"(records store {', '.join(d.decode() for d in _STORED_DTYPES)} or bf16)")
    arr = array_view(data, dtype, shape, offset)
    if code == BFLOAT16_EXT:
        import torch

        return torch.from_numpy(arr.copy()).view(torch.bfloat16)
    return arr


def _field_value(view: memoryview, pos: int, end: int, name: str) -> Any:
    """The value in ``view[pos:end]``: an array field as a view of ``view`` itself (msgpack
    would first copy the extension's bytes), anything else through msgpack."""
    tag = view[pos]
    try:
        if tag in EXT_FIXED or tag in EXT_WIDTH:
            start = pos + 2 + EXT_WIDTH.get(tag, 0)
            return _ext_hook(ext_code(view, start - 1), view[start:end])
        return msgpack.unpackb(view[pos:end], ext_hook=_ext_hook, raw=False, strict_map_key=True)
    except SampleError as exc:
        raise SampleError(f"field {name!r}: {exc}") from None
    except msgpack.StackError:
        raise SampleError(f"field {name!r}: nested too deeply for msgpack") from None
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise SampleError(f"field {name!r}: not valid msgpack: {type(exc).__name__}: {exc}") from None


def _not_a_map(view: memoryview) -> str:
    """Why a record's bytes that do not start a msgpack map are no record."""
    if not len(view):
        return "not a valid msgpack record: empty"
    if view[0] == 0xC1:
        return "not a valid msgpack record: it starts with byte 0xc1"
    return f"a record must be a msgpack map, this one starts with byte 0x{view[0]:02x}"


def decode_record(data: bytes | memoryview) -> dict[str, Any]:
    """Decode a record payload into its map of fields; arrays are read-only views of ``data``
    (no copy: keep ``data`` alive as long as them, which they do by reference).

    Whatever the bytes, the result is a map of distinct string field names or a SampleError:
    declared lengths are bounded by the record's bytes before anything is allocated (by the walk
    of its headers, or by the limits msgpack's decoder is given), so values cost memory in
    proportion to the record's own bytes: arrays nothing (they are views), other values at most
    about 72 bytes of Python objects per byte (an empty map: 1 byte, a dict).

    Also the one-line decoder that lets ``webdataset`` read our shards:
    ``wds.WebDataset(url).decode(wds.handle_extension("msgpack", decode_record))``.
    """
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
    first = view[0] if len(view) else 0xC1
    if not starts_a_map(first):
        raise SampleError(_not_a_map(view))
    if first <= 0x8F:
        count, pos = first & 0x0F, 1
    else:
        width = 2 if first == 0xDE else 4
        count, pos = declared_length(view, 0, width), 1 + width
    fields: dict[str, Any] = {}
    for _ in range(count):
        name, pos = field_name(view, pos)
        if name in fields:
            raise SampleError(f"field {name!r} appears twice")
        decoded = decode_container(view, pos, ext_hook=_ext_hook, raw=False, strict_map_key=True) \
            if pos < len(view) and view[pos] in CONTAINER_TAGS else None
        if decoded is None:
            end = object_end(view, pos)
            decoded = _field_value(view, pos, end, name), end
        fields[name], pos = decoded
    if pos != len(view):
        raise SampleError(f"{len(view) - pos} bytes after the record's map")
    return fields
