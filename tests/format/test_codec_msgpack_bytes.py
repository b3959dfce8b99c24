"""The codec writes the very bytes msgpack.packb writes (encode_parts' contract): an extension
header of every size class, at the boundaries between them."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from pipeline.format.codec import _ext_header, decode_record, encode_fields


@pytest.mark.parametrize("length", [0, 1, 2, 3, 4, 8, 16, 17, 127, 128, 200, 255, 256, 65535, 65536])
def test_an_extension_header_is_msgpacks_own(length: int) -> None:
    packed = msgpack.packb(msgpack.ExtType(1, b"\0" * length))
    assert _ext_header(1, length) == packed[:len(packed) - length]


@pytest.mark.parametrize("items", [10, 20, 30, 100])  # payloads of about 100, 180, 260 and 820 bytes
def test_a_record_of_an_array_is_msgpacks_bytes_of_the_same_extension(items: int) -> None:
    payload = encode_fields({"a": np.arange(items, dtype=np.int64)}, "k")
    fields = msgpack.unpackb(payload, raw=False)  # the array comes back as its ExtType, unread
    assert msgpack.packb(fields, use_bin_type=True) == payload
    assert decode_record(payload)["a"].tolist() == list(range(items))
