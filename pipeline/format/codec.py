"""Sample codec: one record is one msgpack map ``field -> value``.

NumPy arrays travel as a msgpack extension (type 1) whose payload is a small header
(dtype, shape) padded to 16 bytes, followed by the raw C-order bytes. Decoding is
``np.frombuffer`` over that payload: no copy beyond the one msgpack makes to hand us the
extension bytes, and the array data is 16-byte aligned because the header is.
torch ``bfloat16`` tensors, which NumPy cannot hold, use extension type 2 with the same
layout and decode back to torch ``bfloat16`` tensors. Other torch tensors are stored as
their NumPy equivalent.

Python scalars, ``str``, ``bytes``, lists and dicts are native msgpack. Nothing else is
accepted: pickle is never used, so decoding a shard can never execute code.
"""

from __future__ import annotations

import struct
from typing import Any, Mapping

import msgpack
import numpy as np

from .errors import SampleError

NUMPY_EXT = 1
BFLOAT16_EXT = 2
_PAYLOAD_VERSION = 1
_ALIGN = 16
_HEAD = struct.Struct("<BBB")  # payload version, len(dtype str), ndim

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


def _array_payload(arr: np.ndarray, dtype_str: str) -> bytes:
    if arr.ndim > 255:
        raise _Unsupported(f"array with {arr.ndim} dimensions (at most 255)")
    head = _HEAD.pack(_PAYLOAD_VERSION, len(dtype_str), arr.ndim) + dtype_str.encode("ascii")
    head += struct.pack(f"<{arr.ndim}Q", *arr.shape)
    head += b"\0" * (-len(head) % _ALIGN)
    data = np.ascontiguousarray(arr)
    return b"".join((head, memoryview(data).cast("B") if data.size else b""))


def encode_array(arr: np.ndarray) -> msgpack.ExtType:
    """The msgpack extension value that stores ``arr`` (any layout, copied to C order)."""
    dtype = check_dtype(arr.dtype)
    if dtype != arr.dtype:
        arr = arr.astype(dtype)
    return msgpack.ExtType(NUMPY_EXT, _array_payload(arr, dtype.str))


def _encode_tensor(tensor: Any) -> msgpack.ExtType:
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        bits = tensor.contiguous().view(torch.int16).numpy()
        return msgpack.ExtType(BFLOAT16_EXT, _array_payload(bits, "bf16"))
    return encode_array(tensor.numpy())


def _default(obj: Any) -> Any:
    """msgpack ``default`` hook: the only conversions we allow beyond native types."""
    if isinstance(obj, np.ndarray):
        return encode_array(obj)
    if isinstance(obj, np.generic):
        return encode_array(np.asarray(obj))
    if type(obj).__module__ == "torch" and type(obj).__name__ in ("Tensor", "Parameter"):
        return _encode_tensor(obj)
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


def _describe_failure(fields: Mapping[str, Any], key: str, exc: Exception) -> SampleError:
    """Find which field made packing fail, to name it in the error."""
    for name, value in fields.items():
        try:
            msgpack.packb(value, default=_default, use_bin_type=True, strict_types=True)
        except (_Unsupported, TypeError, ValueError, OverflowError) as field_exc:
            return SampleError(f"record {key!r}, field {name!r}: {field_exc}")
    return SampleError(f"record {key!r}: {exc}")


def check_field_names(fields: Mapping[str, Any], key: str) -> None:
    """Field names are non-empty strings; names starting with ``__`` are reserved."""
    for name in fields:
        if not isinstance(name, str) or not name:
            raise SampleError(f"record {key!r}: field names must be non-empty strings, got {name!r}")
        if name.startswith("__"):
            raise SampleError(f"record {key!r}: field name {name!r} is reserved (starts with '__')")


def encode_fields(fields: Mapping[str, Any], key: str) -> bytes:
    """Encode one record's map of fields to msgpack bytes; errors name the key and field."""
    try:
        return msgpack.packb(dict(fields), default=_default, use_bin_type=True, strict_types=True)
    except (_Unsupported, TypeError, ValueError, OverflowError) as exc:
        raise _describe_failure(fields, key, exc) from None


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
    version, dtype_len, ndim = _HEAD.unpack_from(data)
    if version != _PAYLOAD_VERSION:
        raise SampleError(f"array extension version {version} is not supported")
    head_len = _HEAD.size + dtype_len + 8 * ndim
    if len(data) < head_len:
        raise SampleError("array extension truncated inside its header")
    dtype_str = data[_HEAD.size:_HEAD.size + dtype_len].decode("ascii", "replace")
    shape = struct.unpack_from(f"<{ndim}Q", data, _HEAD.size + dtype_len)
    return dtype_str, shape, head_len + (-head_len % _ALIGN)


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
    count = int(np.prod(shape, dtype=np.uint64)) if shape else 1
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


def decode_record(data: bytes | memoryview) -> dict[str, Any]:
    """Decode a record payload into its map of fields (arrays are read-only views).

    Also the one-line decoder that lets ``webdataset`` read our shards:
    ``wds.WebDataset(url).decode(wds.handle_extension("msgpack", decode_record))``.
    """
    try:
        fields = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=True)
    except SampleError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise SampleError(f"not a valid msgpack record: {type(exc).__name__}: {exc}") from None
    if not isinstance(fields, dict):
        raise SampleError(f"a record must be a msgpack map, got {type(fields).__name__}")
    return fields
