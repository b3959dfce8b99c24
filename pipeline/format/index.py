"""``index.json``: what a shard set holds and where every record starts.

One index per shard set, beside its shards, written last by every build so that an index
never names a shard that is incomplete. The JSON stays small whatever the size of the set:
the format version, the field schema (name, dtype, per-sample shape), the pack size, the
totals, the shard names (as brace ranges, see :mod:`.shard_names`), and the name, size and
sha256 of the binary *shard table* beside it (:mod:`.shard_table`), and the build's metadata
(an image folder's class names, say). The table holds per shard its
samples, records, bytes and sha256, and the byte offset and checksum of every record, so that
a reader can start at any record with a seek or a ranged request, and check what it reads.

A *partial* index (``index.part-00001-of-00004.json``) is what one part of a distributed
build writes; ``merge_indexes`` joins the parts into the final index.

This module parses and writes indexes from and to bytes only: :func:`parse_index` is given the
JSON and a :data:`TableOpener` that reads the table's byte ranges, so the same code serves a
local file, a URL or a bucket (:mod:`pipeline.storage.indexes` opens an index by location).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from .errors import IndexFormatError
from .field_spec import FieldSpec, Schema, merge_schema, merge_spec, shape_words, spec_of
from .shard_names import ShardNames
from .shard_table import ShardInfo, ShardTable, read_table

__all__ = ["DatasetIndex", "FieldSpec", "PartInfo", "Schema", "ShardInfo", "ShardTable", "TableFile", "TableReader",
           "merge_schema", "merge_spec", "shape_words", "spec_of"]

FORMAT_NAME = "pipeline-shards"
FORMAT_VERSION = 2
INDEX_NAME = "index.json"


def part_shard_range(total: int, index: int, count: int) -> range:
    """The contiguous block of a build's ``total`` planned shards that part ``index`` of
    ``count`` writes."""
    return range(total * index // count, total * (index + 1) // count)


@dataclass
class PartInfo:
    """Which part of a distributed build a partial index covers, and the plan digest of the
    whole build (see :attr:`DatasetIndex.plan`), the same in every part built with the same
    inputs and options (``None`` in parts of an earlier version)."""

    index: int
    count: int
    total_shards: int
    build_plan: str | None = None


@dataclass(frozen=True)
class TableFile:
    """The binary shard table beside an index: its name (relative to the index), size, sha256."""

    name: str
    bytes: int
    sha256: str


def table_name_for(index_name: str) -> str:
    """``index.json`` -> ``index.bin``; ``index.part-00001-of-00004.json`` -> ``index.part-00001-of-00004.bin``."""
    return index_name.removesuffix(".json") + ".bin"


def plan_name_for(index_name: str) -> str:
    """``index.json`` -> ``.index.plan.json``: the plan a build keeps beside its shards until it
    writes that index (see :mod:`pipeline.write.resume`)."""
    return f".{index_name.removesuffix('.json')}.plan.json"


#: What every :func:`plan_name_for` matches: ``index`` the index's name (without ``.json``),
#: ``part`` set for a part's.
PLAN_NAME = re.compile(r"\.(?P<index>index(?P<part>\.part-\d+-of-\d+)?)\.plan\.json")


#: ``read(start, stop)``: bytes ``[start, stop)`` of a file, wherever it lives.
RangeReader = Callable[[int, int], bytes]


@dataclass(frozen=True)
class TableReader:
    """How to read the shard table an index names: ``read`` its byte ranges, ``where`` names it
    in errors, and ``block_bytes`` of record offsets and checksums are fetched a read (larger
    for remote tables, where each read is a request)."""

    read: RangeReader
    where: str
    block_bytes: int = 1 << 16


#: Opens the shard table an index names (a file beside the index), for :func:`parse_index`.
TableOpener = Callable[[TableFile], TableReader]


@dataclass
class DatasetIndex:
    """A shard set: schema, pack size, and the table of its shards (a list of
    :class:`ShardInfo` is accepted and turned into a table)."""

    fields: Schema
    shards: ShardTable
    pack: int = 1
    part: PartInfo | None = None
    table: TableFile | None = None  # where the table was read from, for ``verify``
    #: what the build knew about the samples that is not in them: ``{"classes": [...]}`` of an
    #: image folder, whose labels are positions in that list (JSON values only)
    metadata: dict[str, Any] = field(default_factory=dict)
    #: a digest of the rows the build planned for each shard (see :func:`sum_digests`), by which
    #: a resume tells a finished build of other rows (another seed, an input file renamed)
    plan: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.shards, ShardTable):
            self.shards = ShardTable.from_infos(self.shards)

    @property
    def samples(self) -> int:
        return int(self.shards.samples.sum())

    @property
    def records(self) -> int:
        return self.shards.total_records

    @property
    def bytes(self) -> int:
        return int(self.shards.nbytes.sum())

    def to_json(self, table: TableFile) -> dict[str, Any]:
        """The ``index.json`` of this index, whose shard table was saved as ``table``."""
        data: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "samples": self.samples,
            "records": self.records,
            "bytes": self.bytes,
            "pack": self.pack,
            "fields": {name: spec.to_json() for name, spec in self.fields.items()},
            "shards": {"count": len(self.shards), "names": self.shards.names.to_json(),
                       "table": table.name, "table_bytes": table.bytes, "table_sha256": table.sha256},
        }
        if self.part is not None:
            data["part"] = asdict(self.part)
        if self.metadata:
            data["metadata"] = self.metadata
        if self.plan is not None:
            data["plan"] = self.plan
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str, open_table: TableOpener) -> "DatasetIndex":
        if data.get("format") != FORMAT_NAME:
            raise IndexFormatError(f"{where}: not a {FORMAT_NAME} index (format={data.get('format')!r})")
        if data.get("version") != FORMAT_VERSION:
            older = isinstance(data.get("version"), int) and data["version"] < FORMAT_VERSION
            again = reindex_advice(where, ShardNames.of([]))  # (its shard names are not read: unknown)
            remedy = (f"an earlier version of this library wrote it: {again} (where that version's shards are too old "
                      f"to read, as the first ones are, build the set again from its inputs, or read it with the "
                      f"version that wrote it)" if older else
                      "a later version of this library wrote it: read it with that version")
            raise IndexFormatError(f"{where}: index version {data.get('version')!r} is not supported "
                                   f"(this library reads version {FORMAT_VERSION}): {remedy}")
        try:
            fields = {name: FieldSpec.from_json(spec) for name, spec in data["fields"].items()}
            names = _names(data, where)
            shards = data["shards"]
            table = TableFile(str(shards["table"]), int(shards["table_bytes"]), str(shards["table_sha256"]))
            if "/" in table.name or table.name.startswith("."):
                raise IndexFormatError(f"{where}: shard table {table.name!r} must lie beside the index")
            part = PartInfo(**data["part"]) if data.get("part") else None
            pack = int(data.get("pack", 1))
            metadata = dict(data.get("metadata") or {})
            plan = None if data.get("plan") is None else str(data["plan"])
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise IndexFormatError(f"{where}: malformed index: {exc}") from None
        reader = open_table(table)
        index = cls(fields, read_table(reader.read, table.bytes, reader.where, names, reader.block_bytes),
                    pack, part, table, metadata, plan)
        for key, value in (("samples", index.samples), ("records", index.records), ("bytes", index.bytes)):
            if data.get(key) != value:
                raise IndexFormatError(f"{where}: says {data.get(key)} {key}, its shard table holds {value}: "
                                       f"{_other_build(where, index.shards.names)}")
        _check_pack(index, where)
        return index


def reindex_advice(where: str, names: ShardNames) -> str:
    """How to write the index at ``where`` again from its shards, whose records say what it
    should hold (``pipeline index`` reads each shard once, and keeps the build metadata, such as
    an image folder's classes, of an index it writes over only where that one can be read and
    names the same shards: copying the build's own index is the better mend where one is at
    hand). The command is given where it applies: a local ``index.json`` beside its shards."""
    folder, _, name = where.rpartition("/")
    if "://" in where or name != INDEX_NAME or any("/" in run.prefix for run in names.runs):
        return "re-index its shards"
    return reindex(folder or ".")


def index_fix(where: str, names: ShardNames) -> str:
    """What to do about the index at ``where`` when it misdescribes its intact shards (an edited
    one, or one copied from another build)."""
    return f"copy {where.rpartition('/')[2]} again from the build that wrote it, or {reindex_advice(where, names)}"


def reindex(folder: str) -> str:
    """How to write the index of the shards in a local ``folder`` again, from the shards alone
    (shards of any tool, this library's too)."""
    return f"re-index the shards: pipeline index {shlex.quote(folder)} --overwrite"


def _other_build(where: str, names: ShardNames) -> str:
    """What to do about an index file whose totals or pack disagree with its shard table: either
    may be the wrong one (of another build, or edited), and the shards settle it."""
    name = where.rpartition("/")[2]
    return (f"{name} and its shard table are of different builds, or one was edited: copy both again from the "
            f"build that wrote them, or {reindex_advice(where, names)}")


def _check_pack(index: DatasetIndex, where: str) -> None:
    """Every shard holds its samples ``pack`` to a record (the last maybe fewer): read with
    another pack, a record's rows would run past its end in the middle of an epoch."""
    if not 1 <= index.pack < 1 << 31:  # (a record's rows are counted in int32: no writer packs 2**31)
        raise IndexFormatError(f"{where}: pack={index.pack}, not a number of samples a record")
    shards = index.shards
    wrong = np.flatnonzero(shards.records != -(-shards.samples // index.pack))
    if len(wrong):
        i = int(wrong[0])
        records, samples = int(shards.records[i]), int(shards.samples[i])
        guess = f" (pack {-(-samples // records)}?)" if records else ""
        raise IndexFormatError(f"{where}: says pack={index.pack}, but shard {shards.names[i]} holds {records} records "
                               f"for {samples} samples{guess}: {_other_build(where, shards.names)}")


def _names(data: Mapping[str, Any], where: str) -> ShardNames:
    shards = data["shards"]
    return ShardNames.from_json(shards["names"], int(shards["count"]), where)


def parse_index(data: bytes | str, where: str, open_table: TableOpener) -> DatasetIndex:
    """An index from the bytes of its JSON file, its shard table opened by ``open_table``;
    ``where`` names it in errors."""
    return DatasetIndex.from_json(_parse_json(data, where), where, open_table)


def _parse_json(data: bytes | str, where: str) -> dict[str, Any]:
    try:
        parsed = json.loads(data)
    except UnicodeDecodeError as exc:  # a tar, an image...: the codec's words would not say so
        raise IndexFormatError(f"{where}: not an index: binary data (byte {exc.start} is not text), "
                               f"not JSON") from None
    except json.JSONDecodeError as exc:
        raise IndexFormatError(f"{where}: cannot read index: {exc}") from None
    except RecursionError:  # ([[[[... : no index nests more than a few levels
        raise IndexFormatError(f"{where}: not an index: JSON nested too deeply") from None
    if not isinstance(parsed, dict):
        raise IndexFormatError(f"{where}: an index must be a JSON object")
    return parsed


def index_shard_names(data: bytes | str, where: str) -> ShardNames:
    """The shard names an index lists, without opening its table (also of a version 1 index,
    which listed its shards inline, so that a rebuild can delete the shards it replaces)."""
    try:
        parsed = _parse_json(data, where)
        if parsed.get("version") == 1:
            return ShardNames.of(str(shard["url"]) for shard in parsed["shards"])
        return _names(parsed, where)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise IndexFormatError(f"{where}: malformed index: {exc}") from None


def sum_digests(digests: Iterable[str]) -> str:
    """One digest of several (hexadecimal), their sum: that of a build's shards is then that of
    its parts' put together, so that parts merged carry the plan of the whole build."""
    return f"{sum(int(digest, 16) for digest in digests) % (1 << 128):032x}"


def part_index_name(part: int, count: int) -> str:
    """File name of the partial index written by part ``part`` of ``count``."""
    return f"index.part-{part:05d}-of-{count:05d}.json"


#: what every ``part_index_name`` matches: the index of one part of a build split into parts
PART_INDEX_NAME = re.compile(r"^index\.part-\d+-of-(?P<count>\d+)\.json$")


def merge_indexes(parts: Iterable[DatasetIndex]) -> DatasetIndex:
    """Join the partial indexes of one distributed build, checking that none is missing."""
    parts = sorted(parts, key=lambda p: p.part.index if p.part else -1)
    if not parts:
        raise IndexFormatError("no partial indexes to merge")
    if any(p.part is None for p in parts):
        raise IndexFormatError("merge_indexes takes partial indexes only (a complete index has no 'part')")
    count = parts[0].part.count  # type: ignore[union-attr]
    found = [p.part.index for p in parts]  # type: ignore[union-attr]
    if found != list(range(count)) or any(p.part.count != count for p in parts):  # type: ignore[union-attr]
        missing = sorted(set(range(count)) - set(found))
        raise IndexFormatError(f"partial indexes do not cover all {count} parts (missing parts {missing}, found {found})")
    pack, total = parts[0].pack, parts[0].part.total_shards  # type: ignore[union-attr]
    metadata = parts[0].metadata
    schema: Schema | None = None
    for p in parts:
        info = p.part
        assert info is not None
        if info.total_shards != total:
            raise IndexFormatError(f"part {info.index} belongs to a build of {info.total_shards} shards, part 0 "
                                   f"to one of {total}: parts of different builds; build the parts of the one you "
                                   f"do not mean again as the others were, with --overwrite")
        expected = len(part_shard_range(total, info.index, count))
        if len(p.shards) != expected:
            raise IndexFormatError(f"part {info.index} holds {len(p.shards)} shards, its share of the build "
                                   f"is {expected}")
        if p.pack != pack:
            raise IndexFormatError(f"part {info.index} was built with pack={p.pack}, part 0 with pack={pack}")
        if p.metadata != metadata:
            raise IndexFormatError(f"part {info.index} has metadata {p.metadata}, part 0 {metadata}: parts of "
                                   f"different builds")
        if len(p.shards):
            schema = merge_schema(schema, p.fields, f"part {info.index}")
    _refuse_other_plans(parts)
    shards = ShardTable.concat([p.shards for p in parts])
    plans = [p.plan for p in parts]
    plan = None if None in plans else sum_digests(plans)  # type: ignore[arg-type]
    return DatasetIndex(schema or {}, shards, pack, metadata=metadata, plan=plan)


def _refuse_other_plans(parts: list[DatasetIndex]) -> None:
    """Refuse parts whose builds planned other rows: another seed or size of a validation split,
    other shard limits or prefix, other inputs. Their shards add up, and pass every other check,
    while rows come twice and others never."""
    first = parts[0].part
    assert first is not None
    for p in parts[1:]:
        info = p.part
        assert info is not None
        if None not in (info.build_plan, first.build_plan) and info.build_plan != first.build_plan:
            raise IndexFormatError(f"part {info.index} was built from other inputs or with other options than part "
                                   f"{first.index} (another --seed or --validation, --shard-samples, --shard-bytes "
                                   f"or --prefix, or inputs that changed between them; a table's files count by "
                                   f"their sizes and modification times, which a copy keeps with cp -p or rsync -t): "
                                   f"its rows would come twice, others never; build it again as the other parts "
                                   f"were, with --overwrite")
