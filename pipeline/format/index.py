"""``index.json``: what a shard set holds and where every record starts.

One index per shard set, beside its shards, written last by every build so that an index
never names a shard that is incomplete. It carries the format version, the field schema
(name, dtype, per-sample shape), the pack size, and per shard: its URL relative to the
index, samples, records, bytes, sha256 and the byte offset of every record, which lets a
reader start at any record with a seek or a ranged request.

A *partial* index (``index.part-00001-of-00004.json``) is what one part of a distributed
build writes; ``merge_indexes`` joins the parts into the final index.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from .errors import IndexFormatError

FORMAT_NAME = "pipeline-shards"
FORMAT_VERSION = 1
INDEX_NAME = "index.json"


@dataclass(frozen=True)
class FieldSpec:
    """Type of one field: ``dtype`` (a NumPy dtype name, ``bfloat16``, or a Python type name
    such as ``int``/``str``/``bytes``) and per-sample ``shape`` (``None`` entries vary,
    ``None`` altogether for non-array fields)."""

    dtype: str
    shape: tuple[int | None, ...] | None

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": None if self.shape is None else list(self.shape)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "FieldSpec":
        shape = data.get("shape")
        return cls(str(data["dtype"]), None if shape is None else tuple(shape))


Schema = dict[str, FieldSpec]


def spec_of(value: Any, packed: bool = False) -> FieldSpec:
    """The FieldSpec of one value (of a packed column when ``packed``: drop its first axis)."""
    if type(value).__module__ == "torch":
        dtype = str(value.dtype).removeprefix("torch.")
        shape = tuple(value.shape)
    elif isinstance(value, (np.ndarray, np.generic)):
        dtype, shape = np.dtype(value.dtype).name, tuple(np.shape(value))
    else:
        if packed and isinstance(value, list) and value:
            value = value[0]
        return FieldSpec(type(value).__name__, None)
    return FieldSpec(dtype, shape[1:] if packed else shape)


def merge_spec(name: str, old: FieldSpec, new: FieldSpec, where: str) -> FieldSpec:
    """Combine two specs of one field: dims that differ become ``None``; a dtype change of an
    array field is an error (the reader could not collate it)."""
    if old == new:
        return old
    if old.shape is None or new.shape is None:
        if old.shape is None and new.shape is None:
            return old if old.dtype == new.dtype else FieldSpec("any", None)
        raise IndexFormatError(f"{where}: field {name!r} is an array in some samples and not in others")
    if old.dtype != new.dtype:
        raise IndexFormatError(f"{where}: field {name!r} has dtype {new.dtype}, earlier samples {old.dtype}")
    if len(old.shape) != len(new.shape):
        raise IndexFormatError(
            f"{where}: field {name!r} has shape {list(new.shape)}, earlier samples {list(old.shape)}"
        )
    shape = tuple(a if a == b else None for a, b in zip(old.shape, new.shape))
    return FieldSpec(old.dtype, shape)


def merge_schema(old: Schema | None, new: Schema, where: str) -> Schema:
    """Combine two schemas of the same shard set; fields must be the same."""
    if old is None:
        return dict(new)
    if set(old) != set(new):
        missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
        raise IndexFormatError(f"{where}: fields differ from earlier samples (missing {missing}, extra {extra})")
    return {name: merge_spec(name, old[name], new[name], where) for name in old}


@dataclass
class ShardInfo:
    """One shard as the index describes it."""

    url: str
    samples: int
    records: int
    bytes: int
    sha256: str
    offsets: list[int] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ShardInfo":
        try:
            info = cls(str(data["url"]), int(data["samples"]), int(data["records"]),
                       int(data["bytes"]), str(data["sha256"]), [int(o) for o in data["offsets"]])
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexFormatError(f"malformed shard entry {dict(data)!r}: {exc}") from None
        if len(info.offsets) != info.records:
            raise IndexFormatError(f"shard {info.url}: {len(info.offsets)} offsets for {info.records} records")
        return info


@dataclass
class PartInfo:
    """Which part of a distributed build a partial index covers."""

    index: int
    count: int
    total_shards: int


@dataclass
class DatasetIndex:
    """The contents of an ``index.json``."""

    fields: Schema
    shards: list[ShardInfo]
    pack: int = 1
    part: PartInfo | None = None

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "samples": self.samples,
            "pack": self.pack,
            "fields": {name: spec.to_json() for name, spec in self.fields.items()},
            "shards": [{"url": s.url, "samples": s.samples, "records": s.records, "bytes": s.bytes,
                        "sha256": s.sha256, "offsets": s.offsets} for s in self.shards],
        }
        if self.part is not None:
            data["part"] = asdict(self.part)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "index") -> "DatasetIndex":
        if data.get("format") != FORMAT_NAME:
            raise IndexFormatError(f"{where}: not a {FORMAT_NAME} index (format={data.get('format')!r})")
        if data.get("version") != FORMAT_VERSION:
            raise IndexFormatError(f"{where}: index version {data.get('version')!r} is not supported "
                                   f"(this library reads version {FORMAT_VERSION})")
        try:
            fields = {name: FieldSpec.from_json(spec) for name, spec in data["fields"].items()}
            shards = [ShardInfo.from_json(s) for s in data["shards"]]
            part = PartInfo(**data["part"]) if data.get("part") else None
            index = cls(fields, shards, int(data.get("pack", 1)), part)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IndexFormatError(f"{where}: malformed index: {exc}") from None
        if "samples" in data and data["samples"] != index.samples:
            raise IndexFormatError(f"{where}: says {data['samples']} samples, its shards hold {index.samples}")
        return index


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` through a temporary file, fsync and rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(data, out, separators=(",", ":"))  # compact: an index may hold millions of offsets
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_index(index: DatasetIndex, path: str | os.PathLike[str]) -> Path:
    """Write ``index`` atomically to ``path`` (a file, or a folder to hold ``index.json``)."""
    path = Path(path)
    if path.is_dir():
        path = path / INDEX_NAME
    write_json_atomic(path, index.to_json())
    return path


def parse_index(data: bytes | str, where: str) -> DatasetIndex:
    """An index from the bytes of its JSON file; ``where`` names it in errors."""
    try:
        parsed = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexFormatError(f"{where}: cannot read index: {exc}") from None
    if not isinstance(parsed, dict):
        raise IndexFormatError(f"{where}: an index must be a JSON object")
    return DatasetIndex.from_json(parsed, where=where)


def load_index(path: str | os.PathLike[str]) -> DatasetIndex:
    """Read a local index file, or the ``index.json`` inside a folder."""
    path = Path(path)
    if path.is_dir():
        path = path / INDEX_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise IndexFormatError(f"{path}: no such index file") from None
    except OSError as exc:
        raise IndexFormatError(f"{path}: cannot read index: {exc}") from None
    return parse_index(data, str(path))


def part_index_name(part: int, count: int) -> str:
    """File name of the partial index written by part ``part`` of ``count``."""
    return f"index.part-{part:05d}-of-{count:05d}.json"


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
    pack = parts[0].pack
    schema: Schema | None = None
    shards: list[ShardInfo] = []
    for p in parts:
        if p.pack != pack:
            raise IndexFormatError(f"part {p.part.index} was built with pack={p.pack}, part 0 with pack={pack}")  # type: ignore[union-attr]
        if p.shards:
            schema = merge_schema(schema, p.fields, f"part {p.part.index}")  # type: ignore[union-attr]
        shards.extend(p.shards)
    total = parts[0].part.total_shards  # type: ignore[union-attr]
    if len(shards) != total:
        raise IndexFormatError(f"parts hold {len(shards)} shards, the build planned {total}")
    return DatasetIndex(schema or {}, shards, pack)
