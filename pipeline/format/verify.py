"""Check one shard, read from a stream, against its index entry: size, sha256, record offsets,
checksums and counts, decoding, the rows of each record as the loader reads them; and a shard
table against its sha256.

Every problem is reported with the shard, the record number and byte offset when known, and
the reason; a shard's check stops at its first problem (what follows is not trustworthy). Where
the bytes come from is the caller's business (:mod:`pipeline.check.verify` opens them by path
or URL), so this module reads nothing but the streams it is given, each once, front to back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Callable

from .conform import check_conforms
from .errors import SampleError, ShardError
from .hashing import HashingReader
from .index import DatasetIndex, ShardInfo, TableFile
from .walk import WalkedRecord, walk_shard


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a shard (or with the shard table): ``shard`` names it, ``record``
    and ``offset`` say where in it when known."""

    shard: str
    reason: str
    record: int | None = None
    offset: int | None = None

    def __str__(self) -> str:
        where = self.shard
        if self.record is not None:
            where += f" record {self.record}"
        if self.offset is not None:
            where += f" (byte {self.offset})"
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class IndexProblem(Problem):
    """A shard that is sound (its sha256 is the index's), but that ``index.json`` misdescribes:
    what is wrong is the index (:mod:`pipeline.check.verify` blames it, once for each ``told``)."""

    @property
    def told(self) -> object:
        """What this problem says of the index: the same is told once, not once per shard."""
        return type(self)


@dataclass(frozen=True)
class PackProblem(IndexProblem):
    """A shard whose records hold ``pack`` rows each (the last maybe fewer), not the index's
    pack. The record counts of the shard table cannot tell packs apart that give each shard as
    many records (200 samples are 4 records of 50 or of 64): only the records' rows can, and the
    loader refuses the first record it reads."""

    pack: int = 0

    @property
    def told(self) -> object:
        return self.pack


@dataclass(frozen=True)
class SchemaProblem(IndexProblem):
    """A shard whose records hold other fields, dtypes or shapes than the index's schema says
    (an edited ``index.json``): the loader refuses the first record it reads."""


@dataclass(frozen=True)
class ValueProblem(Problem):
    """Records of a shard that pass the format's checks but fail a check of their values (images
    that do not decode), in a shard whose sha256 is the index's: they were so when the set was
    built, so copying the shard again, or building it again from the same files, does not mend
    them."""


@dataclass
class _Rows:
    """The rows of a shard's records as they are walked, against the loader's rule: record
    ``n`` of a shard of ``samples`` holds ``min(pack, samples - n * pack)`` rows. Whether they
    follow another pack (every record the first's rows, the last no more) says who is to blame:
    the index's pack, or the shard."""

    pack: int
    samples: int
    first: int | None = None  # the rows of record 0
    last: int = 0  # the rows of the latest record
    uneven: bool = False  # a record before the latest holds other rows than record 0
    wrong: Problem | None = None  # the first record the loader would refuse

    def add(self, walked: WalkedRecord, shard: str) -> None:
        expected = min(self.pack, self.samples - walked.number * self.pack)
        if walked.rows != expected and self.wrong is None:  # the loader's words (pipeline.stream.reader)
            self.wrong = Problem(shard, f"record {walked.key!r} holds {walked.rows} rows, the index says {expected}",
                                 walked.number, walked.offset)
        if self.first is None:
            self.first = walked.rows
        elif self.last != self.first:
            self.uneven = True
        self.last = walked.rows

    def other_pack(self) -> int | None:
        """The pack the records follow when it is not the index's; None when they follow the
        index's, or no pack at all (then :attr:`wrong` is the shard's problem)."""
        if self.wrong is None or self.first is None or self.uneven or self.last > self.first:
            return None
        return self.first


#: A check of a record's values beyond the format's (its images decode, say): the reason each of
#: them that fails does (none: it passes).
RecordCheck = Callable[[WalkedRecord], list[str]]


def _record_problem(stream: HashingReader, info: ShardInfo, index: DatasetIndex, shard: str,
                    check: RecordCheck | None = None) -> Problem | None:
    """The first problem of the records of a shard (offsets, checksums, keys, decoding, counts,
    rows); else those ``check`` finds, all of them in one problem (the first's place, the others
    listed: a damaged image is worth knowing of before training, each of them); else a
    an :class:`IndexProblem` when the records follow another schema or pack than the index's."""
    samples = 0
    rows = _Rows(index.pack, info.samples)
    number = 0  # the record being read
    failed: list[tuple[int, int, str]] = []
    schema_wrong: SchemaProblem | None = None  # the first record the index's schema does not describe
    try:
        for walked in walk_shard(stream, shard, entry=info):  # type: ignore[arg-type]
            if schema_wrong is None and index.fields:
                schema_wrong = _schema_problem(walked, index, shard)
            for reason in [] if check is None else check(walked):
                failed.append((number, walked.offset, f"record {walked.key!r}: {reason}"))
            rows.add(walked, shard)
            samples += walked.rows
            number += 1
    except ShardError as exc:  # after the last record, no record of the index is to blame
        return Problem(shard, exc.reason or str(exc), number if number < info.records else None, exc.offset)
    if number != info.records:
        return Problem(shard, f"{number} records, the index says {info.records}")
    if samples != info.samples:
        return Problem(shard, f"{samples} samples, the index says {info.samples}")
    if schema_wrong is not None:
        return schema_wrong
    pack = rows.other_pack()
    if rows.wrong is not None and pack is None:
        return rows.wrong
    if not failed:
        return None if pack is None else PackProblem(shard, f"its records hold {pack} rows each, the index says "
                                                            f"pack={index.pack}", pack=pack)
    first, offset, reason = failed[0]
    others = [listed for *_, listed in failed[1:]]
    if others:
        reason += f"; and {len(others)} more: {'; '.join(others[:5])}{'; ...' if len(others) > 5 else ''}"
    return ValueProblem(shard, reason, first, offset)


def _schema_problem(walked: WalkedRecord, index: DatasetIndex, shard: str) -> SchemaProblem | None:
    """The problem of a record that does not match the index's schema, else None."""
    try:
        check_conforms(walked.fields, index.fields)
    except SampleError as exc:
        return SchemaProblem(shard, f"record {walked.key!r}: {exc}", walked.number, walked.offset)
    return None


def verify_stream(stream: BinaryIO, shard: str, info: ShardInfo, index: DatasetIndex,
                  check: RecordCheck | None = None) -> Problem | None:
    """The first problem of one shard, read whole from ``stream``, or ``None`` if it matches its
    index entry (and each record passes ``check``); ``shard`` names it in the problem. A size
    that differs from the index's is reported before what it breaks (a cut shard's last record
    is cut too); an :class:`IndexProblem` or a :class:`ValueProblem` only of a shard whose sha256
    is the index's (an intact shard, which the index misdescribes, or that holds what was given)."""
    reader = HashingReader(stream)
    problem = _record_problem(reader, info, index, shard, check)
    reader.drain()
    if reader.size != info.bytes:
        return Problem(shard, f"size is {reader.size} bytes, the index says {info.bytes}")
    if problem is not None and not isinstance(problem, (IndexProblem, ValueProblem)):
        return problem
    if reader.sha.hexdigest() != info.sha256:  # (values that fail their check in a damaged shard: its damage)
        changed = f"sha256 {reader.sha.hexdigest()} differs from the index's {info.sha256}"
        if isinstance(problem, SchemaProblem):  # the shard changed where it holds a record's fields (a renamed
            return Problem(shard, f"{problem.reason}; {changed}", problem.record, problem.offset)  # member): there
        return Problem(shard, changed)
    return problem


def verify_table_stream(stream: BinaryIO, shown: str, table: TableFile) -> Problem | None:
    """The shard table's own checksum, read from ``stream`` (its size and counts were checked
    when the index was opened); ``shown`` names it in the problem."""
    reader = HashingReader(stream)
    reader.drain()
    if reader.sha.hexdigest() != table.sha256:
        return Problem(shown, f"sha256 {reader.sha.hexdigest()} differs from the index's {table.sha256}")
    return None
