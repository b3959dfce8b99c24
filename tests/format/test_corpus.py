"""Regression corpus: inputs that the reader once got wrong, each kept as a file in ``corpus/``.

Each entry says what the input once did (read silently as something else, or raised an
exception of NumPy, msgpack, JSON or MemoryError) and the error it must give now.
Files named ``tar-*`` are whole shards read with ``iter_records`` and ``decode_fields``; files
named ``record-*`` are record payloads given to ``decode_record``.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pipeline import SampleError, ShardError, decode_record
from pipeline.format.records import decode_fields, iter_records

CORPUS = Path(__file__).parent / "corpus"

EXPECTED = {
    # once: size "-1" read as an empty member
    "tar-negative-size.bin": r"at byte 0: non-numeric size b'-0000000001'",
    # once: PAX length past the header's end, path read as "z.msgpack\n" (key "z", field "msgpack\n")
    "tar-pax-length-past-end.bin": r"at byte 0: malformed PAX extended header",
    # once: PAX size "-1" read as an empty member
    "tar-pax-negative-size.bin": r"at byte 1024: non-numeric PAX size b'-1'",
    # once: PAX size " 1 " taken as 1, so a byte of the end-of-archive block became the member
    "tar-pax-size-with-spaces.bin": r"at byte 1024: non-numeric PAX size b' 1 '",
    # once: a PAX record without '=' ignored
    "tar-pax-record-without-equals.bin": r"at byte 0: malformed PAX record",
    # once: an extended header with no member after it ignored
    "tar-dangling-pax-header.bin": r"at byte 1024: extended header is not followed by a member",
    # once: a shard cut between members read as a shorter shard
    "tar-cut-at-member-boundary.bin": r"at byte 2048: shard ends without the end-of-archive blocks",
    # once: a zeroed header taken for the end of the archive: the records after it lost
    "tar-zeroed-header.bin": r"at byte 1024: a zero block inside the archive",
    # once: names b"\xff.msgpack" and b"\xfe.cls" both decoded as key "\ufffd": two records merged
    "tar-name-not-utf8.bin": r"at byte 0: member name b'\\xff\.msgpack' is not UTF-8",
    # once: a GNU long name of invalid UTF-8 decoded with replacement characters
    "tar-gnu-long-name-not-utf8.bin": r"at byte 0: GNU long name b'\\xff.*' is not UTF-8",
    # once: np.load allocated the 30 GB the header claims (MemoryError)
    "tar-npy-claims-30-gb.bin": r"at byte 0: record 'a': array of shape \(4000000000,\) .* needs 32000000000 bytes",
    # once: RecursionError out of json.loads (Python 3.13's json refuses it as a JSONDecodeError)
    "tar-json-nested-5000.bin": r"at byte 0: record 'a', member 'json': (RecursionError|JSONDecodeError)",
    # once: decoded into a msgpack.Timestamp, a value no writer of ours produces
    "record-timestamp-extension.bin": r"unknown msgpack extension type -1 at byte 4",
    # once: the second value silently replaced the first
    "record-duplicate-field.bin": r"field 'a' appears twice",
    # once: a field named b"a" (bytes) handed to the reader
    "record-bytes-field-name.bin": r"field names must be strings",
    # once: dtype ">f4" read as "<f4": [1.0, 2.0] came back as [4.6e-41, 9.0e-44]
    "record-big-endian-array.bin": r"field 'a': array extension has bad dtype b'>f4'",
    # once: a bfloat16 extension's dtype string was not looked at
    "record-bfloat16-claiming-float64.bin": r"field 'a': array extension has bad dtype b'<f8'",
    # once: NumPy's "Maximum allowed dimension exceeded", caught only by a catch-all
    "record-zero-size-array-of-huge-dims.bin": r"field 'a': array shape \(0, 18446744073709551615\) .* overflows",
}


def test_every_corpus_file_has_an_expectation() -> None:
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_input_is_refused_as_it_should_be(name: str) -> None:
    data = (CORPUS / name).read_bytes()
    if name.startswith("tar-"):
        with pytest.raises(ShardError, match=rf"^{name} {EXPECTED[name]}"):
            for record in iter_records(io.BytesIO(data), name):
                decode_fields(record, name)
    else:
        with pytest.raises(SampleError, match=EXPECTED[name]):
            decode_record(data)
