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

from .errors import ShardError

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
_MAX_OCTAL_SIZE = 8**11 - 1
#: Refuse members larger than this unless a reader raises it: a header claiming 100 GB must
#: not make a reader allocate 100 GB.
DEFAULT_MAX_MEMBER_BYTES = 4 << 30
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


@dataclass(frozen=True)
class TarMember:
    """A regular file read from a tar stream; ``offset`` is where its header starts. ``data``
    is a memoryview into the buffer when the archive was given as bytes (no copy)."""

    name: str
    data: bytes | memoryview
    offset: int


class _MemoryReader:
    """``read(n)`` over an in-memory archive, returning views instead of copies."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.view = memoryview(data).cast("B")
        self.position = 0

    def read(self, size: int) -> memoryview:
        chunk = self.view[self.position:self.position + size]
        self.position += len(chunk)
        return chunk


def _parse_number(field: bytes, url: str, offset: int, what: str) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256
        if field[0] & 0x40:
            raise ShardError(url, offset, f"negative {what} in tar header")
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise ShardError(url, offset, f"non-numeric {what} {text!r} in tar header") from None


def _parse_pax(data: bytes, url: str, offset: int) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
            if space < 0 or length <= 0:
                raise ValueError
        except ValueError:
            raise ShardError(url, offset, "malformed PAX extended header") from None
        entry = data[space + 1:pos + length - 1]
        key, _, value = entry.partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += length
    return records


class _Stream:
    """Reads exact byte counts from a stream and tracks the position, for error messages."""

    def __init__(self, stream: BinaryIO, url: str, position: int) -> None:
        self.stream = stream
        self.url = url
        self.position = position

    def read(self, size: int, what: str) -> bytes | memoryview | None:
        """Exactly ``size`` bytes, ``None`` at a clean end before any byte, else ShardError."""
        chunks = []
        remaining = size
        while remaining:
            chunk = self.stream.read(remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        start = self.position
        self.position += len(data)
        if remaining and (data or what != "header"):
            raise ShardError(self.url, start, f"truncated {what}: expected {size} bytes, got {len(data)}")
        return data if data else None


def iter_members(
    stream: BinaryIO | bytes | bytearray | memoryview,
    url: str,
    start: int = 0,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
) -> Iterator[TarMember]:
    """Yield the regular files of a tar stream (or of an archive already in memory, whose
    members are then views, not copies) that starts at byte ``start`` of shard ``url``.

    Directories and PAX global headers are skipped; links and device files are refused
    (a shard has no use for them and a reader must not follow them).
    """
    if isinstance(stream, (bytes, bytearray, memoryview)):
        stream = _MemoryReader(stream)  # type: ignore[assignment]
    reader = _Stream(stream, url, start)  # type: ignore[arg-type]
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        offset = reader.position
        block = reader.read(BLOCK, "header")
        if block is None:
            return  # stream ended without end-of-archive blocks: tolerated, like GNU tar
        header = bytes(block)
        if header == b"\0" * BLOCK:
            return
        stored = _parse_number(header[148:156], url, offset, "checksum")
        actual = sum(header[:148]) + 8 * 32 + sum(header[156:])
        if stored != actual:
            raise ShardError(url, offset, "bad tar header checksum (not a tar file, or corrupt)")
        size = _parse_number(header[124:136], url, offset, "size")
        kind = header[156:157]
        if "size" in pax:
            try:
                size = int(pax["size"])
            except ValueError:
                raise ShardError(url, offset, f"non-numeric PAX size {pax['size']!r}") from None
        if size > max_member_bytes:
            raise ShardError(url, offset, f"member of {size} bytes exceeds the limit of {max_member_bytes}")
        padded = size + (-size % BLOCK)
        if kind in (b"0", b"\0", b"7", b"x", b"g", b"L"):
            body = reader.read(padded, "member") if padded else b""
            data = (body or b"")[:size]
        elif kind == b"5":
            if padded:
                reader.read(padded, "member")
            long_name, pax = None, {}
            continue
        else:
            raise ShardError(url, offset, f"tar member of type {kind!r} (link or device) is not allowed in a shard")
        if kind == b"x":
            pax = _parse_pax(bytes(data), url, offset)
            continue
        if kind == b"g":
            continue
        if kind == b"L":
            long_name = bytes(data).split(b"\0", 1)[0].decode("utf-8", "replace")
            continue
        name = pax.get("path") or long_name
        if name is None:
            name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "replace")
            prefix = header[345:500].split(b"\0", 1)[0]
            if header[257:262] == b"ustar" and prefix:
                name = prefix.decode("utf-8", "replace") + "/" + name
        long_name, pax = None, {}
        yield TarMember(name, data, offset)
