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
import struct
from functools import lru_cache
from typing import Any, Mapping

import msgpack
import numpy as np

from .errors import SampleError

NUMPY_EXT = 1
BFLOAT16_EXT = 2
_PAYLOAD_VERSION = 2
_ALIGN = 16
_HEAD = struct.Struct("<BBBB")  # payload version, len(dtype str), ndim, bytes of padding

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


def _array_head(arr: np.ndarray, dtype_str: str) -> bytes:
    """Our header of an array payload, unpadded: version, dtype, shape."""
    if arr.ndim > 255:
        raise _Unsupported(f"array with {arr.ndim} dimensions (at most 255)")
    head = _HEAD.pack(_PAYLOAD_VERSION, len(dtype_str), arr.ndim, 0) + dtype_str.encode("ascii")
    return head + struct.pack(f"<{arr.ndim}Q", *arr.shape)


def _with_padding(head: bytes, pad: int) -> bytes:
    return head[:3] + bytes((pad,)) + head[4:] + b"\0" * pad


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

        tensor = value.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            bits = tensor.contiguous().view(torch.int16).numpy()
            return BFLOAT16_EXT, _array_head(bits, "bf16"), _raw_bytes(bits)
        value = tensor.numpy()
    arr = np.asarray(value)
    dtype = check_dtype(arr.dtype)
    if dtype != arr.dtype:
        arr = arr.astype(dtype)
    return NUMPY_EXT, _array_head(arr, dtype.str), _raw_bytes(arr)


def _is_array(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic)) or (
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
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    raise _Unsupported(f"unsupported type {type(obj).__module__}.{type(obj).__qualname__}")


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
                ext, head = _padded(head, code, len(data), position)
                parts += (ext, head, data)
                position += len(ext) + len(head) + len(data)
            else:
                parts.append(msgpack.packb(value, default=_default, use_bin_type=True, strict_types=True))
                position += len(parts[-1])
        except (_Unsupported, TypeError, ValueError, OverflowError) as exc:
            raise SampleError(f"record {key!r}, field {name!r}: {exc}") from None
    return parts


def encode_fields(fields: Mapping[str, Any], key: str) -> bytes:
    """Encode one record's map of fields to msgpack bytes; errors name the key and field."""
    return b"".join(encode_parts(fields, key))


def encode_sample(sample: Mapping[str, Any], key: str = "?") -> bytes:
    """Encode one sample (a mapping of field name to value) as a record payload."""
    if not isinstance(sample, Mapping):
        raise SampleError(f"record {key!r}: a sample must be a mapping of field -> value, "
                          f"got {type(sample).__name__}")
    check_field_names(sample, key)
    return encode_fields(sample, key)


def _decode_array_payload(data: bytes) -> tuple[str, tuple[int, ...], int]:
    if len(data) < _HEAD.size:
        raise SampleError(f"array extension of {len(data)} bytes is shorter than its header")
    version, dtype_len, ndim, pad = _HEAD.unpack_from(data)
    if version != _PAYLOAD_VERSION:
        raise SampleError(f"array extension version {version} is not supported")
    head_len = _HEAD.size + dtype_len + 8 * ndim
    if len(data) < head_len:
        raise SampleError("array extension truncated inside its header")
    dtype_str = bytes(data[_HEAD.size:_HEAD.size + dtype_len]).decode("ascii", "replace")
    shape = struct.unpack_from(f"<{ndim}Q", data, _HEAD.size + dtype_len)
    if pad >= _ALIGN:
        raise SampleError(f"array extension claims {pad} bytes of padding (at most {_ALIGN - 1})")
    return dtype_str, shape, head_len + pad


def _ext_hook(code: int, data: bytes) -> Any:
    if code not in (NUMPY_EXT, BFLOAT16_EXT):
        raise SampleError(f"unknown msgpack extension type {code}")
    dtype_str, shape, offset = _decode_array_payload(data)
    if code == NUMPY_EXT:
        try:
            dtype = check_dtype(np.dtype(dtype_str))
        except (TypeError, _Unsupported) as exc:
            raise SampleError(f"array extension has bad dtype {dtype_str!r}: {exc}") from None
    else:
        dtype = np.dtype("<i2")
    count = math.prod(shape)
    if count * dtype.itemsize != len(data) - offset:
        raise SampleError(
            f"array extension of shape {tuple(shape)} and dtype {dtype_str} needs "
            f"{count * dtype.itemsize} bytes, has {len(data) - offset}"
        )
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
    if code == BFLOAT16_EXT:
        import torch

        return torch.from_numpy(arr.copy()).view(torch.bfloat16)
    return arr


_EXT_FIXED = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_FIXED_SIZES = {0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCC: 2, 0xD0: 2, 0xCD: 3, 0xD1: 3, 0xCA: 5, 0xCE: 5, 0xD2: 5,
                0xCB: 9, 0xCF: 9, 0xD3: 9}


class _Generic(Exception):
    """The record is not a plain map with string keys: decode it the generic way."""


def _length(view: memoryview, pos: int, size: int) -> int:
    if pos + 1 + size > len(view):
        raise SampleError("record truncated inside a length")
    return int.from_bytes(view[pos + 1:pos + 1 + size], "big")


def _object_end(view: memoryview, pos: int) -> int:
    """Where the msgpack object at ``pos`` ends, walking headers only (no allocation); every
    step consumes at least one byte, so hostile lengths cannot make it loop long."""
    pending = 1
    while pending:
        if pos >= len(view):
            raise SampleError("record truncated")
        b = view[pos]
        pending -= 1
        if b <= 0x7F or b >= 0xE0:
            pos += 1
        elif b in _FIXED_SIZES:
            pos += _FIXED_SIZES[b]
        elif b <= 0x8F:
            pending, pos = pending + 2 * (b & 0x0F), pos + 1
        elif b <= 0x9F:
            pending, pos = pending + (b & 0x0F), pos + 1
        elif b <= 0xBF:
            pos += 1 + (b & 0x1F)
        elif b in (0xC4, 0xD9):
            pos += 2 + _length(view, pos, 1)
        elif b in (0xC5, 0xDA):
            pos += 3 + _length(view, pos, 2)
        elif b in (0xC6, 0xDB):
            pos += 5 + _length(view, pos, 4)
        elif b in _EXT_FIXED:
            pos += 2 + _EXT_FIXED[b]
        elif b in (0xC7, 0xC8, 0xC9):
            width = {0xC7: 1, 0xC8: 2, 0xC9: 4}[b]
            pos += 2 + width + _length(view, pos, width)
        elif b in (0xDC, 0xDD):
            width = 2 if b == 0xDC else 4
            pending, pos = pending + _length(view, pos, width), pos + 1 + width
        elif b in (0xDE, 0xDF):
            width = 2 if b == 0xDE else 4
            pending, pos = pending + 2 * _length(view, pos, width), pos + 1 + width
        else:
            raise SampleError(f"invalid msgpack byte 0x{b:02x}")
    if pos > len(view):
        raise SampleError("record truncated")
    return pos


def _decode_map_in_place(view: memoryview) -> dict[str, Any]:
    """A record whose top level is a map of string keys, its array fields decoded as views of
    ``view`` itself: msgpack would first copy each extension's bytes."""
    first = view[0]
    if 0x80 <= first <= 0x8F:
        count, pos = first & 0x0F, 1
    elif first in (0xDE, 0xDF):
        width = 2 if first == 0xDE else 4
        count, pos = _length(view, 0, width), 1 + width
    else:
        raise _Generic
    fields: dict[str, Any] = {}
    for _ in range(count):
        end = _object_end(view, pos)
        key = msgpack.unpackb(view[pos:end], raw=False)
        if not isinstance(key, str):
            raise _Generic
        pos = end
        end = _object_end(view, pos)
        tag = view[pos]
        if tag in _EXT_FIXED or tag in (0xC7, 0xC8, 0xC9):
            width = {0xC7: 1, 0xC8: 2, 0xC9: 4}.get(tag, 0)
            start = pos + 2 + width
            fields[key] = _ext_hook(view[start - 1], view[start:end])
        else:
            fields[key] = msgpack.unpackb(view[pos:end], ext_hook=_ext_hook, raw=False, strict_map_key=True)
        pos = end
    if pos != len(view):
        raise SampleError(f"{len(view) - pos} bytes after the record's map")
    return fields


def decode_record(data: bytes | memoryview) -> dict[str, Any]:
    """Decode a record payload into its map of fields; arrays are read-only views of ``data``
    (no copy: keep ``data`` alive as long as them, which they do by reference).

    Also the one-line decoder that lets ``webdataset`` read our shards:
    ``wds.WebDataset(url).decode(wds.handle_extension("msgpack", decode_record))``.
    """
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
    try:
        if len(view):
            return _decode_map_in_place(view)
    except (SampleError, _Generic):
        pass  # the generic decoder below says what is wrong, or decodes what is unusual
    except Exception:  # noqa: BLE001 - msgpack's own errors on a key: let the generic path name them
        pass
    try:
        fields = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=True)
    except SampleError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise SampleError(f"not a valid msgpack record: {type(exc).__name__}: {exc}") from None
    if not isinstance(fields, dict):
        raise SampleError(f"a record must be a msgpack map, got {type(fields).__name__}")
    return fields
