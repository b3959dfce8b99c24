"""Hostile and corrupt tar headers: each one is a ShardError naming the shard, the byte offset of
the header and what is wrong; none makes the reader allocate what the header claims."""

from __future__ import annotations

import io
import tarfile

import pytest

from pipeline import ShardError
from pipeline.format.tar import BLOCK, READ_CHUNK_BYTES, iter_members
from tests.format.crafted import archive, header, member, pax, pax_record, with_checksum


def members(data: bytes, **kwargs) -> list[tuple[str, bytes, int]]:
    """``(name, data, offset)`` of every member, read from a stream (not from memory)."""
    return [(m.name, bytes(m.data), m.offset) for m in iter_members(io.BytesIO(data), "s.tar", **kwargs)]


def refused(data: bytes, pattern: str, offset: int = 0, **kwargs) -> None:
    with pytest.raises(ShardError, match=rf"^s\.tar at byte {offset}: {pattern}"):
        members(data, **kwargs)


@pytest.mark.parametrize("size_field", [
    b"%011o\0" % (100 << 30),                   # 100 GB in octal
    b"\x80" + (100 << 30).to_bytes(11, "big"),  # 100 GB in GNU base-256
    b"\x80" + b"\xff" * 11,                     # 2**88 - 1
])
def test_a_header_claiming_100_gb_is_refused_before_reading(size_field: bytes) -> None:
    refused(archive(header(size_field=size_field)), r"member of \d+ bytes exceeds the limit of 4294967296")


class RecordingStream(io.BytesIO):
    """A stream that remembers the largest read asked of it."""

    largest = 0

    def read(self, size: int | None = -1) -> bytes:
        self.largest = max(self.largest, size or 0)
        return super().read(size)


def test_memory_follows_the_bytes_that_arrive_not_the_size_claimed() -> None:
    stream = RecordingStream(archive(header(size=3 << 30)))  # under the limit, but absent
    with pytest.raises(ShardError, match=r"s\.tar at byte 512: truncated member 'a\.bin': expected 3221225472 bytes, got "
                                         r"1024 \(the shard is cut short: copy or write it again, or leave it out\)"):
        list(iter_members(stream, "s.tar"))
    assert stream.largest <= READ_CHUNK_BYTES


@pytest.mark.parametrize("size_field, reason", [
    (b"-0000000001\0", r"non-numeric size b'-0000000001'"),
    (b"+0000000001\0", r"non-numeric size b'\+0000000001'"),
    (b"0o000000001\0", r"non-numeric size b'0o000000001'"),  # int(text, 8) would take these three
    (b"0_000000001\0", r"non-numeric size b'0_000000001'"),
    (b"00000000009\0", r"non-numeric size b'00000000009'"),
    (b"hello world\0", r"non-numeric size b'hello world'"),
    (b"\xff" * 12, r"negative size"),  # base-256, negative
])
def test_negative_and_non_numeric_sizes_are_errors(size_field: bytes, reason: str) -> None:
    refused(archive(header(size_field=size_field), b"\0" * BLOCK), reason)


def test_base_256_and_space_terminated_sizes_are_read() -> None:
    body = b"y" * 700
    for size_field in (b"\x80" + (700).to_bytes(11, "big"), b"     1274 \0\0"):
        data = archive(header(size_field=size_field) + body + b"\0" * (2 * BLOCK - 700))
        assert members(data) == [("a.bin", body, 0)]


def test_checksums_bad_unparsable_and_old_signed_ones() -> None:
    good = member(b"a.bin", b"data")
    flipped = bytearray(good)
    flipped[5] ^= 0x01
    refused(archive(bytes(flipped)), r"bad tar header checksum")
    garbage = bytearray(good)
    garbage[148:156] = b"zz\0     "
    refused(archive(bytes(garbage)), r"non-numeric checksum b'zz'")
    signed = bytearray(header("é.bin".encode(), 4))  # bytes >= 0x80 sum differently when signed
    signed[148:156] = b"%06o\0 " % (sum(signed) - sum(signed[148:156]) + 256 - 256 * 2)
    assert members(archive(bytes(signed) + b"data" + b"\0" * 508)) == [("é.bin", b"data", 0)]


def test_valid_pax_headers_give_the_path_and_size_and_the_member_starts_at_them() -> None:
    path = "d" * 150 + "/key.txt"
    data = archive(pax(pax_record(b"path", path.encode()) + pax_record(b"mtime", b"1.5")) + member(b"x", b"v"),
                   member(b"b.txt", b"w"))
    assert members(data) == [(path, b"v", 0), ("b.txt", b"w", 4 * BLOCK)]
    sized = archive(pax(pax_record(b"size", b"3")) + header(b"c.bin", 0) + b"abc" + b"\0" * 509)
    assert members(sized) == [("c.bin", b"abc", 0)]


@pytest.mark.parametrize("records, reason", [
    (b"99999999999 path=z.y\n", r"malformed PAX extended header \(record at byte 0 of it\)"),
    (b"3 path=z.y\n", r"malformed PAX extended header"),
    (b"12 path=z.yy", r"malformed PAX extended header"),    # no newline at its end
    (b"x1 path=z.y\n", r"malformed PAX extended header"),   # length not a number
    (b"9 pathzy\n", r"malformed PAX record b'9 pathzy\\n'"),  # no '='
    (b"9 =value\n", r"malformed PAX record"),                # no key
])
def test_malformed_pax_records_are_errors(records: bytes, reason: str) -> None:
    refused(archive(pax(records), member(b"a.bin", b"")), reason)


@pytest.mark.parametrize("record, reason", [
    (pax_record(b"size", b"-1"), r"non-numeric PAX size b'-1'"),
    (pax_record(b"size", b" 1 "), r"non-numeric PAX size b' 1 '"),
    (pax_record(b"size", b"107374182400"), r"member of 107374182400 bytes exceeds the limit"),
    (pax_record(b"path", b"z.y\xff"), r"PAX path b'z.y\\xff' is not UTF-8"),
    (pax_record(b"GNU.sparse.major", b"1"), r"GNU sparse member"),
])
def test_hostile_pax_values_are_errors_at_the_member_they_describe(record: bytes, reason: str) -> None:
    refused(archive(pax(record), member(b"a.bin", b"")), reason, offset=2 * BLOCK)


def test_oversized_and_dangling_extended_headers_are_errors() -> None:
    refused(archive(header(b"././@PaxHeader", 2 << 20, b"x")), r"extended header of 2097152 bytes \(at most 1048576\)")
    refused(archive(header(b"././@LongLink", 2 << 20, b"L")), r"extended header of 2097152 bytes")
    refused(archive(pax(pax_record(b"path", b"a.b"))), r"extended header is not followed by a member")
    refused(archive(member(b"././@LongLink", b"a.b\0", b"L")), r"extended header is not followed by a member")
    refused(archive(member(b"././@LongLink", b"\xffa.b\0", b"L")), r"GNU long name b'\\xffa.b' is not UTF-8")


@pytest.mark.parametrize("kind, what", [
    (tarfile.LNKTYPE, "hard link"), (tarfile.SYMTYPE, "symbolic link"), (tarfile.CHRTYPE, "character device"),
    (tarfile.BLKTYPE, "block device"), (tarfile.FIFOTYPE, "FIFO"), (tarfile.GNUTYPE_SPARSE, "GNU sparse file"),
    (b"Z", "unknown type b'Z'"),
])
def test_links_devices_fifos_and_unknown_types_are_refused(kind: bytes, what: str) -> None:
    refused(archive(member(b"a.bin", b"x"), header(b"evil.bin", 0, kind)), rf"tar member 'evil\.bin' \({what}\) "
            "is not allowed in a shard", offset=2 * BLOCK)


def test_directories_old_and_new_style_are_skipped_with_their_bodies() -> None:
    data = archive(header(b"sub", 0, b"5"), member(b"old/", b"ignored", b"\0"), member(b"sub/a.txt", b"v"))
    assert members(data) == [("sub/a.txt", b"v", 3 * BLOCK)]


def test_a_name_that_is_not_utf8_is_an_error() -> None:
    refused(archive(member(b"\xff\xfe.bin", b"x")), r"member name b'\\xff\\xfe\.bin' is not UTF-8")


def test_a_shard_cut_at_a_member_boundary_is_truncated_unless_a_range_was_asked_for() -> None:
    data = archive(member(b"a.bin", b"1"), member(b"b.bin", b"2"))
    cut = data[:2 * BLOCK]
    refused(cut, r"shard ends without the end-of-archive blocks \(truncated\)", offset=2 * BLOCK)
    assert [m[0] for m in members(cut, whole=False)] == ["a.bin"]
    assert [m[0] for m in members(data[:-BLOCK + 7])] == ["a.bin", "b.bin"]  # cut in the marker: nothing lost


def test_a_zeroed_header_inside_the_archive_is_an_error_not_the_end() -> None:
    data = bytearray(archive(member(b"a.bin", b"1"), member(b"b.bin", b"2"), member(b"c.bin", b"3")))
    data[2 * BLOCK:3 * BLOCK] = bytes(BLOCK)  # b's header zeroed, as by a lost page
    refused(bytes(data), r"a zero block inside the archive \(a zeroed header\?\)", offset=2 * BLOCK)


def test_a_padding_block_that_is_not_zero_is_harmless() -> None:
    data = bytearray(archive(member(b"a.bin", b"1")))
    data[BLOCK + 100] = 0xFF  # member padding: outside any header and any member's bytes
    assert members(bytes(data)) == [("a.bin", b"1", 0)]


def test_the_same_error_whether_the_archive_is_in_memory_or_a_stream() -> None:
    data = archive(with_checksum(b"\x01" * BLOCK))
    for source in (data, io.BytesIO(data)):
        with pytest.raises(ShardError, match=r"s\.tar at byte 0: non-numeric size"):
            list(iter_members(source, "s.tar"))
