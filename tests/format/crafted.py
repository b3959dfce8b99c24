"""What the hostile-input tests share: hand-made shard bytes (tar headers with any field set to
anything, the checksum made valid unless a test breaks it on purpose; small valid shards to
mutate) and the fixed, derandomised example budget of their property-based tests."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings

from pipeline import encode_sample
from pipeline.format.tar import END_OF_ARCHIVE, member_header, padding

#: Every run (and CI) tries the same examples; tests raise ``max_examples`` where they can afford it.
FUZZ = settings(max_examples=100, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


def with_checksum(block: bytes | bytearray) -> bytes:
    """``block`` with its checksum field set to the sum of its bytes (POSIX, unsigned)."""
    header = bytearray(block)
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def header(name: bytes = b"a.bin", size: int = 0, kind: bytes = b"0", size_field: bytes | None = None) -> bytes:
    """A ustar header; ``size_field`` (12 bytes) replaces the octal size when given."""
    block = bytearray(member_header("x", 0))
    block[0:100] = name[:100].ljust(100, b"\0")
    block[124:136] = b"%011o\0" % size if size_field is None else size_field
    block[156:157] = kind
    return with_checksum(block)


def member(name: bytes, data: bytes, kind: bytes = b"0") -> bytes:
    """Header, data and padding of one member."""
    return header(name, len(data), kind) + data + padding(len(data))


def pax(records: bytes) -> bytes:
    """A PAX extended header (type ``x``) holding ``records`` as they are."""
    return member(b"././@PaxHeader", records, b"x")


def pax_record(key: bytes, value: bytes) -> bytes:
    """One well-formed PAX record: its length counts its own digits."""
    body = b" " + key + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return b"%d" % length + body


def archive(*parts: bytes) -> bytes:
    """Members, then the end-of-archive blocks."""
    return b"".join(parts) + END_OF_ARCHIVE


def record_member(key: str, sample: dict) -> bytes:
    """One of our records: ``<key>.msgpack`` holding ``sample``."""
    return member(f"{key}.msgpack".encode(), encode_sample(sample, key))


def small_shard(records: int = 4, width: int = 3) -> bytes:
    """A valid shard of ``records`` records ``{"i": n, "x": float32[width], "s": str}``."""
    return archive(*(record_member(f"{n:06d}", {"i": n, "x": np.full(width, n, np.float32), "s": f"r{n}"})
                     for n in range(records)))
