"""An input file that changes while a build reads it stops the build, naming it.

A source opens its files anew where each task runs (a worker process, a cluster's machine), a
chunk, a row group or a batch file at a time: one replaced part way (a job that writes features
anew, a ``mv`` over it) or written to would give shards of rows of both versions, under a plan
made from the first, and a build that says it succeeded. Each file's size, modification time and
inode when the source was made are its version, taken on this machine: a read on the same machine
that finds another refuses. A read on another machine (a Dask cluster's, the files on a shared file
system) compares the size and the modification time in whole seconds only: such a machine may
number the file otherwise, and see its time more coarsely (through sshfs, say).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import NamedTuple

from ...format.errors import InputChanged


class Version(NamedTuple):
    size: int
    mtime_ns: int
    inode: int
    host: str

    def matches(self, other: "Version") -> bool:
        if self.host == other.host:
            return self[:3] == other[:3]
        return self.size == other.size and self.mtime_ns // 10**9 == other.mtime_ns // 10**9


def version_of(stat: os.stat_result) -> Version:
    return Version(stat.st_size, stat.st_mtime_ns, stat.st_ino, socket.gethostname())


def file_version(path: str | os.PathLike[str]) -> Version:
    return version_of(os.stat(path))


def check_unchanged(path: str | os.PathLike[str] | Path, version: Version | None, now: Version | None = None) -> None:
    """Raise :class:`InputChanged` where ``path`` (whose version is ``now``, else read here) is no
    longer at ``version`` (``None``: not known, nothing checked)."""
    if version is not None and not version.matches(now or file_version(path)):
        raise InputChanged(f"{path}: changed while the build read it (replaced, or written to): rows of two versions "
                           f"of it would be mixed; once it stays as it is, build again (in Python, from a source made "
                           f"anew) with overwrite=True (--overwrite), not resume: the shards finished hold the old rows")
