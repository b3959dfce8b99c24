"""A local disk cache of remote shards, shared safely by every worker and rank on a machine.

- One download per shard at a time: a per-shard lock file (``flock``) serialises fetches, and
  whoever gets the lock second finds the shard already there.
- Nothing half-written is ever read: a shard is downloaded to ``<name>.part-<pid>-<thread>`` and renamed
  into place when complete (and, with ``verify``, when its sha256 matches the index). What a
  killed process left half-written is deleted when the cache is opened or evicts.
- A copy is of one version of a shard: its name holds the sha256 the index gives the shard, so a
  set rebuilt at the same URLs (``--overwrite``) is downloaded again instead of read from the
  old copies, which go once a new version of their shard is downloaded (or by eviction).
- A copy whose size is not the index's (a crash as it was written, despite the sync before the
  rename) is downloaded again.
- Least-recently-used eviction of the cache's own copies (never of other files in its folder)
  down to ``max_bytes``, before a download too, which never deletes a shard being read
  (readers hold a shared lock; eviction only takes shards it can lock exclusively without
  waiting) and never deadlocks: when nothing can go, the cache stays over its limit for a while,
  even when the limit is smaller than one shard. A copy's lock file goes with it, so that a run
  of days over more shards than the cache holds leaves no trail of them.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import SourceError, redact
from .opener import open_stream
from .per_process import process_alive
from .retry import RetryPolicy, RetrySink

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_COPY = re.compile(r"[0-9a-f]{24}-.+")  # the name of a copy (see ShardCache.path_for): the only files evicted
_PARTIAL = re.compile(r"(?P<shard>.+)\.part-(?P<pid>\d+)-\d+")  # a download under way, or abandoned
_NOT_INDEXED = (": the server's copy is not the version the index names (rebuilt or replaced since, or damaged): "
                "copy the set again whole, index and shards, or 'pipeline verify' it")
#: How long a download that failed its size or sha256 check is refused again without a download.
REFUSED_FOR_S = 600
_VERSION_CHARS = 16  # of the index's sha256, in a copy's name: 64 bits tell a shard's versions apart


def _url_prefix(url: str) -> str:
    """The start of the names of every cached version of ``url``."""
    return hashlib.sha256(url.encode()).hexdigest()[:24] + "-"


def _used_whole(copy: Path, size: int | None) -> bool:
    """Whether ``copy`` is there, of ``size`` bytes (the index's, when known); marked recently
    used when it is."""
    try:
        if size is not None and os.stat(copy).st_size != size:
            return False
        os.utime(copy)
    except FileNotFoundError:  # not there, or evicted meanwhile
        return False
    except OSError as exc:  # (utime's error names no file)
        raise _unusable(copy.parent, exc) from None
    return True


def _unusable(folder: Path, exc: OSError) -> OSError:
    """``exc``, met using the cache in ``folder``, as an error of the cache naming the folder and
    what to do (not a failure of a shard, which ``on_error="skip"`` would count lost)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        advice = ("free space there (it needs cache_bytes, and room for the downloads under way on top: a whole "
                  "shard each, up to 8 at once in each process that reads, workers included), or give a smaller "
                  "cache_bytes, fewer num_workers or another cache_dir")
    elif exc.errno == errno.ENOENT:
        advice = "it was removed again and again while in use: leave it to the loader while it runs"
    else:  # read-only, not ours, not a folder, ...
        advice = "give a cache_dir this process can write to"
    where = f"{exc.filename}: " if exc.filename else ""
    return OSError(exc.errno, f"{where}cannot use cache_dir {folder} ({exc.strerror}): {advice}")


def writable_folder(folder: Path) -> Path:
    """``folder``, created if need be, once this process can write there (a cache that cannot
    would otherwise fail at its first read, in a worker, with an error naming no folder)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unusable(folder, exc) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _unusable(folder, OSError(errno.EACCES, "not writable"))
    return folder


def _take_lock(path: Path, mode: int) -> BinaryIO | None:
    """The lock file ``path``, open and locked in ``mode``; ``None`` when ``mode`` has
    ``LOCK_NB`` and someone holds it. A copy's lock file goes with the copy (deleted by whoever
    holds it exclusively, so that they do not pile up in a long run): a lock taken on a file
    deleted meanwhile guards nothing, so it is taken again on the file now at ``path``."""
    while True:
        try:
            handle = open(path, "a+b")
        except FileNotFoundError:  # the cache's folder, removed while in use (a scratch cleaner): made again
            writable_folder(path.parent)
            continue
        except OSError as exc:
            raise _unusable(path.parent, exc) from None
        try:
            fcntl.flock(handle, mode)
            current = os.stat(path).st_ino
        except (BlockingIOError, FileNotFoundError) as exc:
            handle.close()
            if isinstance(exc, BlockingIOError):
                return None
            continue
        except BaseException:
            handle.close()
            raise
        if current == os.fstat(handle.fileno()).st_ino:
            return handle
        handle.close()  # releases the lock on the deleted file


@contextmanager
def _locked(path: Path, mode: int) -> Iterator[None]:
    handle = _take_lock(path, mode)
    assert handle is not None  # a lock taken without LOCK_NB waits for its turn
    with handle:
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _lock_of(copy: Path) -> Path:
    return copy.with_name(copy.name + ".lock")


def _remove_orphan_lock(copy: Path) -> None:
    """Delete the lock file of ``copy`` if nobody holds it and ``copy`` is not there (looked at
    under the lock: a download may have renamed it into place since the folder was listed)."""
    handle = _take_lock(_lock_of(copy), fcntl.LOCK_EX | fcntl.LOCK_NB)
    if handle is not None:
        with handle:
            if not copy.exists():
                _lock_of(copy).unlink(missing_ok=True)


class ShardCache:
    """Cached copies of remote shards in ``folder``, at most ``max_bytes`` of them at rest.
    Downloads retry under ``policy`` and report their retries to ``stats`` (a dataset's, which
    counts the retries of every read made for it, downloads included)."""

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int, verify: bool = False,
                 policy: RetryPolicy | None = None, stats: RetrySink | None = None) -> None:
        self.folder = writable_folder(Path(folder))
        self.max_bytes = max_bytes
        self.verify = verify
        self.policy = policy
        self.stats = stats
        self._paths: dict[tuple[str, str | None], Path] = {}
        self._over_limit = False  # whether this process's last eviction left the cache over max_bytes
        self._dropped: set[tuple[str, str]] = set()  # copies dropped as damaged (each version once)
        self._refused: dict[tuple[str, str], tuple[float, str]] = {}  # downloads not of the indexed version: when, why
        self._other_versions: dict[tuple[str, str | None], Path] = {}  # (without verify) copies read for the version indexed
        for partial in self.folder.glob("*.part-*"):
            if _COPY.fullmatch(partial.name):
                self._remove_abandoned(partial)

    def path_for(self, url: str, sha256: str | None = None) -> Path:
        """Where the version of ``url`` whose content has ``sha256`` (the index's) is cached: a
        hash of the URL (no name from the data can leave the folder), the start of ``sha256``,
        and a readable, sanitised base name of the redacted URL (no password or signature in
        file names). Without ``sha256`` (no index says it), the URL alone."""
        path = self._paths.get((url, sha256))
        if path is None:  # asked for every piece read: worked out once per URL and version
            version = "" if sha256 is None else _SAFE.sub("_", sha256[:_VERSION_CHARS]) + "-"  # hex, from an index
            base = _SAFE.sub("_", redact(url).rsplit("/", 1)[-1].split("?", 1)[0])[:80]
            path = self._paths[url, sha256] = self.folder / f"{_url_prefix(url)}{version}{base}"
        return path

    def _download(self, url: str, path: Path, size: int | None, sha256: str | None) -> Path:
        """Download ``url`` to ``path`` (the copy of the version ``sha256``), or where it is
        stored: without ``verify``, bytes of another version are kept under the name of theirs
        (read all the same, their records failing their checks), never under the version
        indexed, which every later job of that index would read for it."""
        partial = path.with_name(f"{path.name}.part-{os.getpid()}-{threading.get_ident()}")
        digest = hashlib.sha256()
        written = 0
        try:
            with open_stream(url, self.policy, stats=self.stats, size=size) as source:
                with self._writing(partial):
                    out = open(partial, "wb")
                with out:
                    while chunk := source.read(8 << 20):
                        with self._writing(partial):
                            out.write(chunk)
                        digest.update(chunk)
                        written += len(chunk)
                    with self._writing(partial):  # on disk before its rename: a crash leaves no short copy
                        out.flush()
                        os.fsync(out.fileno())
            reason = None
            if size is not None and written != size:
                reason = f"the shard has {written} bytes, the index says {size}"
            elif self.verify and sha256 is not None and digest.hexdigest() != sha256:
                reason = f"sha256 {digest.hexdigest()} differs from the index's {sha256}"
            elif sha256 is not None and digest.hexdigest() != sha256:
                path = self._other_versions[url, sha256] = self.path_for(url, digest.hexdigest())
            if reason is not None:  # the server's copy is not the version indexed
                reason += f"{_NOT_INDEXED}; not downloaded again for {REFUSED_FOR_S // 60} minutes"
                if sha256 is not None:
                    self._refused[url, sha256] = (time.monotonic(), reason)
                raise SourceError(url, None, reason)
            with self._writing(partial):
                os.replace(partial, path)
            return path
        finally:
            partial.unlink(missing_ok=True)

    @contextmanager
    def _writing(self, partial: Path) -> Iterator[None]:
        """Writing to the copy being downloaded: a disk that is full or fails is an error of the
        cache, naming its folder and what to do (not a failure of the shard, which skip would
        count lost)."""
        try:
            yield
        except OSError as exc:
            exc.filename = exc.filename or str(partial)
            raise _unusable(self.folder, exc) from None

    def fetch(self, url: str, size: int | None = None, sha256: str | None = None) -> Path:
        """The local copy of ``url``, downloaded first if needed (once, whoever asks). A copy
        already there costs a ``stat`` (its size) and a ``utime`` (recently used) and nothing
        else: no lock, and no eviction unless the last one left the cache over its limit."""
        path = self._copy_for(url, sha256)
        self._refuse_again(url, sha256)
        if _used_whole(path, size):  # there (complete: copies arrive by rename): the common case
            if self._over_limit:
                self.evict(keep=path)
            return path
        with _locked(_lock_of(path), fcntl.LOCK_EX):
            if not _used_whole(path, size):  # missing, or cut short (a crash as it was written): fetched again
                self.evict(keep=path, room=size or 0)  # room first: a full disk is a cache's to make room on
                path = self._download_again_if_removed(url, path, size, sha256)
                self._remove_other_versions(url, path)
        self.evict(keep=path)
        return path

    def _download_again_if_removed(self, url: str, path: Path, size: int | None, sha256: str | None) -> Path:
        """Download ``url`` to ``path`` (see :meth:`_download`), again in a folder made anew if the
        cache's folder was removed as it downloaded (a scratch cleaner), a few times at most."""
        for _ in range(2):
            try:
                return self._download(url, path, size, sha256)
            except FileNotFoundError:  # (made anew by another process meanwhile, maybe)
                writable_folder(self.folder)
        return self._download(url, path, size, sha256)

    def _copy_for(self, url: str, sha256: str | None) -> Path:
        """The copy this process reads for the version ``sha256`` of ``url``: of that version, or
        the other one its download brought (see :meth:`_download`)."""
        return self._other_versions.get((url, sha256)) or self.path_for(url, sha256)

    def _refuse_again(self, url: str, sha256: str | None) -> None:
        """Raise the error of a download of ``url`` that failed its size or sha256 check lately: every
        piece of the shard read asks for it, and a shard damaged on the server would otherwise be
        downloaded whole again for each (under ``on_error="skip"``, a thousand times an epoch).
        After :data:`REFUSED_FOR_S`, it is downloaded again: the server's copy may be mended."""
        refused = self._refused.get((url, sha256)) if sha256 is not None else None
        if refused is not None:
            if time.monotonic() - refused[0] < REFUSED_FOR_S:
                raise SourceError(url, None, refused[1])  # a new one: a raised error's traceback grows
            del self._refused[url, sha256]

    def _remove_other_versions(self, url: str, keep: Path) -> None:
        """Delete the cached copies of ``url`` other than ``keep`` (just downloaded): older
        versions of the shard, which only an index of the set before a rebuild would read. One
        being read stays (for eviction to take later)."""
        for path in self.folder.glob(_url_prefix(url) + "*"):
            if path != keep and not path.name.endswith(".lock") and ".part-" not in path.name:
                self._remove_unless_held(path, path)

    def _remove_abandoned(self, partial: Path) -> None:
        """Delete ``partial`` if the download writing it is over: its process is gone, and nobody
        holds its shard's lock (a download holds it throughout: this spares one whose process we
        cannot see, in another PID namespace sharing the folder)."""
        match = _PARTIAL.fullmatch(partial.name)
        if match is not None and not process_alive(int(match["pid"])):
            self._remove_unless_held(partial, partial.with_name(match["shard"]))

    @staticmethod
    def _remove_unless_held(path: Path, shard: Path) -> bool:
        """Delete ``path`` if the lock of ``shard`` can be taken now (nobody reads or downloads
        it), and with the shard's copy its lock; whether it went."""
        handle = _take_lock(_lock_of(shard), fcntl.LOCK_EX | fcntl.LOCK_NB)
        if handle is None:
            return False
        with handle:
            path.unlink(missing_ok=True)
            if path == shard:
                _lock_of(shard).unlink(missing_ok=True)
        return True

    def drop_if_other_version(self, url: str, sha256: str | None) -> bool:
        """Delete the copy of ``url`` if its bytes are not the version ``sha256`` (the index's),
        so that the next read downloads it again: a copy damaged on the server, or on the way
        in, would otherwise fail every later read after the server's copy is mended. Called when
        a read of the copy fails its checks; whether the copy went. Each version once a process:
        a shard damaged on the server would otherwise be downloaded again for each damaged record,
        every epoch. Readers hold a copy's lock only while they map it: this waits for them."""
        path = self._copy_for(url, sha256)
        if sha256 is None or (url, sha256) in self._dropped:
            return False  # once a process: a copy damaged on the server comes back as damaged
        self._dropped.add((url, sha256))
        self._other_versions.pop((url, sha256), None)
        try:
            with _locked(_lock_of(path), fcntl.LOCK_EX):
                digest = hashlib.sha256()
                with open(path, "rb") as copy:
                    while chunk := copy.read(8 << 20):
                        digest.update(chunk)
                if digest.hexdigest() == sha256:
                    return False
                path.unlink()
                _lock_of(path).unlink(missing_ok=True)
        except FileNotFoundError:  # dropped by another reader that failed on it too
            return True
        except OSError:  # a cache folder we may not change: the copy stays, the error is the read's
            return False
        return True

    def holds(self, url: str, sha256: str | None = None) -> bool:
        """Whether the copy of ``url`` read for the version ``sha256`` (see :meth:`_copy_for`) is in the
        cache now."""
        return self._copy_for(url, sha256).exists()

    @contextmanager
    def reading(self, url: str, size: int | None = None, sha256: str | None = None) -> Iterator[Path]:
        """The local copy of ``url``, protected from eviction while the block runs."""
        while True:
            path = self.fetch(url, size, sha256)
            with _locked(_lock_of(path), fcntl.LOCK_SH):
                if path.exists():  # not evicted between the fetch and the lock
                    yield path
                    return

    def evict(self, keep: Path | None = None, room: int = 0) -> None:
        """Delete least recently used shards until the cache fits ``max_bytes`` (with ``room``
        bytes to spare, for a download to come), skipping ``keep`` and any shard a reader holds."""
        with _locked(self.folder / ".evict.lock", fcntl.LOCK_EX):
            entries, locks = [], []
            for path in self.folder.iterdir():
                if not _COPY.fullmatch(path.name):
                    continue  # not ours (the user's own files, in a cache_dir shared with them): never deleted
                if path.name.endswith(".lock"):
                    locks.append(path)
                    continue
                if ".part-" in path.name:
                    self._remove_abandoned(path)
                    continue
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                entries.append((stat.st_mtime, stat.st_size, path))
            copies = {path for _, _, path in entries}
            for lock in locks:
                copy = lock.with_name(lock.name.removesuffix(".lock"))
                if copy not in copies and copy != keep:  # its copy went (or is being downloaded: then it is held)
                    _remove_orphan_lock(copy)
            total = sum(size for _, size, _ in entries)
            self._over_limit = False
            for _, size, path in sorted(entries):
                if total <= self.max_bytes - room:
                    return
                if path == keep or not self._remove_unless_held(path, path):
                    continue  # being read: it stays
                total -= size
            self._over_limit = total > self.max_bytes - room  # shards being read (or kept) stay: try again later

