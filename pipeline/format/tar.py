"""POSIX tar, the container of every shard: a minimal writer and a streaming reader.

The writer emits plain ustar members (fixed mode, owner and mtime, so two builds of the same
data give byte-identical shards). The reader walks 512-byte headers from any byte stream,
understands what other tools put in shards (PAX and GNU long names, directories), and turns
every malformed header or short read into a :class:`ShardError` naming the shard and byte
offset instead of hanging or guessing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from .compressed import GZIP_MAGIC
from .errors import ShardError

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
_MAX_OCTAL_SIZE = 8**11 - 1
#: Refuse members larger than this unless a reader raises it: a header claiming 100 GB must
#: not make a reader allocate 100 GB.
DEFAULT_MAX_MEMBER_BYTES = 4 << 30
#: PAX and GNU long-name headers hold a few names and numbers: larger ones are hostile.
MAX_EXTENDED_HEADER_BYTES = 1 << 20
#: Streams are read at most this much at a time, so that memory follows the bytes that
#: actually arrive, not the size a header claims.
READ_CHUNK_BYTES = 16 << 20
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def _octal(value: int, width: int) -> bytes:
    return f"{value:0{width - 1}o}".encode("ascii") + b"\0"


def _header_template() -> bytes:
    header = bytearray(BLOCK)
    header[100:108] = _octal(0o644, 8)
    header[108:116] = _octal(0, 8)
    header[116:124] = _octal(0, 8)
    header[136:148] = _octal(0, 12)
    header[156:157] = b"0"
    header[257:265] = b"ustar\x0000"
    return bytes(header)


_TEMPLATE = _header_template()
#: Checksum of the template with its checksum field as spaces (POSIX) and an all-zero size.
_TEMPLATE_SUM = sum(_TEMPLATE) + 8 * ord(" ")


def member_header(name: str, size: int) -> bytes:
    """The 512-byte ustar header of a regular file ``name`` of ``size`` bytes (mode 0644,
    owner 0, mtime 0: identical input gives identical shards)."""
    raw = name.encode("utf-8")
    if len(raw) > 100:
        raise ValueError(f"member name {name!r} is longer than 100 bytes")
    if size > _MAX_OCTAL_SIZE:
        raise ValueError(f"member {name!r} of {size} bytes exceeds the 8 GiB ustar limit")
    size_field = b"%011o\0" % size
    checksum = _TEMPLATE_SUM + sum(raw) + sum(size_field)
    return b"".join((raw, _TEMPLATE[len(raw):124], size_field, _TEMPLATE[136:148],
                     b"%06o\0 " % checksum, _TEMPLATE[156:]))


def padding(size: int) -> bytes:
    """Zero bytes that follow a member of ``size`` bytes up to the next block."""
    return b"\0" * (-size % BLOCK)


def member_bytes(size: int) -> int:
    """Bytes a member of ``size`` bytes occupies in the archive, header included."""
    return BLOCK + size + (-size % BLOCK)


def split_name(name: str) -> tuple[str, str] | tuple[None, None]:
    """Split ``dir/key.ext.more`` into ``("dir/key", "ext.more")``, webdataset's convention."""
    match = _KEY_RE.match(name)
    if not match:
        return None, None
    return match.group(1), match.group(2)


class BrokenAfterMember(ShardError):
    """The archive breaks at the member ``next_name``, whose header was read whole (its body is
    cut short, or it is of a type a shard may not hold, or not named ``key.extension``). Without
    an index, a record before it of another key is known complete as any record is: the next
    one started. (A cut between members is not one of these: the record before may have lost
    members.)"""

    next_name = ""

    @classmethod
    def at(cls, url: str, offset: int | None, reason: str, next_name: str) -> "BrokenAfterMember":
        error = cls(url, offset, reason)
        error.next_name = next_name
        return error


class BrokenAfterEnd(ShardError):
    """The archive's records all ended (its end-of-archive blocks read) before it broke: a
    compressed stream that fails at its end (its checksum, its trailer cut)."""


@dataclass(frozen=True)
class TarMember:
    """A regular file read from a tar stream. ``offset`` is where its headers start (its PAX
    or GNU long-name header when it has one: a reader that starts there sees its full name).
    ``data`` is a view into the buffer when the archive was given as bytes (no copy)."""

    name: str
    data: bytes | memoryview
    offset: int
    end: int = 0  # the byte after its padded data: where the next header starts


class _MemoryReader:
    """``read(n)`` over an in-memory archive, returning views instead of copies."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.view = memoryview(data).cast("B")
        self.position = 0

    def read(self, size: int) -> memoryview:
        chunk = self.view[self.position:self.position + size]
        self.position += len(chunk)
        return chunk


_REGULAR = (b"0", b"\0", b"7")
_EXTENDED = (b"x", b"g", b"L")
_DIRECTORY = b"5"
_REFUSED = {b"1": "hard link", b"2": "symbolic link", b"3": "character device", b"4": "block device",
            b"6": "FIFO", b"S": "GNU sparse file", b"K": "GNU long link name", b"M": "GNU multi-volume part",
            b"V": "GNU volume label", b"D": "GNU dump directory", b"N": "old GNU long name"}
_OCTAL = re.compile(rb"[0-7]+")
_DECIMAL = re.compile(rb"[0-9]{1,20}")
_PAX_LENGTH = re.compile(rb"([0-9]{1,20}) ")
_ZERO_BLOCK = bytes(BLOCK)


def _parse_number(field: bytes, url: str, offset: int, what: str) -> int:
    """A numeric header field: octal digits (NUL or space terminated), or GNU base-256 (first
    byte 0x80; 0xff marks a negative number). Anything else, signs included, is an error."""
    if field[0] == 0x80:
        return int.from_bytes(field[1:], "big")
    if field[0] == 0xFF:
        raise ShardError(url, offset, f"negative {what} in tar header")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if not _OCTAL.fullmatch(text):
        raise ShardError(url, offset, f"non-numeric {what} {text!r} in tar header")
    return int(text, 8)


def _check_checksum(header: bytes, url: str, offset: int) -> None:
    """The header sum with its checksum field as spaces; old tars summed signed bytes."""
    stored = _parse_number(header[148:156], url, offset, "checksum")
    unsigned = sum(header) - sum(header[148:156]) + 8 * ord(" ")
    if stored == unsigned:
        return
    high = sum(1 for b in header[:148] + header[156:] if b >= 0x80)
    if stored != unsigned - 256 * high:
        raise ShardError(url, offset, "bad tar header checksum (not a tar file, or corrupt)")


def _text(raw: bytes, url: str, offset: int, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ShardError(url, offset, f"{what} {raw[:100]!r} is not UTF-8") from None


def _parse_pax(data: bytes, url: str, offset: int) -> dict[bytes, bytes]:
    """The records ``<length> <key>=<value>\\n`` of a PAX extended header; values stay bytes
    (extended attributes may be binary), those we use are decoded where they are used."""
    records: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(data):
        match = _PAX_LENGTH.match(data, pos)
        end = pos + int(match.group(1)) if match else 0
        if not match or end > len(data) or end <= match.end() or data[end - 1] != ord("\n"):
            raise ShardError(url, offset, f"malformed PAX extended header (record at byte {pos} of it)")
        key, equals, value = data[match.end():end - 1].partition(b"=")
        if not equals or not key:
            raise ShardError(url, offset, f"malformed PAX record {data[pos:end][:100]!r}")
        records[key] = value
        pos = end
    return records


def _pax_size(pax: dict[bytes, bytes], url: str, offset: int) -> int | None:
    if any(key.startswith(b"GNU.sparse.") for key in pax):
        raise ShardError(url, offset, "GNU sparse member (PAX GNU.sparse.*) is not allowed in a shard")
    value = pax.get(b"size")
    if value is None:
        return None
    if not _DECIMAL.fullmatch(value):
        raise ShardError(url, offset, f"non-numeric PAX size {value[:40]!r}")
    return int(value)


def _ustar_name(header: bytes, url: str, offset: int) -> str:
    name = header[0:100].split(b"\0", 1)[0]
    prefix = header[345:500].split(b"\0", 1)[0]
    if header[257:262] == b"ustar" and prefix:
        name = prefix + b"/" + name
    return _text(name, url, offset, "member name")


class _Stream:
    """Reads exact byte counts from a stream and tracks the position, for error messages."""

    def __init__(self, stream: BinaryIO, url: str, position: int, chunk: int) -> None:
        self.stream = stream
        self.url = url
        self.position = position
        self.chunk = chunk

    def read(self, size: int, what: str, member: str | None = None) -> bytes | memoryview | None:
        """Exactly ``size`` bytes, ``None`` at a clean end before any byte, else ShardError
        (:class:`BrokenAfterMember` for the body of ``member``, a whole shard's: cut short, or a
        compressed stream that fails in it).
        Asks for ``chunk`` bytes at most at a time: a header that claims gigabytes costs
        memory only for the bytes that really follow it."""
        start = self.position
        try:
            data = self._read(size)
        except ShardError as exc:
            if member is None:
                raise
            raise BrokenAfterMember.at(self.url, exc.offset, exc.reason or str(exc), member) from None
        self.position += len(data)
        if len(data) < size and member is not None:
            raise BrokenAfterMember.at(self.url, start, f"truncated {what} {member!r}: expected {size} bytes, got "
                                       f"{len(data)} (the shard is cut short: copy or write it again, or leave it "
                                       f"out)", member)
        if len(data) < size and (data or what != "header"):
            raise ShardError(self.url, start, f"truncated {what}: expected {size} bytes, got {len(data)}")
        return data if data else None

    def _read(self, size: int) -> bytes | memoryview:
        data: bytes | memoryview = self.stream.read(min(size, self.chunk))
        if len(data) < size and data:
            buffer = bytearray(data)
            while len(buffer) < size:
                more = self.stream.read(min(size - len(buffer), self.chunk))
                if not more:
                    break
                buffer += more
            data = memoryview(buffer).toreadonly()
        return data

    def skip(self, size: int, what: str) -> None:
        """Read past ``size`` bytes (a directory's body) without keeping them."""
        while size:
            step = min(size, self.chunk)
            self.read(step, what)
            size -= step


def iter_members(
    stream: BinaryIO | bytes | bytearray | memoryview,
    url: str,
    start: int = 0,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    whole: bool = True,
) -> Iterator[TarMember]:
    """Yield the regular files of a tar stream (or of an archive already in memory, whose
    members are then views, not copies) that starts at byte ``start`` of shard ``url``.

    ``whole``: the stream is a whole shard, so it must end with the end-of-archive blocks
    (a shard cut at a member boundary is an error, not silently fewer members); pass
    ``False`` for a byte range of a shard that ends where a record starts.

    Directories and PAX global headers are skipped; links, devices and sparse files are
    refused (a shard has no use for them and a reader must not follow them).
    """
    if isinstance(stream, (bytes, bytearray, memoryview)):
        stream, chunk = _MemoryReader(stream), 1 << 62  # type: ignore[assignment]
    else:
        chunk = READ_CHUNK_BYTES
    reader = _Stream(stream, url, start, chunk)  # type: ignore[arg-type]
    pax: dict[bytes, bytes] = {}
    long_name: str | None = None
    first = None  # where the extended headers of the next member start
    while True:
        offset = reader.position
        block = reader.read(BLOCK, "header")
        if block is None or block == _ZERO_BLOCK:
            if first is not None:
                raise ShardError(url, first, "extended header is not followed by a member")
            if block is None and whole:
                raise ShardError(url, offset, "shard ends without the end-of-archive blocks (truncated)")
            if block is not None:
                _check_end(reader, url, offset, whole)
            return
        header = bytes(block)
        if offset == 0 and header[:2] == GZIP_MAGIC:
            raise ShardError(url, 0, "is gzip-compressed (a .tar.gz), not a plain tar: stream it without an "
                             "index, or decompress it (gunzip) to index it or read it by ranges")
        try:
            _check_checksum(header, url, offset)
        except ShardError as exc:
            if offset:
                raise
            reason = (exc.reason or "").removesuffix(" (not a tar file, or corrupt)")
            raise ShardError(url, 0, f"{reason}: not a tar file (or its first header is damaged)") from None
        kind = header[156:157]
        size = _parse_number(header[124:136], url, offset, "size")
        if kind in _EXTENDED:
            if size > MAX_EXTENDED_HEADER_BYTES:
                raise ShardError(url, offset, f"extended header of {size} bytes (at most {MAX_EXTENDED_HEADER_BYTES})")
            data = bytes(reader.read(size + (-size % BLOCK), "extended header") or b"")[:size]
            if kind == b"x":
                pax.update(_parse_pax(data, url, offset))
            elif kind == b"L":
                long_name = _text(data.split(b"\0", 1)[0], url, offset, "GNU long name")
            else:
                _parse_pax(data, url, offset)  # global header: checked, nothing we use
                continue
            first = offset if first is None else first
            continue
        pax_size = _pax_size(pax, url, offset) if pax else None
        size = size if pax_size is None else pax_size
        if size > max_member_bytes:
            raise ShardError(url, offset, f"member of {size} bytes exceeds the limit of {max_member_bytes}")
        name = _text(pax[b"path"], url, offset, "PAX path") if pax.get(b"path") else long_name
        if name is None:
            name = _ustar_name(header, url, offset)
        padded = size + (-size % BLOCK)
        if kind == _DIRECTORY or (kind == b"\0" and name.endswith("/")):
            reader.skip(padded, "directory")
        elif kind in _REGULAR:
            body = reader.read(padded, "member", name if whole else None) if padded else b""
            yield TarMember(name, (body or b"")[:size], offset if first is None else first, reader.position)
        else:
            what = _REFUSED.get(kind, f"unknown type {kind!r}")
            raise BrokenAfterMember.at(url, offset, f"tar member {name!r} ({what}) is not allowed in a shard: only "
                                       f"regular files and directories are (tar --dereference stores the files "
                                       f"links point to)", name)
        pax, long_name, first = {}, None, None


def _check_end(reader: _Stream, url: str, offset: int, whole: bool) -> None:
    """After a zero block comes the second block of the end-of-archive marker, or less of it (a
    cut inside the marker loses no data); a header after one zero block was zeroed. A whole
    shard is read to its end, which may hold zero padding (tar pads to its blocking factor),
    nothing else: a second tar after the first would otherwise go unread."""
    rest = reader.stream.read(BLOCK)
    if rest and rest != _ZERO_BLOCK[:len(rest)]:
        raise ShardError(url, offset, "a zero block inside the archive (a zeroed header?)")
    position = offset + BLOCK + len(rest)
    while whole:
        try:
            block = bytes(reader.stream.read(1 << 20))
        except ShardError as exc:  # a compressed stream's checksum, checked at its end
            raise BrokenAfterEnd(url, exc.offset, exc.reason or str(exc)) from None
        if not block:
            return
        if block.count(0) != len(block):  # (a second tar, or a stretch zeroed over members that looked like the
            # end: the record before may have lost members, so it is not delivered)
            where = position + next(i for i, byte in enumerate(block) if byte)
            raise ShardError(url, where - where % BLOCK, "data after the end of the archive (two tars one after "
                             "the other, or a file appended to?): rewrite the shard as one tar")
        position += len(block)
