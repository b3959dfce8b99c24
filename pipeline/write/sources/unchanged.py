"""An input file that changes while a build reads it stops the build, naming it.

A source opens its files anew where each task runs (a worker process, a cluster's machine), a
chunk, a row group or a batch file at a time: one replaced part way (a job that writes features
anew, a ``mv`` over it) or written to would give shards of rows of both versions, under a plan
made from the first, and a build that says it succeeded. Each file's size and modification time
when the source was made are its version; a read that finds another refuses. (Not its inode:
machines of a cluster that see a shared file system through FUSE may each number it otherwise.)
"""

from __future__ import annotations

import os
from pathlib import Path

from ...format.errors import InputChanged

Version = tuple[int, int]


def version_of(stat: os.stat_result) -> Version:
    return stat.st_size, stat.st_mtime_ns


def file_version(path: str | os.PathLike[str]) -> Version:
    return version_of(os.stat(path))


def check_unchanged(path: str | os.PathLike[str] | Path, version: Version | None, now: Version | None = None) -> None:
    """Raise :class:`InputChanged` where ``path`` (whose version is ``now``, else read here) is no
    longer at ``version`` (``None``: not known, nothing checked)."""
    if version is not None and (now or file_version(path)) != version:
        raise InputChanged(f"{path}: changed while the build read it (replaced, or written to): rows of two versions "
                           f"of it would be mixed; once it stays as it is, build again with overwrite=True "
                           f"(--overwrite), not resume: the shards finished hold the old rows")
