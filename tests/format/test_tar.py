"""The tar reader: what other tools write reads record by record; what is broken is named."""

from __future__ import annotations

import io
import tarfile

import pytest

from pipeline import ShardError, iter_records
from pipeline.format.tar import END_OF_ARCHIVE, iter_members, member_header, padding


def tar_bytes(members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT,
              extra: list[tarfile.TarInfo] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for info in extra or []:
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_our_member_headers_are_read_by_pythons_tarfile() -> None:
    data = b"hello world"
    raw = member_header("abc.msgpack", len(data)) + data + padding(len(data)) + END_OF_ARCHIVE
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        (member,) = tar.getmembers()
        assert member.name == "abc.msgpack" and member.size == len(data)
        assert tar.extractfile(member).read() == data  # type: ignore[union-attr]


def test_records_group_consecutive_members_by_key_with_offsets() -> None:
    raw = tar_bytes([("a.x", b"1"), ("a.y.json", b"2"), ("b.x", b"3")])
    records = list(iter_records(io.BytesIO(raw), "s.tar"))
    assert [(r.key, r.members) for r in records] == [("a", {"x": b"1", "y.json": b"2"}), ("b", {"x": b"3"})]
    assert records[0].offset == 0 and records[1].offset == 2 * 1024


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_long_names_from_pax_and_gnu_headers(fmt: int) -> None:
    long_dir = "d" * 120
    raw = tar_bytes([(f"{long_dir}/key.txt", b"v")], fmt)
    (member,) = list(iter_members(io.BytesIO(raw), "s.tar"))
    assert member.name == f"{long_dir}/key.txt" and member.data == b"v"


def test_directories_are_skipped_and_links_refused() -> None:
    folder = tarfile.TarInfo("sub")
    folder.type = tarfile.DIRTYPE
    raw = tar_bytes([("sub/a.txt", b"x")], extra=[folder])
    assert [m.name for m in iter_members(io.BytesIO(raw), "s.tar")] == ["sub/a.txt"]
    link = tarfile.TarInfo("evil.txt")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    raw = tar_bytes([], extra=[link])
    with pytest.raises(ShardError, match=r"s\.tar at byte 0: tar member .evil\.txt. \(symbolic link\) is not allowed"):
        list(iter_members(io.BytesIO(raw), "s.tar"))


def test_truncated_member_names_shard_and_offset() -> None:
    raw = tar_bytes([("a.bin", b"x" * 3000)])
    with pytest.raises(ShardError, match=r"s\.tar at byte 512: truncated member"):
        list(iter_members(io.BytesIO(raw[:2000]), "s.tar"))
    with pytest.raises(ShardError, match=r"s\.tar at byte 0: truncated header"):
        list(iter_members(io.BytesIO(raw[:100]), "s.tar"))


def test_corrupt_header_is_a_checksum_error_and_huge_sizes_are_refused() -> None:
    raw = bytearray(tar_bytes([("a.bin", b"x")]))
    raw[10] ^= 0xFF
    with pytest.raises(ShardError, match="checksum"):
        list(iter_members(io.BytesIO(bytes(raw)), "s.tar"))
    with pytest.raises(ShardError, match="exceeds the limit"):
        list(iter_members(io.BytesIO(tar_bytes([("a.bin", b"x" * 5000)])), "s.tar", max_member_bytes=4096))


def test_repeated_field_in_one_record_is_an_error() -> None:
    raw = tar_bytes([("a.x", b"1"), ("a.x", b"2")])
    with pytest.raises(ShardError, match="record 'a' has two 'x' members"):
        list(iter_records(io.BytesIO(raw), "s.tar"))
