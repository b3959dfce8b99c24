"""Property-based tests of the codec and the tar reader, with fixed example budgets and
derandomised generation so that every run (and CI) tries the same inputs.

The promises: encoding round-trips byte-exact; decoding arbitrary or mutated bytes gives a
record or our error, never another exception; a shard with one corrupted byte reads as our error
or as exactly its stored members (the tar layer never misplaces a member); a cut shard is an error.
"""

from __future__ import annotations

import io
import tarfile

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pipeline import SampleError, ShardError, decode_record, encode_sample
from pipeline.format.numbers import outside_int64
from pipeline.format.records import decode_fields, iter_records
from pipeline.format.tar import BLOCK, iter_members
from tests.format.crafted import FUZZ, small_shard, with_checksum

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64"]
arrays = hnp.arrays(dtype=st.sampled_from(DTYPES).map(np.dtype),
                    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
leaves = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8)
          | st.binary(max_size=8) | arrays)
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)
names = st.text(min_size=1, max_size=6).filter(lambda n: not n.startswith("__"))
samples = st.dictionaries(names, values, min_size=1, max_size=5)


def same(a, b) -> bool:
    """Equal values, arrays by dtype, shape and bytes (so NaNs compare by their bits)."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return isinstance(b, float) and np.float64(a).tobytes() == np.float64(b).tobytes()
    return type(a) is type(b) and a == b


@settings(FUZZ, max_examples=150)
@given(samples)
def test_samples_round_trip_and_re_encode_byte_exact(sample: dict) -> None:
    assume(not any(outside_int64(value) for value in sample.values()))  # refused by encode_sample (test_codec checks it)
    payload = encode_sample(sample, "k")
    decoded = decode_record(payload)
    assert same(sample, decoded)
    assert encode_sample(decoded, "k") == payload


def decodes_or_refuses(payload: bytes) -> None:
    try:
        assert isinstance(decode_record(payload), dict)
    except SampleError:
        pass


@settings(FUZZ, max_examples=300)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_sample_error(data: bytes) -> None:
    decodes_or_refuses(data)


mutation = st.tuples(st.sampled_from(["flip", "set", "insert", "delete"]), st.integers(0, 1 << 20),
                     st.integers(0, 255))


def mutate(data: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
    """``data`` with each mutation applied at ``position % len``: flip a bit, set, insert or
    delete a byte."""
    out = bytearray(data)
    for kind, position, value in mutations:
        at = position % max(len(out), 1)
        if kind == "flip" and out:
            out[at] ^= 1 << (value % 8)
        elif kind == "set" and out:
            out[at] = value
        elif kind == "insert":
            out.insert(at, value)
        elif out:
            del out[at]
    return bytes(out)


@settings(FUZZ, max_examples=200)
@given(samples, st.lists(mutation, min_size=1, max_size=4))
def test_mutated_records_decode_or_raise_sample_error(sample: dict, mutations: list) -> None:
    decodes_or_refuses(mutate(encode_sample(sample, "k"), mutations))


SHARD = small_shard(records=3)
MEMBERS = [(m.name, m.offset, len(m.data)) for m in iter_members(SHARD, "s.tar")]


@settings(FUZZ, max_examples=300)
@given(st.integers(0, len(SHARD) - 1), st.sampled_from(["flip", "set"]), st.integers(0, 255))
def test_one_corrupt_byte_is_an_error_or_changes_only_member_bytes(position: int, kind: str, value: int) -> None:
    """Headers are covered by their checksum, so one byte changed anywhere either is an error
    or leaves every member where it was (only bytes inside a member's data may differ)."""
    data = mutate(SHARD, [(kind, position, value)])
    try:
        found = list(iter_members(io.BytesIO(data), "s.tar"))
    except ShardError:
        return
    assert [(m.name, m.offset, len(m.data)) for m in found] == MEMBERS
    for member in found:
        start = member.offset + BLOCK
        assert bytes(member.data) == data[start:start + len(member.data)]


#: Header fields the reader interprets: name, size, type, link name, magic and version, prefix.
READ_FIELDS = [(0, 100), (124, 136), (156, 157), (157, 257), (257, 265), (345, 500)]


def tarfile_members(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isreg()]  # type: ignore[union-attr]


@settings(FUZZ, max_examples=300)
@given(st.sampled_from(READ_FIELDS), st.integers(0, 99), st.binary(min_size=1, max_size=12))
def test_a_rewritten_header_field_is_an_error_or_reads_as_pythons_tarfile_reads_it(
        field: tuple[int, int], position: int, new: bytes) -> None:
    """The checksum made valid again, so only the reader's own checks stand between a hostile
    field and a misread: whatever it accepts, Python's tarfile reads the same way. (A directory
    with a body is the exception: tarfile takes its body for headers, this reader skips it.)"""
    low, high = field
    at = low + position % (high - low)
    block = bytearray(SHARD[:BLOCK])
    block[at:min(at + len(new), high)] = new[:high - at]
    assume(block[156:157] != b"5")
    data = with_checksum(block) + SHARD[BLOCK:]
    try:
        ours = [(m.name, bytes(m.data)) for m in iter_members(io.BytesIO(data), "s.tar")]
    except ShardError:
        return
    assert ours == tarfile_members(data)


@settings(FUZZ, max_examples=200)
@given(st.lists(mutation, min_size=1, max_size=8))
def test_a_mutated_shard_reads_as_records_or_shard_errors_only(mutations: list) -> None:
    data = mutate(SHARD, mutations)
    try:
        for record in iter_records(io.BytesIO(data), "s.tar"):
            decode_fields(record, "s.tar")
    except ShardError as exc:
        assert str(exc).startswith("s.tar at byte ")


def test_a_shard_cut_at_any_block_boundary_is_an_error_naming_a_byte_before_the_cut() -> None:
    intact = len(SHARD) - BLOCK  # a cut in the last end-of-archive block loses no data
    for cut in range(0, len(SHARD), BLOCK):
        if cut >= intact:
            assert len(list(iter_records(SHARD[:cut], "s.tar"))) == 3
            continue
        try:
            list(iter_records(io.BytesIO(SHARD[:cut]), "s.tar"))
        except ShardError as exc:
            assert exc.offset is not None and exc.offset <= cut, (cut, exc)
        else:
            raise AssertionError(f"a shard cut at byte {cut} of {len(SHARD)} read without an error")


LARGE = small_shard(records=40, width=300)


@settings(FUZZ, max_examples=100)
@given(st.integers(0, len(LARGE) - BLOCK - 1))
def test_a_larger_shard_cut_anywhere_is_an_error(cut: int) -> None:
    try:
        for record in iter_records(io.BytesIO(LARGE[:cut]), "big.tar"):
            decode_fields(record, "big.tar")
    except ShardError as exc:
        assert exc.offset is not None and exc.offset <= cut
    else:
        raise AssertionError(f"cut at byte {cut} read without an error")
