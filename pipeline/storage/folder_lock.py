"""A lock on a local output folder, so that two builds never write into one at once.

It is the folder's own ``flock``: no file is left behind, and the kernel drops it with the
process, however that ends. ``flock`` belongs to the open file description, which a forked child
shares (a user's fork pool, DataLoader workers started while a ``ShardWriter`` is open): so the
lock is released with ``LOCK_UN`` by the process that took it (a child's copy only closes its
descriptor), and released too when its holder is garbage collected (a writer dropped unclosed).
A file system whose folders take no ``flock`` (NFS, which emulates it with POSIX locks that need
a file open for writing; Lustre mounted without ``-o flock``) gives no lock: builds go on as
before there was one.
"""

from __future__ import annotations

import fcntl
import os
import weakref
from pathlib import Path


class FolderLock:
    """A held lock (or none, where the file system has no such locks), released by :meth:`release`
    or when it is garbage collected."""

    def __init__(self, descriptor: int | None) -> None:
        self._release = None if descriptor is None else weakref.finalize(self, _release, descriptor, os.getpid())

    def release(self) -> None:
        if self._release is not None:
            self._release()


def take_folder_lock(folder: Path, shared: bool) -> FolderLock | None:
    """The lock of ``folder`` (``shared``: one that other shared holders may hold too, but no
    exclusive one); ``None`` when another process holds it."""
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(descriptor, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    except OSError:  # (EBADF on NFS, ENOSYS, ENOLCK): no lock to take here
        os.close(descriptor)
        return FolderLock(None)
    return FolderLock(descriptor)


def folder_held(folder: Path) -> bool:
    """Whether a process holds the lock of ``folder`` now (a build is writing it), found in the
    kernel's list of locks (``/proc/locks``) without taking it: a reader that took it, even for an
    instant, could make a build starting then refuse the folder. ``False`` says only that no lock
    is seen: not one off Linux (no ``/proc/locks``), nor one of another machine or PID namespace."""
    try:
        status = os.stat(folder)
        locks = Path("/proc/locks").read_text()
    except OSError:
        return False
    lock = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino}"
    return any("FLOCK" in line and lock in line.split() for line in locks.splitlines())


def _release(descriptor: int, owner: int) -> None:
    try:
        if os.getpid() == owner:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)
