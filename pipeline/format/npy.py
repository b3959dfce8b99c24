"""The ``.npy`` header, parsed in one place: for the ``.npy`` members of shards written by other
tools, and for the ``.npy`` files a build reads in place.

NumPy parses a header's dict with the Python compiler (tens of microseconds); samples of one
shape share their header, so a parsed header is kept (:func:`parse_header`) and a shard of a
million equally shaped ``.npy`` members parses one.
"""

from __future__ import annotations

import io
import warnings
from functools import lru_cache
from typing import Callable

import numpy as np

from .errors import SampleError

_MAGIC = b"\x93NUMPY"
_LENGTH_BYTES = {1: 2, 2: 4}  # the header length field, by major version
_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def read_header(read: Callable[[int], bytes]) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """dtype, shape, Fortran order, and where the data starts, of the ``.npy`` array whose
    bytes ``read(n)`` returns from its start; a malformed header is a :class:`SampleError`."""
    prefix = bytes(read(8))
    if len(prefix) < 8 or prefix[:6] != _MAGIC:
        raise SampleError("not a .npy array: no .npy magic at its start")
    width = _LENGTH_BYTES.get(prefix[6])
    if width is None:
        raise SampleError(f".npy format version {tuple(prefix[6:8])} is not supported")
    length_field = bytes(read(width))
    header = prefix + length_field + bytes(read(int.from_bytes(length_field, "little")))
    dtype, shape, fortran = parse_header(header)
    return dtype, shape, fortran, len(header)


@lru_cache(maxsize=1024)
def parse_header(header: bytes) -> tuple[np.dtype, tuple[int, ...], bool]:
    """dtype, shape and order of a whole ``.npy`` header (magic to padding), once per header."""
    stream = io.BytesIO(header)
    try:
        read = _READERS.get(np.lib.format.read_magic(stream))
        if read is None:
            raise SampleError(f".npy format version {tuple(header[6:8])} is not supported")
        with warnings.catch_warnings():  # a damaged header can read as one "created on Python 2"
            warnings.simplefilter("ignore")
            shape, fortran, dtype = read(stream)
    except SampleError:
        raise
    except Exception as exc:  # noqa: BLE001 - NumPy parses the header as Python source: any error may come
        raise SampleError(f"not a .npy array: {type(exc).__name__}: {exc}") from None
    if stream.tell() != len(header):
        raise SampleError("not a .npy array: its header is shorter than its length field says")
    if dtype.hasobject:
        raise SampleError(".npy array of Python objects: loading it would need pickle")
    return dtype, tuple(shape), fortran
