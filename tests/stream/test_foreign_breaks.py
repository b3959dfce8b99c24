"""Shards without an index that break part-way (cut short, a member no shard may hold, a second
tar after the first): the records before the break are delivered whole, what follows is an
error naming the member and what to do, or under ``on_error="skip"`` a counted loss; never a
record that lost a member, never a silent end."""

from __future__ import annotations

import io
import tarfile
import zlib
from pathlib import Path

import pytest

import pipeline
from pipeline.format.errors import ShardError


def member(name: str, data: bytes) -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, io.BytesIO(data)


def shard(path: Path, samples: int, extra: dict[int, tarfile.TarInfo] | None = None) -> Path:
    """Samples ``000``... of a ``.cls`` and a ``.txt`` member each; ``extra[n]``, a member put before sample ``n``."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for n in range(samples):
            if extra and n in extra:
                tar.addfile(extra[n], io.BytesIO(b"x" * extra[n].size) if extra[n].isreg() else None)
            tar.addfile(*member(f"{n:03d}.cls", str(n).encode()))
            tar.addfile(*member(f"{n:03d}.txt", f"text {n} ".encode() * 40))
    return path


def member_offset(path: Path, name: str) -> int:
    with tarfile.open(path) as tar:
        return next(info.offset for info in tar if info.name == name)


def keys(path: Path, on_error: str = "raise") -> tuple[list[str], dict]:
    loader = pipeline.make_loader([str(path)], num_workers=0, batch_size=4, shuffle=False, on_error=on_error,
                                  fields=["__key__", "cls", "txt"])
    batches = list(loader)
    assert all(isinstance(text, str) for batch in batches for text in batch["txt"])  # no record short of a member
    return [key for batch in batches for key in batch["__key__"]], loader.stats()


@pytest.mark.parametrize("cut_in, whole", [("006.cls", 6), ("005.txt", 5)])
def test_a_shard_cut_inside_a_member_delivers_each_record_read_whole(tmp_path: Path, cut_in: str, whole: int) -> None:
    """Cut inside the next record's first member: the record before is whole (the next one had
    started). Cut inside a record's second member: that record is not delivered with one member."""
    path = shard(tmp_path / "s.tar", 10)
    data = path.read_bytes()
    path.write_bytes(data[:member_offset(path, cut_in) + 512 + 100])
    with pytest.raises(ShardError, match=rf"s\.tar at byte \d+: truncated member '{cut_in}': expected 512 bytes, got "
                                         rf"100 \(the shard is cut short: copy or write it again, or leave it out\)"):
        keys(path)
    got, stats = keys(path, on_error="skip")
    assert got == [f"{n:03d}" for n in range(whole)] and stats["skipped_pieces"] == 1


@pytest.mark.parametrize("extra, message", [
    (tarfile.TarInfo("LICENSE"), r"member name 'LICENSE' has no key\.extension form: a shard holds samples only "
                                 r"\(leave it out: tar --delete -f SHARD 'LICENSE'; macOS's \._ files: make the tar "
                                 r"with COPYFILE_DISABLE=1\)"),
    (tarfile.TarInfo("._003.cls"), r"member name '\._003\.cls' has no key\.extension form"),
    (tarfile.TarInfo("003.png"), r"tar member '003\.png' \(symbolic link\) is not allowed in a shard: only regular "
                                 r"files and directories are \(tar --dereference stores the files links point to\)"),
])
def test_a_member_no_shard_holds_is_named_with_the_way_out_and_the_record_before_it_delivered(
        tmp_path: Path, extra: tarfile.TarInfo, message: str) -> None:
    if extra.name.endswith(".png"):
        extra.type, extra.linkname = tarfile.SYMTYPE, "elsewhere.png"
    else:
        extra.size = 10
    path = shard(tmp_path / "s.tar", 6, extra={3: extra})
    with pytest.raises(ShardError, match=rf"s\.tar at byte {member_offset(path, extra.name)}: {message}"):
        keys(path)
    got, stats = keys(path, on_error="skip")
    assert got == ["000", "001", "002"] and stats["skipped_pieces"] == 1


def test_two_tars_one_after_the_other_are_refused_not_read_as_the_first(tmp_path: Path) -> None:
    first, second = shard(tmp_path / "a.tar", 4), shard(tmp_path / "b.tar", 3)
    joined = tmp_path / "joined.tar"
    joined.write_bytes(first.read_bytes() + second.read_bytes())
    with pytest.raises(ShardError, match=rf"joined\.tar at byte {first.stat().st_size}: data after the end of the "
                                         rf"archive \(two tars one after the other, or a file appended to\?\): rewrite "
                                         rf"the shard as one tar"):
        keys(joined)
    got, stats = keys(joined, on_error="skip")  # (003 too could have lost members to a zeroed stretch)
    assert got == ["000", "001", "002"] and stats["skipped_pieces"] == 1
    padded = tmp_path / "padded.tar"  # zeros after the end-of-archive blocks are tar's blocking, not data
    padded.write_bytes(first.read_bytes() + bytes(10240))
    assert keys(padded)[0] == ["000", "001", "002", "003"]


@pytest.mark.parametrize("cut, whole", [("trailer", 10), ("006.cls", 6)])
def test_a_gzip_compressed_shard_cut_short_delivers_each_record_read_whole(tmp_path: Path, cut: str,
                                                                           whole: int) -> None:
    """Its stream fails where it is cut: at its end (the records all ended), or inside a member."""
    plain = shard(tmp_path / "s.tar", 10)
    data = plain.read_bytes()
    inside = member_offset(plain, cut) + 512 + 100 if cut != "trailer" else len(data)
    compressor = zlib.compressobj(wbits=31)  # a gzip stream, flushed where the cut goes
    head = compressor.compress(data[:inside]) + compressor.flush(zlib.Z_FULL_FLUSH)
    packed = head + compressor.compress(data[inside:]) + compressor.flush()
    path = tmp_path / "s.tar.gz"
    path.write_bytes(packed[:-4] if cut == "trailer" else head)
    with pytest.raises(ShardError, match=r"s\.tar\.gz: gzip-compressed shard is damaged or cut"):
        keys(path)
    got, stats = keys(path, on_error="skip")
    assert got == [f"{n:03d}" for n in range(whole)] and stats["skipped_pieces"] == 1
