"""One walk over the records of a shard, with every check a reader makes, for every reader.

Scanning a shard (a resumed build, indexing shards written by other tools), verifying it, the
loader's reads (ranges of an indexed shard, whole shards without an index) and inspecting it
all read records this way, so a rule added here holds everywhere:

- the tar structure: headers, sizes, truncation, the end of the archive (:mod:`.tar`);
- a record is the run of consecutive members sharing a key (:mod:`.records`), and a key
  appears once in what is walked;
- its fields decode (a msgpack map, or members by extension) and, given the index's schema,
  conform to it (:mod:`.conform`);
- every column of a packed record holds the rows the record says it holds;
- given the shard's index entry: the record starts at the byte the index says, its checksum
  matches, and the shard holds no more records than the index says.

Each problem raises :class:`~pipeline.format.errors.ShardError` naming the shard and the byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator

from .conform import check_conforms
from .errors import IndexSchemaError, SampleError, ShardError
from .index import Schema
from .packing import checked_rows
from .records import Record, decode_fields, iter_records
from .shard_table import ShardInfo, check_record_checksum, check_record_offset


@dataclass(frozen=True)
class WalkedRecord:
    """A record that passed every check: ``number`` is its place in the shard, ``rows`` the
    samples it holds."""

    record: Record
    number: int
    fields: dict[str, Any]
    rows: int

    @property
    def key(self) -> str:
        return self.record.key

    @property
    def offset(self) -> int:
        return self.record.offset

    @property
    def end(self) -> int:
        return self.record.end


#: Told of a record that failed a check of its own (its decoding, rows, key or checksum) and its
#: number in the shard, instead of raising: the walk then goes on with the next record.
BadRecordHandler = Callable[[ShardError, int], None]


def walk_shard(
    source: BinaryIO | bytes | memoryview,
    url: str,
    *,
    start: int = 0,
    first_record: int = 0,
    whole: bool = True,
    schema: Schema | None = None,
    entry: ShardInfo | None = None,
    checksums: bool = True,
    records: int | None = None,
    on_bad_record: BadRecordHandler | None = None,
) -> Iterator[WalkedRecord]:
    """The records of ``source`` (a stream, or bytes whose members are then views, not copies),
    which starts at byte ``start`` of shard ``url`` with record number ``first_record``,
    checked as the module docstring says. ``whole``: ``source`` is a whole shard, which must end
    with the end-of-archive blocks; else a byte range ending where a record starts. ``schema``
    and ``entry`` (the shard's index entry; ``checksums=False`` skips the checksums) add their
    checks; ``records`` stops after that many (bad ones included).

    A broken tar structure, or a record that does not start where the index says, raises (what
    follows cannot be trusted to be records); a record that fails a check of its own raises too,
    unless ``on_bad_record`` is given: then it is reported and left out."""
    if records == 0:
        return
    keys: dict[str, int] = {}
    number = first_record
    for record in iter_records(source, url, start, whole=whole, pending_on_error=entry is not None and checksums,
                               pending_after_member=entry is None):
        if entry is not None and number >= entry.records:
            raise ShardError(url, record.offset, f"more records than the {entry.records} the index says")
        if entry is not None:  # where it starts, before decoding bytes that may not be a record
            check_record_offset(record, entry, number, url)
        try:
            walked = _checked(record, number, url, keys, schema, entry if checksums else None)
        except ShardError as exc:
            if on_bad_record is None:
                raise
            on_bad_record(exc, number)
        else:
            yield walked
        number += 1
        if records is not None and number - first_record == records:
            return  # a range ends here: do not look for a next header


def _checked(record: Record, number: int, url: str, keys: dict[str, int], schema: Schema | None,
             entry: ShardInfo | None) -> WalkedRecord:
    """Record ``number`` once its own checks pass (``entry``: check its checksum)."""
    if keys.setdefault(record.key, record.offset) != record.offset:
        dotted = next((ext for ext in record.members if "." in ext), None)
        why = (f"a key ends at the first dot of a member's name ({record.key}.{dotted}): replace the dots in the "
               f"names' keys" if dotted else "the members of a sample must be next to each other (tar --sort=name "
               "puts them so)")
        raise ShardError(url, record.offset, f"record key {record.key!r} appears twice (first at byte "
                                             f"{keys[record.key]}): {why}")
    if entry is not None:
        try:
            check_record_checksum(record, entry, number, url)
        except ShardError:
            decode_fields(record, url)  # what no longer decodes says more than the checksum
            raise
    fields = decode_fields(record, url)
    if schema is not None:  # (a checksum covers members' bytes, not their names: only a record of one
        # msgpack member, as this library writes them, is as written in every part its fields come from)
        _check_schema(fields, schema, record, url, intact=entry is not None and record.members.keys() == {"msgpack"})
    try:
        rows = checked_rows(fields)
    except SampleError as exc:
        raise ShardError(url, record.offset, f"record {record.key!r}: {exc}") from None
    return WalkedRecord(record, number, fields, rows)


def _check_schema(fields: dict[str, Any], schema: Schema, record: Record, url: str, intact: bool) -> None:
    """Raise unless the decoded ``fields`` match the index's ``schema``: a ShardError (the
    record is damaged), or, when the record is ``intact`` (what its fields are decoded from is
    what the table's checksum covers, and matches it), an :class:`IndexSchemaError` (the index
    is what is wrong)."""
    try:
        check_conforms(fields, schema)
    except SampleError as exc:
        if not intact:
            raise ShardError(url, record.offset, f"record {record.key!r}: {exc}") from None
        raise IndexSchemaError(url, record.offset, f"record {record.key!r}: {exc}; the record is as written (its "
                                                   f"checksum is the shard table's), so index.json's schema is not "
                                                   f"the one its shards were written with") from None
