"""Where a build puts its shards and index: a local folder, or an ``s3://bucket/prefix``.

Shards are always written to a local *staging* folder first (atomically, see
:class:`pipeline.write.shard_file.ShardFile`) and then *published*: for a local folder that is
already done; for S3 the finished shard is uploaded (multipart when large, retried) and its
local copy removed. The index is written last, so it never names a shard that is not there.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, TypeVar

from . import s3
from .folder_lock import take_folder_lock
from .opener import local_path, scheme
from .per_process import process_alive
from .retry import RetryPolicy

T = TypeVar("T")


def write_error(exc: OSError, path: Path) -> OSError:
    """``exc``, a write's error, naming the file it was writing (a full disk's names none) and,
    for a full disk, what to do."""
    if exc.filename is not None or exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
        return exc  # (a read's error, a SourceError, is the input's)
    advice = ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # (a remote build's shards wait in a staging folder)
        staged = path.parent.name.startswith("pipeline-staging-")
        advice = (": free space there, or set PIPELINE_STAGING_DIR to a folder with room (shards wait there for "
                  "their upload)" if staged else ": free space there, or write elsewhere")
    return OSError(exc.errno, f"{exc.strerror}, writing {path}{advice}")


def write_atomic(path: Path, fill: Callable[[BinaryIO], T]) -> T:
    """Write a file through a temporary name, fsync and rename, so that readers see the old
    file or the whole new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as out:
            result = fill(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise write_error(exc, path) from None
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return result


def json_bytes(data: object) -> bytes:
    """Compact JSON, one line."""
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


class Destination:
    """A local folder: shards are written in place."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.staging = self.folder

    def __str__(self) -> str:
        return str(self.folder)

    def prepare(self) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # a file where the folder, or one above it, goes
            link = next((p for p in (self.folder, *self.folder.parents) if p.is_symlink() and not p.exists()), None)
            if link is not None:
                raise FileExistsError(f"{link} is a link to {os.readlink(link)}, which does not exist: make that "
                                      f"folder, or give another output folder") from None
            file = next((p for p in (self.folder, *self.folder.parents) if p.is_file()), self.folder)
            raise FileExistsError(f"{file} is a file, not a folder: give an output folder that is not, nor is "
                                  f"inside, a file") from None

    def url(self, name: str) -> str:
        return str(self.folder / name)

    def exists(self, name: str) -> bool:
        return (self.folder / name).exists()

    def read(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()

    def write_file(self, name: str, fill: Callable[[BinaryIO], T]) -> T:
        """Write the file ``name`` atomically with ``fill(file)``; return what ``fill`` returns."""
        return write_atomic(self.folder / name, fill)

    def write_json(self, name: str, data: object) -> None:
        self.write_file(name, lambda out: out.write(json_bytes(data)))

    def publish(self, name: str) -> None:
        """Make the finished shard ``staging/name`` part of the destination."""

    def delete(self, name: str) -> bool:
        """Delete the file ``name``; return whether it was there (for what a build says it deleted)."""
        try:
            (self.folder / name).unlink()
        except FileNotFoundError:
            return False
        return True

    def list(self, prefix: str) -> list[str]:
        """Names in the destination that start with ``prefix``."""
        if not self.folder.is_dir():
            return []
        return sorted(name for name in os.listdir(self.folder) if name.startswith(prefix))

    def subfolders(self) -> list[str]:
        """Names of the folders in the destination (none in a bucket: S3 has no folders to list
        cheaply, only keys)."""
        if not self.folder.is_dir():
            return []
        return sorted(entry.name for entry in os.scandir(self.folder) if entry.is_dir())

    def hold(self, shared: bool = False) -> bool:
        """Lock the folder against other builds until :meth:`close` (``shared``: against whole
        builds only, for the parts of one build, which write beside each other); ``False`` when
        another build holds it (see :mod:`.folder_lock`)."""
        self.prepare()
        lock = take_folder_lock(self.folder, shared)
        if lock is None:
            return False
        self._folder_lock = lock
        return True

    def close(self) -> None:
        """Release what the destination holds (its folder's lock; the staging folder of a remote
        one)."""
        lock, self._folder_lock = getattr(self, "_folder_lock", None), None
        if lock is not None:
            lock.release()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_folder_lock": None}  # (workers write under the lock of the build that sent them)


_HELD = ".held"  # in a staging folder: locked by the build that made it for as long as it runs


def _new_staging(parent: Path) -> tuple[Path, BinaryIO]:
    """A fresh staging folder in ``parent``, and the open lock file that says it is in use.

    Folders a killed build of this machine left (no ``finally`` of it ran: half-written shards
    would fill the disk, kill after kill) are deleted first: those named after this machine
    (exactly: ``node`` is not ``node-7``) whose process is gone and whose lock nobody holds (a
    process in another PID namespace, a container sharing the folder, looks gone but holds
    it). A folder is locked before it takes its name, so none is seen unlocked while alive."""
    host = socket.gethostname()
    named = re.compile(rf"pipeline-staging-{re.escape(host)}-(\d+)-[A-Za-z0-9_]+")
    for folder in parent.glob("pipeline-staging-*"):
        match = named.fullmatch(folder.name)
        if match is None or process_alive(int(match[1])):
            continue
        with open(folder / _HELD, "a+b") as held:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(folder, ignore_errors=True)
    making = Path(tempfile.mkdtemp(prefix=".pipeline-staging-new-", dir=parent))
    held = open(making / _HELD, "a+b")
    fcntl.flock(held, fcntl.LOCK_EX)
    folder = parent / f"pipeline-staging-{host}-{os.getpid()}-{making.name.rsplit('-', 1)[-1]}"
    os.rename(making, folder)
    return folder, held


class S3Destination(Destination):
    """An S3 prefix: shards are staged in a local temporary folder, then uploaded."""

    def __init__(self, url: str, policy: RetryPolicy | None = None) -> None:
        self.prefix = url.rstrip("/")
        s3.split_url(self.prefix + "/")  # validates the bucket part
        self.policy = policy or RetryPolicy.from_env()
        self._staging: Path | None = None
        self._held: BinaryIO | None = None  # the staging folder's lock, held while this build runs

    @property
    def staging(self) -> Path:  # type: ignore[override]
        """The local folder shards are written to before upload: made on first use (a merge or
        a read needs none), and again on a machine where it does not exist (a cluster worker)."""
        if self._staging is None:
            self._staging, self._held = _new_staging(Path(os.environ.get("PIPELINE_STAGING_DIR")
                                                          or tempfile.gettempdir()))
        self._staging.mkdir(parents=True, exist_ok=True)
        return self._staging

    def __str__(self) -> str:
        return self.prefix

    def prepare(self) -> None:
        """Make the staging folder now, so that a build's tasks are given its path."""
        self.staging.mkdir(parents=True, exist_ok=True)

    def url(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def exists(self, name: str) -> bool:
        return s3.exists(self.url(name), self.policy)

    def read(self, name: str) -> bytes:
        from .opener import read_bytes

        return read_bytes(self.url(name), self.policy)

    def write_file(self, name: str, fill: Callable[[BinaryIO], T]) -> T:
        path = self.staging / name
        result = write_atomic(path, fill)
        self.publish(name)
        return result

    def write_json(self, name: str, data: object) -> None:
        s3.put_bytes(self.url(name), json_bytes(data), self.policy)

    def publish(self, name: str) -> None:
        path = self.staging / name
        s3.upload_file(str(path), self.url(name), self.policy)
        path.unlink()

    def delete(self, name: str) -> bool:
        s3.delete(self.url(name), self.policy)
        return True  # (S3 does not say whether the key was there)

    def list(self, prefix: str) -> list[str]:
        return s3.list_names(self.prefix + "/", prefix, self.policy)

    def subfolders(self) -> list[str]:
        return []

    def hold(self, shared: bool = False) -> bool:
        return True  # (S3 has no lock to take: two builds of one prefix are the user's to avoid)

    def close(self) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
        if self._held is not None:
            self._held.close()
            self._held = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_held": None}  # workers upload their own shards; the lock stays here


def destination(location: str | os.PathLike[str]) -> Destination:
    """The destination a build writes to: a local folder, or ``s3://bucket/prefix``."""
    text = os.fspath(location)
    kind = scheme(text)
    if kind == "file":
        return Destination(local_path(text))  # a file:// URL names a local folder
    if kind == "s3":
        return S3Destination(text)
    raise ValueError(f"{text}: builds write to local folders or s3:// prefixes, not {kind}://")
