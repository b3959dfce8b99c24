"""Hostile and corrupt record payloads: msgpack, our array extension, foreign members, and records
that disagree with the index's schema. Each is our error, never a NumPy, msgpack or JSON one."""

from __future__ import annotations

import io
import re
import struct
import tracemalloc

import msgpack
import numpy as np
import pytest

from pipeline import SampleError, ShardError, decode_record
from pipeline.format.codec import BFLOAT16_EXT, NUMPY_EXT
from pipeline.format.conform import check_conforms
from pipeline.format.index import FieldSpec
from pipeline.format.records import Record, decode_fields
from pipeline.format.walk import walk_shard
from tests.format.crafted import archive, record_member

NAME_A = b"\xa1a"  # msgpack "a"


def one_field(value: bytes) -> bytes:
    """A record ``{"a": <value>}`` with the value's msgpack bytes given as they are."""
    return b"\x81" + NAME_A + value


def array_ext(dtype: bytes = b"<f4", shape: tuple[int, ...] = (4,), data: bytes | None = None,
              pad: int | None = None, padding: bytes | None = None, version: int = 2,
              code: int = NUMPY_EXT) -> bytes:
    """A record ``{"a": <array extension>}`` built field by field, so any field can lie."""
    head = struct.pack("<BBB", version, len(dtype), len(shape)) + dtype + struct.pack(f"<{len(shape)}Q", *shape)
    pad = -(len(head) + 1) % 16 if pad is None else pad
    payload = head[:3] + bytes((pad,)) + head[3:] + (bytes(pad) if padding is None else padding)
    payload += bytes(16) if data is None else data
    return msgpack.packb({"a": msgpack.ExtType(code, payload)}, use_bin_type=True)


def rejected(payload: bytes, pattern: str) -> None:
    with pytest.raises(SampleError, match=pattern):
        decode_record(payload)


def test_the_array_extension_builder_makes_valid_records() -> None:
    out = decode_record(array_ext(data=np.arange(4, dtype="<f4").tobytes()))["a"]
    assert out.dtype == np.float32 and out.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("value", [
    b"\xdb\xff\xff\xff\xff" + b"ab",  # str 32 of 2**32-1 bytes
    b"\xc6\xff\xff\xff\xff" + b"ab",  # bin 32
    b"\xdd\xff\xff\xff\xff" + b"\x01",  # array 32 of 2**32-1 items
    b"\xdf\xff\xff\xff\xff" + b"\xa1b\x01",  # map 32
    b"\xc9\xff\xff\xff\xff\x01" + b"ab",  # ext 32
])
def test_huge_declared_lengths_are_truncation_errors_without_allocating(value: bytes) -> None:
    tracemalloc.start()
    try:
        rejected(one_field(value), r"record truncated")
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
    rejected(b"\xdf\xff\xff\xff\xff", r"record truncated")  # the record's own map


@pytest.mark.parametrize("opener, as_record", [
    (b"\x91", r"a record must be a msgpack map, this one starts with byte 0x91"),  # 100k nested arrays
    (b"\x81\xa1k", r"field 'k': nested too deeply for msgpack"),                    # 100k nested maps
])
def test_deep_nesting_is_an_error_not_a_recursion_crash(opener: bytes, as_record: str) -> None:
    rejected(one_field(opener * 100_000 + b"\xc0"), r"field 'a': nested too deeply for msgpack")
    rejected(opener * 100_000 + b"\xc0", as_record)


@pytest.mark.parametrize("value, code", [
    (msgpack.packb(msgpack.ExtType(9, b"x")), 9),
    (msgpack.packb(msgpack.ExtType(127, b"xyzw")), 127),
    (msgpack.packb(msgpack.Timestamp(1)), -1),  # msgpack itself would decode this one into a Timestamp
    (msgpack.packb([1, msgpack.Timestamp(1)]), -1),
    (msgpack.packb({"t": msgpack.Timestamp(1)}), -1),
    (msgpack.packb(["x" * 70_000, [msgpack.Timestamp(1)]]), -1),  # past the first bytes msgpack is given
    (b"\x81\xa1k\xc8\x01\x2c\x80" + bytes(300), -128),  # ext 16 of type -128 inside a map
])
def test_unknown_extension_types_are_refused_at_any_depth(value: bytes, code: int) -> None:
    rejected(one_field(value), rf"unknown msgpack extension type {code} at byte")


@pytest.mark.parametrize("payload, pattern", [
    (b"\x82" + NAME_A + b"\x01" + NAME_A + b"\x02", r"field 'a' appears twice"),
    (b"\x81\x01\x02", r"field names must be strings, the one at byte 1 has msgpack type 0x01"),
    (b"\x81\xc4\x01a\x02", r"field names must be strings"),  # bytes
    (b"\x81\xc0\x02", r"field names must be strings"),  # nil
    (b"\x81\xa1\xff\x02", r"field name at byte 1 is not UTF-8"),
    (one_field(b"\xa1\xff"), r"field 'a': not valid msgpack: UnicodeDecodeError"),
    (one_field(b"\x81\x01\x02"), r"field 'a': not valid msgpack: ValueError: int is not allowed for map key"),
    (one_field(b"\x01") + b"\x00", r"1 bytes after the record's map"),
    (b"\x92\x01\x02", r"a record must be a msgpack map, this one starts with byte 0x92"),
    (b"", r"not a valid msgpack record: empty"),
    (b"\x81\xa1", r"record truncated inside a field name"),
    (b"\x81", r"record truncated at byte 1"),
])
def test_malformed_maps_names_and_values(payload: bytes, pattern: str) -> None:
    rejected(payload, pattern)


@pytest.mark.parametrize("kwargs, pattern", [
    ({"shape": (5,)}, r"array of shape \(5,\) and dtype <f4 needs 20 bytes, has 16"),
    ({"shape": (2, 1)}, r"needs 8 bytes, has 16"),
    ({"shape": (2**64 - 1,)}, r"needs 73786976294838206460 bytes, has 16"),  # -1 as an int64
    ({"shape": (1 << 40, 1 << 40)}, r"needs \d+ bytes, has 16"),
    ({"shape": (0, 1 << 62, 1 << 62), "data": b""}, r"overflows a 64-bit size"),
    ({"shape": (0, 2**64 - 1), "data": b""}, r"overflows a 64-bit size"),
    ({"shape": (1,) * 65, "data": bytes(4)}, r"array of 65 dimensions \(NumPy allows 64\)"),
    ({"dtype": b">f4"}, r"bad dtype b'>f4'"),  # big-endian: the data would be read backwards
    ({"dtype": b"float32"}, r"bad dtype b'float32'"),
    ({"dtype": b"|O"}, r"bad dtype b'\|O'"),
    ({"dtype": b"<U1"}, r"bad dtype b'<U1'"),
    ({"dtype": b"(2,)<f4"}, r"bad dtype"),
    ({"dtype": b"\xff\xfe"}, r"bad dtype"),
    ({"dtype": b"<f4", "code": BFLOAT16_EXT}, r"bad dtype b'<f4'"),
    ({"pad": 16, "padding": bytes(16)}, r"claims 16 bytes of padding \(at most 15\)"),
    ({"padding": b"\x01" * 3}, r"non-zero padding"),
    ({"pad": 3, "padding": bytes(3), "data": bytes(20)}, r"needs 16 bytes, has 20"),  # padding misstated
    ({"version": 1}, r"array extension version 1 is not supported"),
])
def test_array_extensions_that_lie_about_themselves(kwargs: dict, pattern: str) -> None:
    rejected(array_ext(**kwargs), rf"field 'a': .*{pattern}")


def test_truncated_array_extension_headers() -> None:
    rejected(msgpack.packb({"a": msgpack.ExtType(NUMPY_EXT, b"\x02\x03")}), r"shorter than its header")
    rejected(msgpack.packb({"a": msgpack.ExtType(NUMPY_EXT, b"\x02\x03\x02\x00<f4\x01")}), r"truncated inside its header")


def test_decoded_values_cost_memory_in_proportion_to_the_record() -> None:
    """The costliest msgpack object per byte is an empty map (1 byte, a 64-byte dict): the bound
    the codec's docstring promises, measured on 64k of them."""
    count = 1 << 16
    payload = one_field(b"\xdd" + struct.pack(">I", count) + b"\x80" * count)
    tracemalloc.start()
    try:
        assert len(decode_record(payload)["a"]) == count
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * len(payload)


def record(**members: bytes) -> Record:
    return Record("k", dict(members), 1024)


def npy_bytes(arr: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, arr, allow_pickle=True)
    return out.getvalue()


def test_npy_members_of_text_decode() -> None:
    """Refused with the dtypes no tensor holds, for a moment: a webdataset's .txt.npy of str."""
    for text in (np.array(["ab", "c"]), np.array([b"ab", b"c"])):
        assert decode_fields(record(npy=npy_bytes(text)), "s.tar")["npy"].tolist() == text.tolist()


def test_npy_members_decode_as_views_in_either_order() -> None:
    arr = np.arange(12, dtype=np.int16).reshape(3, 4)
    for stored in (arr, np.asfortranarray(arr)):
        out = decode_fields(record(npy=npy_bytes(stored)), "s.tar")["npy"]
        np.testing.assert_array_equal(out, arr)
        assert not out.flags.owndata


@pytest.mark.parametrize("data, pattern", [
    (npy_bytes(np.zeros(3)).replace(b"(3,), ", b"(4000000000,),"), r"needs 32000000000 bytes, has \d+"),
    (npy_bytes(np.zeros(3)).replace(b"(3,), ", b"(-3,), "), r"negative dimension"),
    (npy_bytes(np.array([None, 1], dtype=object)), r"Python objects: loading it would need pickle"),
    (npy_bytes(np.array(["2020-01-01"], dtype="datetime64[D]")), r"dtype datetime64\[D\], which no batch's tensor "
                                                                 r"holds \(bool, int8-64, uint8-64, float16/32/64 do"),
    (npy_bytes(np.zeros(2, dtype=[("a", "<i4")])), r"\.npy array of dtype \[\('a', '<i4'\)\], which no batch's"),
    (npy_bytes(np.zeros(2, dtype=np.longdouble)), r"\.npy array of dtype float128, which no batch's"),
    (b"\x93NUMPX" + bytes(100), r"not a \.npy array"),
    (npy_bytes(np.zeros(3))[:20], r"not a \.npy array"),
])
def test_hostile_npy_members_are_errors_without_allocating(data: bytes, pattern: str) -> None:
    with pytest.raises(ShardError, match=rf"^s\.tar at byte 1024: record 'k': .*{pattern}"):
        decode_fields(record(npy=data), "s.tar")


@pytest.mark.parametrize("members, pattern", [
    ({"json": b"[" * 100_000}, r"member 'json': RecursionError"),
    ({"json": b"\xff"}, r"member 'json': UnicodeDecodeError"),
    ({"cls": b"seven"}, r"member 'cls': ValueError"),
    ({"cls": b"9" * 5000}, r"member 'cls': ValueError"),  # Python's digit limit
    ({"txt": b"\xff"}, r"member 'txt': UnicodeDecodeError"),
    ({"msgpack": b"\x91" * 100_000 + b"\xc0", "cls": b"2"}, r"member 'msgpack': StackError"),
    ({"msgpack": b"\x91\x81\x90\x00", "cls": b"2"}, r"member 'msgpack': a msgpack value Python cannot hold"),
    ({"msgpack": b"\x91\x81\x90\x00"}, r"member 'msgpack': a msgpack value Python cannot hold"),
])
def test_foreign_members_that_do_not_decode(members: dict, pattern: str) -> None:
    with pytest.raises(ShardError, match=rf"^s\.tar at byte 1024: record 'k'.*{pattern}"):
        decode_fields(record(**members), "s.tar")


def test_a_msgpack_member_of_webdatasets_is_a_field_of_that_name() -> None:
    """webdataset writes its field 'msgpack' as a member of that name: taken for a record of ours,
    its map's keys became fields ('msgpack' gone), and a list or a number failed the whole shard."""
    for value in ({"label": 1, "cls": 100}, [1, 2], 7):
        assert decode_fields(record(msgpack=msgpack.packb(value), cls=b"2"), "s.tar") == {"msgpack": value, "cls": 2}
        assert decode_fields(record(msgpack=msgpack.packb(value)), "s.tar") == \
            (value if isinstance(value, dict) else {"msgpack": value})  # (alone, a map is a record of ours)


def test_a_foreign_member_that_does_not_decode_says_what_its_extension_needs() -> None:
    with pytest.raises(ShardError, match=re.escape(
            "member 'cls': ValueError: invalid literal for int() with base 10: b'1.5' (a member decodes by its "
            "extension: .cls a whole number, .json JSON, .txt UTF-8 text, .npy an array without Python objects; write "
            "the member again so, or under another extension, such as .bin, to get its bytes as they are)")):
        decode_fields(record(cls=b"1.5"), "s.tar")
    assert decode_fields(record(bin=b"1.5"), "s.tar") == {"bin": b"1.5"}


SCHEMA = {"x": FieldSpec("float32", (None, 3)), "label": FieldSpec("int", None)}


@pytest.mark.parametrize("fields, pattern", [
    ({"x": np.zeros((2, 3), np.float32)}, r"missing \['label'\], extra \[\]"),
    ({"x": np.zeros((2, 3), np.float32), "label": 1, "y": 2}, r"missing \[\], extra \['y'\]"),
    ({"x": np.zeros((2, 3), np.int32), "label": 1}, r"field 'x' is int32\[2, 3\], the index's schema says float32\[None, 3\]"),
    ({"x": np.zeros((2, 4), np.float32), "label": 1}, r"field 'x' is float32\[2, 4\]"),
    ({"x": np.zeros(6, np.float32), "label": 1}, r"field 'x' is float32\[6\]"),
    ({"x": [1.0, 2.0], "label": 1}, r"field 'x' is not an array"),
    ({"x": np.zeros((2, 3), np.float32), "label": np.int64(1)}, r"field 'label' is int64\[\], .* says not an array"),
])
def test_records_that_disagree_with_the_index_schema(fields: dict, pattern: str) -> None:
    with pytest.raises(SampleError, match=pattern):
        check_conforms(fields, SCHEMA)


def test_records_that_match_the_schema_pass_packed_or_not() -> None:
    check_conforms({"x": np.zeros((5, 3), np.float32), "label": 7}, SCHEMA)
    packed = {"x": np.zeros((4, 2, 3), np.float32), "label": np.arange(4), "__rows__": 4}
    check_conforms(packed, {"x": FieldSpec("float32", (2, 3)), "label": FieldSpec("int64", ())})
    shard = archive(record_member("k", {"x": np.zeros((2, 3), np.float32)}))
    assert next(walk_shard(shard, "s.tar", schema={"x": FieldSpec("float32", (2, 3))})).fields["x"].shape == (2, 3)
    # without the shard table's checksum to tell it as written, the record is what is blamed
    with pytest.raises(ShardError, match=r"^s\.tar at byte 0: record 'k': field 'x' is float32\[2, 3\], the index's "
                                         r"schema says float32\[3, 2\]$"):
        next(walk_shard(shard, "s.tar", schema={"x": FieldSpec("float32", (3, 2))}))
