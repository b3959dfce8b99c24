"""What to pass instead of a location that holds no shard set: the way to index a folder of
shards without an index, or the sets a folder holds (the splits of a build), found locally by
listing and remotely by asking for each split name."""

from __future__ import annotations

import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from ..format.index import INDEX_NAME, PART_INDEX_NAME, PLAN_NAME
from .errors import SourceError, redact
from .folder_lock import folder_held
from .opener import join, parent, read_range
from .retry import RetryPolicy

#: The names of shards, as a location that is no index or folder ends (gzip-compressed ones stream too).
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
#: Names of the shard sets a build writes for its splits, and those of other tools: a folder beside
#: a mistyped path that holds sets of these names is one of splits, whose names are worth offering.
SPLIT_NAMES = frozenset({"train", "training", "val", "valid", "validation", "dev", "test", "testing", "eval",
                          "evaluation", "holdout"})


def shard_sets_in(folder: str) -> list[str]:
    """The subfolders of a local folder that hold an index: the splits a build wrote there."""
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
    except OSError:
        return []
    return [name for name in names if os.path.isfile(os.path.join(folder, name, INDEX_NAME))]


def location_hint(path: str, patterns: bool = False) -> str:
    """What to pass instead of a local ``path`` that holds no shard set, or ``""``:

    - for a folder of shards without an index, the way to index them in place, and (where the
      caller takes them: ``patterns``) a brace pattern of their paths;
    - for a folder of shard sets (the splits of a build, ``OUT/train``, ``OUT/validation``),
      those sets;
    - for a path that does not exist, the sets beside it when they are splits (a split's name
      misspelt), not any sets that happen to lie there."""
    given_folder = os.path.isdir(path)
    if given_folder:
        stopped = stopped_build(path)
        if stopped:  # (its shards are part of a set: neither a set to index, nor to pass by their paths)
            return f"; {stopped}"
        entries = [entry.name for entry in os.scandir(path)]
        shards = sum(1 for name in entries if name.endswith(SHARD_SUFFIXES))
        parts = sorted(name for name in entries if PART_INDEX_NAME.match(name))
        if parts:  # (indexing its shards in place would make a set of the parts there, maybe not all)
            return (f"; {path} holds the partial indexes of a build in parts ({parts[0]}, ...): join them with "
                    f"'pipeline merge-index {shlex.quote(path)}', which checks that every part is there")
        if shards and any(name.endswith(".tar") for name in entries):
            paths = f", or pass their paths (a pattern: {path}/name-{{000000..000009}}.tar)" if patterns else ""
            return (f"; {path} holds {shards} shard(s) without an index: index them in place with 'pipeline "
                    f"index {shlex.quote(path)}'{paths}")
        if shards:  # (compressed only: an index needs plain tars)
            suffix = next(s for s in SHARD_SUFFIXES if any(name.endswith(s) for name in entries))
            paths = f"they stream as they are, by their paths (a pattern: {path}/name-{{000000..000009}}{suffix}); " \
                if patterns else ""
            return (f"; {path} holds {shards} compressed shard(s) without an index: {paths}an index needs plain "
                    f"tars (decompress them, then 'pipeline index {shlex.quote(path)}')")
        folder = path
    else:
        folder = os.path.dirname(os.path.normpath(path)) or "."
    names = shard_sets_in(folder)
    splits = not SPLIT_NAMES.isdisjoint(names)
    if not names or not (given_folder or splits):
        return ""
    return _sets_hint(folder, names, splits, os.path.join)


def stopped_build(folder: str) -> str:
    """For a local folder that holds a build's plan without the index it plans, what that build is
    and what finishes it: one that stopped part way (killed, or at an input error), or one
    writing the folder now (which holds its lock); ``""`` for any other folder. Indexing its
    shards as they are makes a set of those it finished, and the build's resume then refuses it."""
    whole = os.path.exists(os.path.join(folder, "index.json"))  # (a part's plan beside it: of a build it replaced)
    try:
        plans = sorted(name for name in os.listdir(folder) if (match := PLAN_NAME.fullmatch(name))
                       and not os.path.exists(os.path.join(folder, f"{match['index']}.json"))
                       and not (whole and match["part"]))
    except OSError:
        return ""
    if not plans:
        return ""
    if folder_held(Path(folder)):
        return (f"{folder} is being written by a build now (its plan, {plans[0]}, is there; its index is written "
                f"last): wait for the build to end")
    unless = " (unless a build is writing it now, on another machine or one whose lock this system cannot see)"
    return (f"a build of this library stopped part way in {folder}{unless}: it left its plan, {plans[0]}, and no "
            f"index; run the same build command with --resume to finish it, or with --overwrite to build it again. "
            f"To index the shards it finished as they are (a part of the set), delete "
            f"{shlex.quote(os.path.join(folder, plans[0]))} first, then 'pipeline index {shlex.quote(folder)}'")


def _sets_hint(folder: str, names: list[str], splits: bool, join_name: Callable[[str, str], str]) -> str:
    return (f"; {folder} holds the shard sets {', '.join(map(repr, names))}{' (one per split)' if splits else ''}: "
            f"pass one of them, e.g. {join_name(folder, names[0])}")


def remote_sets_hint(url: str, policy: RetryPolicy | None = None) -> str:
    """For a remote index file ``url`` that is not there, the splits of a build beside it, as
    :func:`location_hint` finds them in a local folder: those in its folder (the build's output
    given, ``s3://bucket/out``), else those beside that folder (a split's name misspelt). A
    store cannot be listed over HTTP, so each split name is asked for (once, all at a time);
    ``""`` when none is there."""
    if urlsplit(url).query:  # a signed URL: nothing beside it can be named
        return ""
    once = replace(policy or RetryPolicy.from_env(), attempts=1)
    folder = parent(url)
    above = [parent(folder)] if urlsplit(folder).path.strip("/") else []  # (a bucket or a host has nothing above)
    for place in (folder, *above):
        names = _remote_sets_in(place, once)
        if names:
            return _sets_hint(redact(place), names, True, join)
    return ""


def remote_splits(folder: str) -> list[str]:
    """The splits of a build (``train``, ``validation``...) in the remote ``folder`` that hold
    an index, each asked for once: ``[]`` when the folder holds none."""
    return _remote_sets_in(folder, replace(RetryPolicy.from_env(), attempts=1))


def _remote_sets_in(folder: str, policy: RetryPolicy) -> list[str]:
    """Those of the split names whose ``index.json`` can be read in the remote ``folder``."""
    def there(name: str) -> bool:
        try:
            read_range(join(join(folder, name), INDEX_NAME), 0, 1, policy)
            return True
        except SourceError:
            return False
    names = sorted(SPLIT_NAMES)
    with ThreadPoolExecutor(len(names)) as pool:
        return [name for name, found in zip(names, pool.map(there, names)) if found]
