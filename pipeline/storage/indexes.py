"""Opening an index wherever it lives: the one way every reader, checker and merger gets one.

A *location* is a local ``index.json`` (or partial ``index.part-*.json``) or the folder holding
it, a ``file://`` URL of either, an ``http(s)://`` URL of an index file or of its folder, an
``s3://bucket/prefix`` (with or without a trailing slash; the ``index.json`` under it), or any
other scheme the opener reads. The JSON is read whole (it is small); the shard table beside it
is read by ranges, with ``pread`` when local and ranged requests of :data:`REMOTE_BLOCK_BYTES`
when remote, so opening a set of a million shards reads only its per-shard part.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..format.errors import IndexFormatError
from ..format.index import INDEX_NAME, DatasetIndex, TableFile, TableOpener, TableReader, parse_index
from ..format.shard_table import ShardTable
from .errors import SourceError, redact
from .opener import is_remote, join, local_path, parent, read_bytes, read_range
from .retry import RetryPolicy, RetrySink

#: Record offsets and checksums are fetched remotely 256 KiB (64k records) a request.
REMOTE_BLOCK_BYTES = 1 << 18

_WHAT_TO_PASS = "pass an index.json, its folder, or a URL of either (https://..., s3://bucket/prefix)"
#: How a remote store says that nothing is at a location (then what to pass is the advice); S3
#: also says "access denied" for a key that is not there to credentials that may not list the bucket.
_NOT_THERE = ("not found", "no such key", "no such bucket", "gone", "access denied")
_SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")


class IndexSourceError(IndexFormatError, SourceError):
    """An index or its shard table cannot be read from where it should be. Both an index error
    (what opening a bad index raises) and a source error (what a URL that cannot be read raises),
    so that callers catching either see it."""


class NoIndexError(IndexSourceError):
    """No index file can be read at a location: for a folder of shards, not an error in itself
    (its shards are then streamed without an index)."""


@dataclass(frozen=True)
class IndexedShards:
    """Shards with an index; their URLs resolve against the index's folder ``base``."""

    index: DatasetIndex
    base: str

    @property
    def shards(self) -> ShardTable:
        return self.index.shards

    def url(self, i: int) -> str:
        return join(self.base, self.index.shards.names[i])

    @property
    def remote(self) -> bool:
        return is_remote(self.base)


class FileRange:
    """``pread`` of a local file, opened on first use in each process (so that it pickles for
    workers started with spawn, and survives a fork: ``pread`` shares no file position)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = 0

    def __call__(self, start: int, stop: int) -> bytes:
        if self._fd is None or self._pid != os.getpid():
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        data = os.pread(self._fd, stop - start, start)
        if len(data) != stop - start:
            raise IndexFormatError(f"{self.path}: ends at byte {start + len(data)}, expected {stop}")
        return data

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_fd": None, "_pid": 0}

    def __del__(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)


@dataclass(frozen=True)
class UrlRange:
    """Ranged requests of a remote shard table (picklable, for workers started with spawn),
    under ``policy``, their retries reported to ``stats``; a failed read is an error of the
    table, naming its URL."""

    url: str
    policy: RetryPolicy | None = None
    stats: RetrySink | None = None

    def __call__(self, start: int, stop: int) -> bytes:
        try:
            return bytes(read_range(self.url, start, stop, self.policy, stats=self.stats))
        except SourceError as exc:
            raise IndexSourceError(self.url, exc.offset, f"cannot read shard table: {exc.reason or exc}") from None


def index_url(location: str | os.PathLike[str]) -> str:
    """The index file a location names: the location itself when it names a ``.json`` file,
    else the ``index.json`` in that folder or under that prefix."""
    text = os.fspath(location)
    if not is_remote(text):
        path = local_path(text)
        return os.path.join(path, INDEX_NAME) if os.path.isdir(path) else path
    return text if urlsplit(text).path.endswith(".json") else join(text, INDEX_NAME)


def _shard_sets_in(folder: str) -> list[str]:
    """The subfolders of a local folder that hold an index: the splits a build wrote there."""
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
    except OSError:
        return []
    return [name for name in names if os.path.isfile(os.path.join(folder, name, INDEX_NAME))]


def location_hint(path: str) -> str:
    """What to pass instead of a local ``path`` that holds no shard set: its splits, when it holds
    those of a build (``OUT/train``, ``OUT/validation``); the way to index its shards, when it
    holds shards without an index; the splits beside it, when it does not exist (a split's name
    misspelt); else ``""``."""
    if os.path.isdir(path):
        shards = sum(1 for entry in os.scandir(path) if entry.name.endswith(_SHARD_SUFFIXES))
        if shards:
            return (f"; {path} holds {shards} shard(s) without an index: index them in place with 'pipeline "
                    f"index {shlex.quote(path)}', or pass their paths (a pattern: {path}/name-{{000000..000009}}.tar)")
        folder = path
    else:
        folder = os.path.dirname(os.path.normpath(path)) or "."
    names = _shard_sets_in(folder)
    if not names:
        return ""
    return (f"; {folder} holds the shard sets {', '.join(map(repr, names))} (one per split): pass one of them, "
            f"e.g. {os.path.join(folder, names[0])}")


def _read_index_file(url: str, policy: RetryPolicy | None, stats: RetrySink | None) -> bytes:
    if is_remote(url):
        try:
            return read_bytes(url, policy, stats=stats)
        except SourceError as exc:
            reason = str(exc.reason or exc)
            where = any(word in reason for word in _NOT_THERE)  # else the reason says what to do (credentials...)
            raise NoIndexError(url, None, f"cannot read index file ({reason})" + (f"; {_WHAT_TO_PASS}" if where else "")
                               ) from None
    try:
        with open(url, "rb") as file:
            return file.read()
    except FileNotFoundError:
        hint = location_hint(os.path.dirname(url))
        raise NoIndexError(url, None, f"no such index file{hint or '; ' + _WHAT_TO_PASS}") from None
    except OSError as exc:
        raise IndexSourceError(url, None, f"cannot read index: {exc.strerror or exc}") from None


def _local_table(folder: str, table: TableFile) -> TableReader:
    path = os.path.join(folder, table.name)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise IndexSourceError(path, None, "no such shard table (it is written with the index: "
                               "copy it with index.json, or rebuild)") from None
    if size != table.bytes:
        raise IndexFormatError(f"{path}: is {size} bytes, the index says {table.bytes}")
    return TableReader(FileRange(path), path)


def _table_opener(base: str, policy: RetryPolicy | None, stats: RetrySink | None) -> TableOpener:
    """Opens the shard tables beside an index in the folder ``base``."""
    if not is_remote(base):
        return lambda table: _local_table(base, table)

    def remote_table(table: TableFile) -> TableReader:
        url = join(base, table.name)
        return TableReader(UrlRange(url, policy, stats), redact(url), REMOTE_BLOCK_BYTES)
    return remote_table


def open_index(location: str | os.PathLike[str], policy: RetryPolicy | None = None,
               stats: RetrySink | None = None) -> IndexedShards:
    """The index at ``location`` (see the module docstring) and the folder its shard names
    resolve against; remote reads (of the JSON now, of the table's parts later, in whatever
    worker needs them) follow ``policy`` and report their retries to ``stats``. A missing index
    is a :class:`NoIndexError`, a missing table an :class:`IndexSourceError`, a malformed one an
    :class:`IndexFormatError`; each names the (redacted) URL or path."""
    url = index_url(location)
    data = _read_index_file(url, policy, stats)
    base = parent(url)
    return IndexedShards(parse_index(data, redact(url), _table_opener(base, policy, stats)), base)


def load_index(location: str | os.PathLike[str]) -> DatasetIndex:
    """An index from a local file or folder, or from a URL (``http(s)://``, ``s3://``...) of an
    ``index.json`` or of a folder or bucket prefix holding one."""
    return open_index(location).index
