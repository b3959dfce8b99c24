"""Records: consecutive tar members that share a key, and how to decode them.

Our shards hold one ``<key>.msgpack`` member per record. Shards written by ``webdataset``
or other tools hold one member per field (``<key>.npy``, ``<key>.cls``, ``<key>.json``...);
those decode by extension here, so both stream through the same reader. Unknown
extensions stay raw ``bytes``: nothing is ever unpickled.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator

import msgpack
import numpy as np

from . import npy
from .codec import array_view, check_dtype, decode_record
from .errors import SampleError, ShardError
from .msgpack_walk import starts_a_map
from .tar import DEFAULT_MAX_MEMBER_BYTES, BrokenAfterEnd, BrokenAfterMember, iter_members, split_name


@dataclass(frozen=True)
class Record:
    """One record of a shard: its key, member payloads by extension, the byte offset of its
    first header and the byte after its last member."""

    key: str
    members: dict[str, bytes | memoryview]
    offset: int
    end: int = 0


def iter_records(
    stream: BinaryIO | bytes | memoryview,
    url: str,
    start: int = 0,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    whole: bool = True,
    pending_on_error: bool = False,
    pending_after_member: bool = False,
) -> Iterator[Record]:
    """Group the members of a tar stream into records (members with the same key); see
    :func:`~pipeline.format.tar.iter_members` for ``whole``. A record is known to be complete
    only once the next member's header is read: with ``pending_on_error``, a structure that
    breaks after a record's members (the next header, the end of the archive) still yields that
    record before the error, for a caller that checks it (against its checksum) not to lose it;
    with ``pending_after_member``, only where the archive broke at a member of another key, whose
    header was read, or after its end-of-archive blocks (a reader without checksums)."""
    if isinstance(stream, (str, os.PathLike)):
        raise TypeError(f"iter_records reads a shard's bytes or an open file, got the path {stream!r}: "
                        f"with open(path, 'rb') as file: iter_records(file, path)")
    key: str | None = None
    members: dict[str, bytes | memoryview] = {}
    offset = end = 0
    try:
        for member in iter_members(stream, url, start, max_member_bytes, whole):
            name_key, ext = split_name(member.name)
            if name_key is None or ext is None:
                raise BrokenAfterMember.at(url, member.offset, f"member name {member.name!r} has no key.extension "
                                           f"form: a shard holds samples only (leave it out: tar --delete -f SHARD "
                                           f"{member.name!r}; macOS's ._ files: make the tar with COPYFILE_DISABLE=1)",
                                           member.name)
            ext = ext.lower()  # webdataset's fields: cat.JPG is a "jpg", as cat.jpg beside it
            if name_key == key:
                if ext in members:
                    raise ShardError(url, member.offset, f"record {key!r} has two {ext!r} members")
                members[ext], end = member.data, member.end
                continue
            if key is not None:
                yield Record(key, members, offset, end)
            key, members, offset, end = name_key, {ext: member.data}, member.offset, member.end
    except ShardError as exc:
        if key is not None and (pending_on_error or (pending_after_member and _after(exc, key))):
            yield Record(key, members, offset, end)
        raise
    if key is not None:
        yield Record(key, members, offset, end)


def _after(exc: ShardError, key: str) -> bool:
    """Whether ``exc`` broke the archive after record ``key``'s members, not inside them."""
    return isinstance(exc, BrokenAfterEnd) or (isinstance(exc, BrokenAfterMember) and split_name(exc.next_name)[0] != key)


def _load_npy(data: bytes | memoryview) -> np.ndarray:
    """A ``.npy`` member as a read-only view of its bytes. ``np.load`` would first allocate
    what the header claims (a 100-byte member can claim 30 GB); here the shape must match the
    bytes that follow the header."""
    dtype, shape, fortran, start = npy.read_header(io.BytesIO(data).read)
    if dtype.kind not in "US":  # (text arrays: a batch's lists of str, bytes)
        try:
            check_dtype(dtype)  # (the dtypes the format stores, which a batch's tensor holds)
        except TypeError:
            raise SampleError(f".npy array of dtype {dtype}, which no batch's tensor holds (bool, int8-64, uint8-64, "
                              f"float16/32/64 do: save it as one of those, a datetime64 as int64, say)") from None
    return array_view(data, dtype, shape, start, fortran)


def _msgpack_value(data: bytes) -> Any:
    """A foreign ``.msgpack`` member's value; one Python cannot hold (a map keyed by a list: a
    TypeError) is a :class:`SampleError`, as any member that does not decode."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except TypeError as exc:
        raise SampleError(f"member 'msgpack': a msgpack value Python cannot hold ({exc})") from None


_DECODERS: dict[str, Callable[[bytes], Any]] = {
    "npy": _load_npy,
    "cls": int,
    "cls2": int,
    "index": int,
    "id": int,
    "json": json.loads,
    "jsn": json.loads,
    "txt": lambda b: b.decode("utf-8"),
    "text": lambda b: b.decode("utf-8"),
    "msgpack": _msgpack_value,  # (webdataset's field of that name)
}


def decode_member(ext: str, data: bytes | memoryview) -> Any:
    """Decode one foreign member by the last part of its extension (raw bytes if unknown)."""
    decoder = _DECODERS.get(ext.rsplit(".", 1)[-1].lower())
    data = bytes(data)
    return data if decoder is None else decoder(data)


def decode_fields(record: Record, url: str) -> dict[str, Any]:
    """All fields of a record: those of its msgpack map where it is one of ours (a ``.msgpack``
    member alone, holding a map), else one a member. A ``.msgpack`` member beside others (or
    holding no map) is a field of that name, a msgpack value, as webdataset writes its field
    ``msgpack``: read as ours, its map's keys became fields, and a list failed the whole shard."""
    fields: dict[str, Any] = {}
    ours = _ours(record.members)
    try:
        for ext, data in record.members.items():
            fields.update(decode_record(data) if ours else {ext: decode_member(ext, data)})
    except SampleError as exc:
        raise ShardError(url, record.offset, f"record {record.key!r}: {exc}{_way_out(ext)}") from None
    except (ValueError, RecursionError) as exc:  # int(), json and UTF-8 on foreign members
        raise ShardError(url, record.offset,
                         f"record {record.key!r}, member {ext!r}: {type(exc).__name__}: {exc}{_way_out(ext)}") from None
    return fields


def _ours(members: dict[str, Any]) -> bool:
    """Whether ``members`` are a record of ours: a ``.msgpack`` member alone that starts a map
    (fixmap, map16, map32), or that holds no msgpack value at all (one of ours damaged, whose
    error is a record's)."""
    data = members.get("msgpack")
    if data is None or len(members) > 1:
        return False
    if len(data) and starts_a_map(data[0]):
        return True
    try:
        msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, msgpack.exceptions.UnpackException):
        return True
    except TypeError:  # (a value Python cannot hold: another tool's, refused as its member)
        return False
    return False


def _way_out(ext: str) -> str:
    """What to do about a member of another tool's shard that does not decode by its extension."""
    if ext == "msgpack":
        return ""
    return (" (a member decodes by its extension: .cls a whole number, .json JSON, .txt UTF-8 text, .npy an array "
            "without Python objects; write the member again so, or under another extension, such as .bin, to get "
            "its bytes as they are)")
