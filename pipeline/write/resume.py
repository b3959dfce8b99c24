"""Resuming a killed build: keep the shards it finished, write the others.

A build writes every shard under a temporary name and renames it once complete, and writes the
index last. So after a crash (even SIGKILL) every file under a shard's final name is complete,
and an index, if there is one, names a finished build. The plan is deterministic, so a rerun
knows what each shard file must hold; it keeps a file when a scan of it agrees with the plan
(the planned samples, in records of the planned pack, with the source's fields and types) and
writes it again otherwise.

The scan checks a file's structure, not that its samples are the source's: resuming assumes
the source and the options are those of the killed run. (A build started without ``resume``
first deletes what lies under the names it plans, so the files a resume finds were written by
that build or by its resumed runs, never by an earlier build of other data.)
"""

from __future__ import annotations

import os
from pathlib import Path

from ..format.errors import FormatError, ShardError
from ..format.index import DatasetIndex, Schema, ShardInfo
from ..format.scan import scan_shard
from ..storage.destination import Destination
from ..storage.indexes import load_index
from ..storage.opener import map_range
from .output import OutputExistsError
from .source import Source


def reference_schema(source: Source, pack: int) -> Schema:
    """The schema of the source's first record: what a kept shard's fields must look like."""
    return source.read(0, min(pack, len(source))).schema() if len(source) else {}


def kept_shard(folder: Path, name: str, samples: int, pack: int, expected: Schema) -> tuple[ShardInfo, Schema] | None:
    """The index entry and schema of the finished shard ``folder/name`` if it holds what the
    plan puts there (``samples`` samples in records of ``pack``, fields conforming to
    ``expected``); ``None`` when it is missing, unreadable or different, to be written again."""
    path = folder / name
    try:
        data = map_range(str(path), 0, os.path.getsize(path))
    except OSError:  # missing, or not readable: write it
        return None
    try:
        info, schema = scan_shard(data, name)
    except ShardError:
        return None
    if info.samples != samples or info.records != -(-samples // pack) or not conforms(schema, expected):
        return None
    return info, schema


def conforms(found: Schema, expected: Schema) -> bool:
    """Whether a shard's fields are those a build of the source writes: the same names and
    types, arrays of the same dtype and rank (their dimensions may vary from sample to sample).

    The expected schema describes the source's values; a packed record stores a column of
    Python numbers as an array, so such a shard does not conform and is written again (its
    index entry must describe the source as a fresh build would)."""
    if set(found) != set(expected):
        return False
    for name, spec in expected.items():
        other = found[name]
        if spec.dtype != other.dtype or (spec.shape is None) != (other.shape is None):
            return False
        if spec.shape is not None and len(spec.shape) != len(other.shape):  # type: ignore[arg-type]
            return False
    return True


def finished_index(target: Destination, index_name: str, planned: list[tuple[str, int]],
                   pack: int) -> DatasetIndex | None:
    """The index of a build that already completed this plan (``(shard name, samples)`` per
    shard), ``None`` when there is no index. An index of another plan is not replaced."""
    if not target.exists(index_name):
        return None
    url = target.url(index_name)
    try:
        index = load_index(url)
    except FormatError as exc:
        raise OutputExistsError(f"{url} cannot be read ({exc}); pass overwrite=True (--overwrite) "
                                f"to replace it") from None
    if index.pack != pack or [(s.url, s.samples) for s in index.shards] != planned:
        raise OutputExistsError(f"{url} is the index of a finished build with other shards than this one "
                                f"plans; pass overwrite=True (--overwrite) to replace it")
    return index
