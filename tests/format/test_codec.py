"""The sample codec: exact round trips, zero-copy decoding, and refusals that name the field."""

from __future__ import annotations

import re

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pipeline import SampleError, decode_record, encode_sample
from pipeline.format.codec import NUMPY_EXT, _ext_hook, encode_parts
from pipeline.format.numbers import outside_int64

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64"]


def roundtrip(sample: dict) -> dict:
    return decode_record(encode_sample(sample, "k"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 0, 2), (2, 3, 4)])
def test_every_supported_dtype_and_shape_round_trips_byte_exact(dtype: str, shape: tuple) -> None:
    rng = np.random.default_rng(0)
    arr = (rng.random(shape) * 100).astype(dtype)
    out = roundtrip({"a": arr})["a"]
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert out.tobytes() == arr.tobytes()


def test_non_contiguous_and_big_endian_inputs_round_trip_by_value() -> None:
    base = np.arange(60, dtype=np.float64).reshape(6, 10)
    strided = base[::2, ::3]
    fortran = np.asfortranarray(base)
    big = base.astype(">i4")
    out = roundtrip({"s": strided, "f": fortran, "b": big})
    np.testing.assert_array_equal(out["s"], strided)
    np.testing.assert_array_equal(out["f"], fortran)
    np.testing.assert_array_equal(out["b"], big)
    assert out["b"].dtype == np.dtype("<i4")


def test_decoding_is_zero_copy_and_aligned() -> None:
    payload = encode_sample({"label": 3, "a": np.arange(1000, dtype=np.float64), "b": np.ones(7, np.int16)}, "k")
    for name in ("a", "b"):
        out = decode_record(payload)[name]
        assert not out.flags.owndata and not out.flags.writeable
        owner = out
        while isinstance(owner, np.ndarray):
            owner = owner.base
        assert owner.obj is payload  # a view of the record's own bytes, not of a copy
        offset = out.ctypes.data - np.frombuffer(payload, np.uint8).ctypes.data
        assert offset % 16 == 0  # aligned within the record (records start on 512-byte bounds)


def test_native_values_round_trip() -> None:
    sample = {"i": -5, "big": 2**63 - 1, "f": 1.5, "b": True, "n": None, "s": "héllo", "raw": b"\x00\xff",
              "l": [1, "a", [2.0]], "d": {"k": [1, 2]}, "t": (1, 2)}
    out = roundtrip(sample)
    assert out == {**sample, "t": [1, 2]}
    assert isinstance(out["raw"], bytes)


def test_a_list_longer_than_the_first_bytes_given_to_msgpack_ends_where_it_ends() -> None:
    """msgpack's decoder gets a list's bytes 4 KB first, then more: a list of 300 KB decodes
    whole, and the fields after it decode from where it ends, in either order."""
    names = [f"images/{i:09d}.jpg" for i in range(15_000)]
    sample = {"name": names, "meta": {"k": "v" * 70_000, "n": None}, "x": np.arange(6, dtype=np.int16), "y": 7}
    for order in (sample, dict(reversed(sample.items()))):
        out = roundtrip(order)
        assert list(out) == list(order)
        assert out["name"] == names and out["meta"] == sample["meta"] and out["y"] == 7
        assert out["x"].tolist() == list(range(6))
    truncated = encode_sample({"name": names, "y": 7}, "k")[:200_000]
    with pytest.raises(SampleError, match=r"^record truncated at byte 200000$"):
        decode_record(truncated)


NATIVE = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False)
                      | st.text(max_size=40) | st.binary(max_size=40),
                      lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
                      max_leaves=40)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text("abcé_", min_size=1, max_size=8).filter(lambda name: not name.startswith("__")),
                       NATIVE, min_size=1, max_size=5).filter(  # (a field's own int must fit int64: see below)
    lambda sample: not any(outside_int64(value) for value in sample.values())))
def test_any_record_of_native_values_decodes_as_msgpack_decodes_it(sample: dict) -> None:
    assert roundtrip(sample) == msgpack.unpackb(encode_sample(sample, "k"), raw=False)


def test_numpy_scalars_become_zero_d_arrays_of_the_same_dtype() -> None:
    out = roundtrip({"a": np.int16(-3), "b": np.float64(2.5), "c": np.bool_(True)})
    assert out["a"].dtype == np.int16 and out["a"].shape == () and out["a"] == -3
    assert out["b"].dtype == np.float64 and out["b"] == 2.5
    assert out["c"].dtype == np.bool_ and bool(out["c"])


def test_torch_tensors_are_accepted_and_bfloat16_comes_back_as_bfloat16() -> None:
    t32 = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    bf = torch.tensor([1.5, -2.25, 3.0e10], dtype=torch.bfloat16)
    out = roundtrip({"t": t32, "bf": bf, "nc": t32.t()})
    np.testing.assert_array_equal(out["t"], t32.numpy())
    np.testing.assert_array_equal(out["nc"], t32.t().numpy())
    assert isinstance(out["bf"], torch.Tensor) and out["bf"].dtype == torch.bfloat16
    assert torch.equal(out["bf"], bf)


@pytest.mark.parametrize("value, what", [
    (np.array([object(), 1], dtype=object), "dtype object"),
    (np.array([1 + 2j]), "dtype complex128"),
    (np.array(["ab"]), "dtype <U2"),
    (object(), "builtins.object"),
    ({1, 2}, "builtins.set"),
])
def test_unsupported_values_are_refused_naming_field_and_key(value, what: str) -> None:
    with pytest.raises(SampleError) as err:
        encode_sample({"fine": 1, "bad": value}, key="sample-7")
    message = str(err.value)
    assert "'sample-7'" in message and "'bad'" in message and what in message


def test_reserved_and_non_string_field_names_are_refused() -> None:
    with pytest.raises(SampleError, match="reserved"):
        encode_sample({"__rows__": 1}, "k")
    with pytest.raises(SampleError, match="non-empty strings"):
        encode_sample({1: 2}, "k")  # type: ignore[dict-item]


def test_array_extension_whose_shape_disagrees_with_its_bytes_is_an_error() -> None:
    good = encode_sample({"a": np.arange(4, dtype=np.int32)}, "k")
    ext = msgpack.unpackb(good, raw=False)["a"]
    assert ext.code == NUMPY_EXT
    bad = msgpack.packb({"a": msgpack.ExtType(NUMPY_EXT, ext.data[:-4])}, use_bin_type=True)
    with pytest.raises(SampleError, match="needs 16 bytes, has 12"):
        decode_record(bad)


def test_unknown_extension_and_non_map_records_are_errors() -> None:
    with pytest.raises(SampleError, match="unknown msgpack extension type 9"):
        decode_record(msgpack.packb({"a": msgpack.ExtType(9, b"x")}))
    with pytest.raises(SampleError, match="must be a msgpack map"):
        decode_record(msgpack.packb([1, 2]))
    with pytest.raises(SampleError, match="not a valid msgpack record"):
        decode_record(b"\xc1")


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(dtype=st.sampled_from(DTYPES).map(np.dtype),
                  shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)))
def test_any_array_round_trips_byte_exact(arr: np.ndarray) -> None:
    out = roundtrip({"a": arr})["a"]
    assert out.dtype == arr.dtype and out.shape == arr.shape and out.tobytes() == arr.tobytes()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_decode_to_a_map_or_raise_sample_error(data: bytes) -> None:
    try:
        assert isinstance(decode_record(data), dict)
    except SampleError:
        pass


@pytest.mark.parametrize("nbytes", [0, 1, 2, 4, 200, 300, 70_000])
def test_zero_copy_parts_are_valid_msgpack_with_aligned_array_data(nbytes: int) -> None:
    """Every extension size class (fixext, ext8, ext16, ext32) and a map of more than 15 fields:
    the in-place decoder and plain msgpack read the same values."""
    sample = {"a": np.arange(nbytes, dtype=np.uint8), "s": "text", "n": [1, np.float32(2.0)]}
    sample.update({f"f{i}": i for i in range(16)})
    parts = encode_parts(sample, "k")
    assert any(isinstance(p, memoryview) for p in parts) or nbytes == 0
    payload = b"".join(parts)
    in_place = decode_record(payload)
    generic = msgpack.unpackb(payload, ext_hook=_ext_hook, raw=False)
    assert in_place.keys() == generic.keys() == sample.keys()
    np.testing.assert_array_equal(in_place["a"], sample["a"])
    np.testing.assert_array_equal(generic["a"], sample["a"])
    assert in_place["s"] == "text" and in_place["f15"] == 15 and in_place["n"][1] == np.float32(2.0)
    if nbytes:
        offset = in_place["a"].ctypes.data - np.frombuffer(payload, np.uint8).ctypes.data
        assert offset % 16 == 0


@pytest.mark.parametrize("value, bad", [({1: "one"}, "1 (int)"), ([{"ok": [{None: 2}]}], "None (NoneType)"),
                                        ({"a": {(1, 2): 3}}, "(1, 2) (tuple)"), ({2.5: "x"}, "2.5 (float)")])
def test_dict_keys_the_reader_refuses_are_refused_when_written(value, bad: str) -> None:
    with pytest.raises(SampleError, match=re.escape(
            f"record 'sample-7', field 'meta': dict key {bad} is not allowed; the keys of a dict in a shard are "
            f"str (or bytes): write str(key)")):
        encode_sample({"fine": 1, "meta": value}, key="sample-7")
    kept = {"meta": [{"é": {b"raw": [1, {"k": np.arange(3)}]}}] * 40}  # str and bytes keys, at any depth
    np.testing.assert_array_equal(roundtrip(kept)["meta"][39]["é"][b"raw"][1]["k"], np.arange(3))


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64])
def test_an_int_that_int64_cannot_hold_is_refused_as_a_shard_writer_refuses_it(value: int) -> None:
    """2**63 went through (and came back), though a writer refuses it and the README says an int
    must fit int64: read into batches, its field turned from tensors to lists part way."""
    with pytest.raises(SampleError, match=re.escape(
            f"record 'k', field 'y': {value} does not fit int64, the integers of a batch's tensor; store it as "
            f"np.uint64 (an ID under 2**64) or as str")):
        encode_sample({"y": value}, "k")
    assert decode_record(encode_sample({"y": 2**63 - 1, "z": -(2**63)}))["y"] == 2**63 - 1
