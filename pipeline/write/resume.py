"""Resuming a killed build: keep the shards it finished, write the others.

A build writes every shard under a temporary name and renames it once complete, and writes the
index last. So after a crash (even SIGKILL) every file under a shard's final name is complete,
and an index, if there is one, names a finished build. The plan is deterministic, so a rerun
knows what each shard file must hold; it keeps a file when a scan of it agrees with the plan
(the planned samples, in records of the planned pack, with the source's fields and types) and
writes it again otherwise.

The scan checks a file's structure, not that its samples are the source's. So a build records
its plan when it starts (:func:`record_plan`: a digest of each shard's rows, of where they lie in
the source and of what names them there, such as their files), and a resume writes again the
finished shards whose rows changed (:func:`drop_changed_shards`): one file removed from a folder
shifts every row after it, and a finished shard of the same size but other rows would otherwise
be kept. Rows known by position only (an array's) are assumed unchanged. (A build started
without ``resume`` first deletes what lies under the names it plans, so the files a resume finds
were written by that build or by its resumed runs, never by an earlier build of other data.)
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

from ..format.errors import FormatError, ShardError
from ..format.index import DatasetIndex, Schema, ShardInfo, plan_name_for, sum_digests
from ..format.scan import scan_shard
from ..storage.destination import Destination, write_atomic
from ..storage.indexes import load_index
from ..storage.opener import map_range
from .output import (
    ANY_SHARD_NAME,
    OutputExistsError,
    in_folder,
    indexed_shards,
    remove_stale_shards,
    remove_temporary_files,
)
from .source import Source


def reference_schema(source: Source, pack: int) -> Schema:
    """The schema of the source's first record: what a kept shard's fields must look like."""
    return source.read(0, min(pack, len(source))).schema() if len(source) else {}


def kept_shard(folder: Path, name: str, samples: int, pack: int, expected: Schema) -> tuple[ShardInfo, Schema] | None:
    """The index entry and schema of the finished shard ``folder/name`` if it holds what the
    plan puts there (``samples`` samples in records of ``pack``, fields conforming to
    ``expected``); ``None`` when it is missing, unreadable or different, to be written again.

    Every record's rows are compared, not just how many records there are: 100 samples make 10
    records under a pack of 10 and of 11 alike, and a reader finds sample ``i`` in record
    ``i // pack``, so a shard of the stopped run's pack must not be kept under another (``pack``
    left to ``"auto"`` follows the source's size, which may have grown since)."""
    path = folder / name
    try:
        data = map_range(str(path), 0, os.path.getsize(path))
    except OSError:  # missing, or not readable: write it
        return None
    try:
        info, schema, rows = scan_shard(data, name)
    except ShardError:
        return None
    if rows != planned_rows(samples, pack) or not conforms(schema, expected):
        return None
    return info, schema


def planned_rows(samples: int, pack: int) -> list[int | None]:
    """The rows of each record of a shard of ``samples`` written in records of ``pack``, as
    :func:`~pipeline.format.scan.scan_shard` gives them (``None``: a sample unpacked, as a pack
    of 1 stores each; any other pack packs even a last record of one row)."""
    if pack == 1:
        return [None] * samples
    full, rest = divmod(samples, pack)
    return [pack] * full + ([rest] if rest else [])


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


class FinishedOtherRows(OutputExistsError):
    """A resume found the index of a finished build of other rows than it plans: its input, or
    the seed or size of its split, changed since (a split build stopped in its other split
    writes such a finished split again)."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where


def finished_index(target: Destination, index_name: str, planned: list[tuple[str, int]],
                   pack: int, metadata: dict, plan: dict[str, str]) -> DatasetIndex | None:
    """The index of a build that already completed this plan (``(shard name, samples)`` per
    shard, the source's ``metadata``, and the digests of the shards' rows), ``None`` when there
    is no index. An index of another plan is not replaced: one whose class list differs would
    number labels by another list (:class:`FinishedOtherRows` where the index keeps a plan)."""
    if not target.exists(index_name):
        return None
    url = target.url(index_name)
    try:
        index = load_index(url)
    except FormatError as exc:
        raise OutputExistsError(f"{url} cannot be read ({exc}); pass overwrite=True (--overwrite) "
                                f"to replace it") from None

    def refusal(message: str) -> OutputExistsError:  # (an index of an older version keeps no plan)
        return OutputExistsError(message) if index.plan is None else FinishedOtherRows(message, url)
    if index.pack != pack or [(s.url, s.samples) for s in index.shards] != planned:
        raise refusal(f"{url} is the index of a finished build with other shards than this one plans; pass "
                      f"overwrite=True (--overwrite) to replace it")
    if index.metadata != metadata:
        raise refusal(f"{url} is the index of a finished build whose source has changed since: it holds "
                      f"{index.metadata}, this build {metadata} (labels numbered by another list?); pass "
                      f"overwrite=True (--overwrite) to build it again")
    if index.plan is not None and index.plan != plan_digest(plan):
        raise refusal(f"{url} is the index of a finished build of other rows than this one plans (its input, or the "
                      f"seed or size of its split, changed since); pass overwrite=True (--overwrite) to build it "
                      f"again")
    return index


def shard_plan(source: Source, bounds: list[int], numbers: range, names: list[str]) -> dict[str, str]:
    """For each shard a build plans, a digest of its rows: where they lie in the source, and
    what names them there (see :meth:`~pipeline.write.source.Source.identity`)."""
    plan = {}
    for name, number in zip(names, numbers):
        start, stop = bounds[number], bounds[number + 1]
        digest = hashlib.sha256(f"{start}:{stop}".encode())
        source.identity(digest, start, stop)
        plan[name] = digest.hexdigest()[:32]
    return plan


def plan_digest(plan: dict[str, str]) -> str:
    """One digest of a whole plan, saved in the index (:attr:`DatasetIndex.plan`), so that a
    resume that finds a finished build can tell whether it holds the rows this one plans."""
    return sum_digests(hashlib.sha256(f"{name}:{rows}".encode()).hexdigest()[:32] for name, rows in plan.items())


def _plan_path(target: Destination, index_name: str) -> Path:
    return target.staging / plan_name_for(index_name)


def record_plan(target: Destination, index_name: str, plan: dict[str, str]) -> None:
    """Keep the plan of a build that starts, beside where its index will be, until that index is
    written (:func:`forget_plan`). A shard name the plan lacks is no shard of this build: a build
    that replaces another records a plan of none of its shards before it deletes anything, so that
    a resume after a kill part way through writes them all again. A name whose digest is empty is
    a file the build deletes once its index is written (see :func:`leftover_files`)."""
    write_atomic(_plan_path(target, index_name), lambda out: out.write(json.dumps(plan).encode()))


def forget_plan(target: Destination, index_name: str) -> None:
    """Delete the plan, and what a run killed while writing it left (its temporary file). Where
    there is none, nothing is asked of the file system (a finished set's folder may be read-only)."""
    path = _plan_path(target, index_name)
    if path.exists():
        path.unlink(missing_ok=True)
    for left in path.parent.glob(f".{glob.escape(path.name)}.tmp-*"):
        left.unlink(missing_ok=True)


def stopped_plan(target: Destination, index_name: str) -> dict[str, str] | None:
    """The plan a stopped build left beside where its index would be; ``None`` where there is
    none (or one that cannot be read)."""
    try:
        plan = json.loads(_plan_path(target, index_name).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return plan if isinstance(plan, dict) else None


def leftover_files(target: Destination, index_name: str, overwrite: bool, ours: Iterable[str]) -> dict[str, str]:
    """The files a resumed or overwriting build deletes once its index is written, though it
    writes no shard under their names (``ours``): those the plan of a stopped build names (its
    shards, whatever their prefix, and those of a set it was replacing), and with ``overwrite`` the
    shards the index there names. Given as a plan gives them (an empty digest: no shard of this
    build), for the build to keep them in its own plan from before it deletes anything until
    they are gone, so that a kill on the way leaves them named for the next run. A file that no
    plan or index names is never one of them."""
    planned = [name for name in stopped_plan(target, index_name) or {} if ANY_SHARD_NAME.fullmatch(name)]
    named = [*planned, *(indexed_shards(target, index_name) if overwrite else ())]
    keep = set(ours)
    return {name: "" for name in named if name not in keep and in_folder(name)}


def drop_changed_shards(target: Destination, index_name: str, plan: dict[str, str]) -> str | None:
    """Delete the finished shards a stopped build planned other rows for than ``plan`` does (its
    source changed since: a file removed shifts every row after it; or it was replacing another
    build, and recorded no rows yet), so that they are written again, not kept; say which, or
    ``None`` when none. (A stopped build of an older version kept no plan: its shards are kept
    as before, by their structure alone.)"""
    stopped = stopped_plan(target, index_name)
    if stopped is None:
        return None
    changed = [name for name, rows in plan.items() if stopped.get(name) != rows and (target.staging / name).exists()]
    for name in changed:
        (target.staging / name).unlink()
    if not changed:
        return None
    if not any(stopped.get(name) for name in changed):
        return (f"writing again {len(changed)} shards ({changed[0]}, ...) of the build that the stopped run was "
                f"replacing")
    return (f"writing again {len(changed)} finished shards whose rows changed since the stopped run "
            f"({changed[0]}, ...): its source changed")


def remove_leftovers(target: Destination, names: list[str], every_name: list[str], index_name: str,
                     leftovers: dict[str, str]) -> list[str]:
    """Once the index is written: delete the ``leftovers`` (see :func:`leftover_files`; none of
    the build's shards, ``every_name``, all parts' included) and the temporary files a killed run
    left for them and for this build's shards (``names``), then the plan, which named them until now;
    return the leftovers that were there."""
    deleted = remove_stale_shards(target, list(leftovers), every_name)
    remove_temporary_files(target, [*names, *leftovers], index_name)
    forget_plan(target, index_name)
    return deleted
