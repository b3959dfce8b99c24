"""Opening an index wherever it lives: the one way every reader, checker and merger gets one.

A *location* is a local ``index.json`` (or partial ``index.part-*.json``) or the folder holding
it, a ``file://`` URL of either, an ``http(s)://`` URL of an index file or of its folder, an
``s3://bucket/prefix`` (with or without a trailing slash; the ``index.json`` under it), or any
other scheme the opener reads. The JSON is read whole (it is small); the shard table beside it
is read by ranges, with ``pread`` when local and ranged requests of :data:`REMOTE_BLOCK_BYTES`
when remote, so opening a set of a million shards reads only its per-shard part.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

from ..format.errors import IndexFormatError
from ..format.index import (
    INDEX_NAME,
    DatasetIndex,
    TableFile,
    TableOpener,
    TableReader,
    parse_index,
    reindex,
    table_name_for,
)
from ..format.shard_table import ShardTable
from ..format.verify import verify_table_stream
from .errors import SourceError, redact
from .location_hints import SHARD_SUFFIXES, location_hint, remote_sets_hint
from .opener import is_remote, join, local_path, open_stream, parent, read_bytes, read_range
from .per_process import per_process
from .retry import RetryPolicy, RetrySink

#: Record offsets and checksums are fetched remotely 256 KiB (64k records) a request.
REMOTE_BLOCK_BYTES = 1 << 18
#: The most bytes a remote index file is read to: its JSON is a few hundred bytes, or a few MB
#: where it lists many shards' names one by one.
INDEX_FILE_LIMIT = 256 << 20

_WHAT_TO_PASS = "pass an index.json, its folder, or a URL of either (https://..., s3://bucket/prefix)"
#: How a remote store says that nothing is at a location (then what to pass is the advice); S3
#: also says "access denied" for a key that is not there to credentials that may not list the bucket.
_NOT_THERE = ("not found", "no such key", "no such bucket", "gone", "access denied")


class IndexSourceError(IndexFormatError, SourceError):
    """An index or its shard table cannot be read from where it should be. Both an index error
    (what opening a bad index raises) and a source error (what a URL that cannot be read raises),
    so that callers catching either see it. ``cause``: the store's answer, for a remote index
    file (``HTTP 403 forbidden``)."""

    cause = ""


class NoIndexError(IndexSourceError):
    """No index file can be read at a location: for a folder of shards, not an error in itself
    (its shards are then streamed without an index). ``splits_beside``: whether the message
    names the splits of a build found beside it (then the location is no shard either)."""

    splits_beside = False


class UnansweredIndexError(IndexSourceError):
    """A remote index file that cannot be read for another reason than its absence (a server
    that refuses connections, credentials): an error where the index is what was given, but
    for shards given by name only no index to use beside them (reading them will tell why)."""


@dataclass(frozen=True)
class IndexedShards:
    """Shards with an index; their URLs resolve against the index's folder ``base``."""

    index: DatasetIndex
    base: str
    index_url: str | None = None  # the index file it was read from

    @property
    def shards(self) -> ShardTable:
        return self.index.shards

    def url(self, i: int) -> str:
        return join(self.base, self.index.shards.names[i])

    @cached_property
    def remote(self) -> bool:
        """Whether the shards are read over the network: those of a remote index, and those a
        local index names by URL (``pipeline index https://... --output DIR``)."""
        return is_remote(self.base) or any(map(is_remote, self.index.shards.names))

    def damaged_table(self, policy: RetryPolicy | None = None, stats: RetrySink | None = None) -> str | None:
        """Why the shard table is damaged (read whole, its sha256 is not the one index.json
        gives), naming it; None when it is sound, when there is none, or when it cannot be read
        now (the error at hand is then the one to tell). A remote one is read under ``policy``,
        its requests reported to ``stats``. Read once per process: the answer is kept, and the
        reader threads whose pieces failed together wait for the one that reads it."""
        if self.index.table is None:
            return None
        url = join(self.base, self.index.table.name)
        answers, lock = _table_answers()
        with lock:  # (a local table copied again since is read again)
            key = (url, self.index.table.sha256, None if is_remote(url) else _version(url))
            if key not in answers:
                answers[key] = _table_problem(url, self.index.table, policy, stats)
            return answers[key]

    def replaced_since(self, policy: RetryPolicy | None = None, stats: RetrySink | None = None) -> str | None:
        """Why the set is not the one read when it was opened, when its index file names another
        shard table now, or is gone (the set was rebuilt, or copied anew, under a running job: its
        shards fail against the table held, which is sound, of the set before, or are gone, as a
        rebuild deletes them first); None otherwise."""
        if self.index.table is None or self.index_url is None:
            return None
        try:
            now = json.loads(read_bytes(self.index_url, policy, stats=stats, limit=INDEX_FILE_LIMIT)
                             ).get("shards", {}).get("table_sha256")
        except OSError as exc:  # (a SourceError too)
            gone = isinstance(exc, SourceError) and nothing_at(exc) if is_remote(self.index_url) \
                else not os.path.exists(local_path(self.index_url))
            return f"{redact(self.index_url)} is gone since this loader opened it: the set is being rebuilt, or " \
                   f"was removed" if gone else None
        except (ValueError, AttributeError):
            return None
        if now is None or now == self.index.table.sha256:
            return None
        return (f"{redact(self.index_url)} names another shard table than when this loader opened it: the set was "
                f"rebuilt or copied anew since, and its shards are not the ones indexed then")

    def table_fix(self) -> str:
        """What to do about a damaged shard table: the command that writes it again where it
        applies (local shards in the index's folder)."""
        if is_remote(self.base) or any("/" in name for name in self.index.shards.names):
            return f"copy it again with {INDEX_NAME}, or re-index its shards"
        return f"copy it again with {INDEX_NAME}, or {reindex(os.path.normpath(self.base))}"


#: The answers of :meth:`IndexedShards.damaged_table` in this process, and the lock they are
#: found under (made anew in a forked child: a lock held at the fork would never be let go).
_table_answers = per_process(lambda: ({}, threading.Lock()))


def _version(path: str) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_mtime_ns, found.st_size


def _table_problem(url: str, table: TableFile, policy: RetryPolicy | None, stats: RetrySink | None) -> str | None:
    try:
        with open_stream(url, policy, stats=stats, size=table.bytes) as stream:
            problem = verify_table_stream(stream, redact(url), table)
    except SourceError:
        return None
    return None if problem is None else str(problem)


class FileRange:
    """``pread`` of a local file, opened on first use in each process (so that it pickles for
    workers started with spawn, and survives a fork: ``pread`` shares no file position)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = 0

    def __call__(self, start: int, stop: int) -> bytes:
        try:
            if self._fd is None or self._pid != os.getpid():
                self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
            data = os.pread(self._fd, stop - start, start)
        except OSError as exc:
            raise IndexSourceError(self.path, start, f"cannot read shard table: {exc.strerror or exc}") from None
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
    else the ``index.json`` in that folder or under that prefix. A shard (or a brace pattern of
    shards) names none: an :class:`IndexFormatError` says what to pass instead, rather than a
    tar read as JSON (or, remotely, a search for ``x.tar/index.json``)."""
    text = os.fspath(location)
    if not is_remote(text):
        path = local_path(text)
        if os.path.isdir(path):
            return os.path.join(path, INDEX_NAME)
        _refuse_shards(text, path)
        return path
    path = urlsplit(text).path if text.startswith(("http://", "https://")) else text.partition("://")[2]
    _refuse_shards(text, path)  # (only an HTTP URL has a query and a fragment: '#' and '?' are in S3 keys)
    return text if path.endswith(".json") else join(text, INDEX_NAME)


def _refuse_shards(location: str, path: str) -> None:
    """Raise when ``path`` (of ``location``) names a shard, or shards by a brace pattern."""
    if not path.endswith(SHARD_SUFFIXES):
        return
    shown = redact(location)
    what, pronoun, verb = ("a pattern of shards", "their", "them") if "{" in path else ("a shard", "its", "it")
    if not path.endswith(".tar"):  # gzip-compressed: no index reads it by ranges
        raise IndexFormatError(f"{shown} is {what} (gzip-compressed), not an index: a loader streams {verb} as "
                               f"{verb} {'are' if verb == 'them' else 'is'} (make_loader), without an index")
    folder = os.path.dirname(path) or "."
    if not is_remote(location) and os.path.isfile(os.path.join(folder, INDEX_NAME)):
        raise IndexFormatError(f"{shown} is {what}, not an index: pass {pronoun} folder, which has one "
                               f"({shlex.quote(folder)})")
    output = " --output DIR" if is_remote(location) else ""  # (an index is written beside local shards only)
    raise IndexFormatError(f"{shown} is {what}, not an index: pass {pronoun} folder or {INDEX_NAME} (or index "
                           f"{verb} first: pipeline index {shlex.quote(shown)}{output})")


def nothing_at(exc: SourceError) -> bool:
    """Whether a remote store's answer says that nothing is at the URL (rather than why it
    cannot be read: credentials, a host that does not resolve...)."""
    reason = str(exc.reason or exc)
    return any(word in reason for word in _NOT_THERE)


def no_shard_either(index_error: IndexSourceError, url: str, policy: RetryPolicy | None = None,
                    stats: RetrySink | None = None) -> IndexSourceError | None:
    """The error of a remote ``url`` given as a folder, whose index file ``index_error`` says
    cannot be read, where ``url`` cannot be read as a shard either (its first byte asked for):
    ``index_error`` itself where nothing is there; where the server forbids it, an error that
    says both (a bucket served over HTTP forbids a file that is not there: a folder's URL
    misspelt without its "/", whose index error alone was replaced by the shard's bare 403).
    ``None`` where ``url`` may be a shard (or why it cannot be read is for reading it to tell)."""
    exc = _first_byte_error(url, policy, stats)
    if exc is not None and nothing_at(exc):
        return index_error
    if exc is not None and http_forbidden(exc):
        return UnansweredIndexError(index_error.url, None, f"cannot read index file ({index_error.cause}), nor "
                                                           f"{url} as a shard ({exc.reason or exc}); "
                                                           f"{_forbidden_advice(both=True)}")
    return None


def nothing_there(url: str, policy: RetryPolicy | None = None, stats: RetrySink | None = None) -> bool:
    """Whether the store says that nothing is at the remote ``url``, asked for its first byte
    (``False`` where something is, or where the answer says only why it cannot be read)."""
    exc = _first_byte_error(url, policy, stats)
    return exc is not None and nothing_at(exc)


def _first_byte_error(url: str, policy: RetryPolicy | None, stats: RetrySink | None) -> SourceError | None:
    """Why the first byte at ``url`` cannot be read (``None``: it can)."""
    try:
        read_range(url, 0, 1, policy, stats=stats)
    except SourceError as exc:
        return exc
    return None


def http_forbidden(exc: Exception) -> bool:
    """Whether an HTTP server answered 403, which a bucket served over HTTP gives for a file
    that is not there as for one it may not serve: maybe nothing there, maybe no right to it."""
    return "HTTP 403 " in str(getattr(exc, "reason", None) or exc)


def _forbidden_advice(both: bool = False) -> str:
    """What a 403 for an index file (and, ``both``, for the URL beside it read as a shard) may
    mean, and what to pass."""
    it, none = ("them", "neither is there") if both else ("it", "there is none")
    return f"the server may not let {it} be read, or {none} (a bucket served over HTTP forbids a file that does " \
           f"not exist): {_WHAT_TO_PASS}"


def _read_index_file(url: str, policy: RetryPolicy | None, stats: RetrySink | None, patterns: bool,
                     hint: bool) -> bytes:
    """The bytes of the index file ``url``; a missing one is a :class:`NoIndexError` saying what
    to pass instead (a pattern of shards only to a caller that takes one: ``patterns``; the
    splits beside a remote one only where ``hint``, as looking costs requests)."""
    if is_remote(url):
        try:
            return read_bytes(url, policy, stats=stats, limit=INDEX_FILE_LIMIT)
        except SourceError as exc:
            cause = str(exc.reason or exc)
            if not nothing_at(exc):  # not "no index here", which callers may take for shards without one: the
                # reason says what to do (credentials, a server that does not answer...)
                forbidden = "; " + _forbidden_advice() if http_forbidden(exc) else ""
                unanswered = UnansweredIndexError(url, None, f"cannot read index file ({cause}){forbidden}")
                unanswered.cause = cause
                raise unanswered from None
            splits = remote_sets_hint(url, policy) if hint else ""
            missing = NoIndexError(url, None, f"cannot read index file ({cause}){splits or '; ' + _WHAT_TO_PASS}")
            missing.splits_beside, missing.cause = bool(splits), cause
            raise missing from None
    try:
        with open(url, "rb") as file:
            return file.read()
    except FileNotFoundError:
        folder = os.path.dirname(url) or "."
        given = folder if os.path.basename(url) == INDEX_NAME and os.path.isdir(folder) else url
        hint = location_hint(given, patterns)
        raise NoIndexError(url, None, f"no such index file{hint or '; ' + _WHAT_TO_PASS}") from None
    except OSError as exc:
        raise IndexSourceError(url, None, f"cannot read index: {exc.strerror or exc}") from None


def _local_table(folder: str, table: TableFile) -> TableReader:
    path = os.path.join(folder, table.name)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise IndexSourceError(path, None, f"no such shard table (it is written with the index: copy it with "
                               f"{INDEX_NAME}, or {reindex(folder)})") from None
    if size != table.bytes:
        raise IndexFormatError(f"{path}: is {size} bytes, the index says {table.bytes} (cut short or replaced: "
                               f"copy it again with {INDEX_NAME}, or {reindex(folder)})")
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
               stats: RetrySink | None = None, *, patterns: bool = False, hint: bool = True) -> IndexedShards:
    """The index at ``location`` (see the module docstring) and the folder its shard names
    resolve against; remote reads (of the JSON now, of the table's parts later, in whatever
    worker needs them) follow ``policy`` and report their retries to ``stats``. A missing index
    is a :class:`NoIndexError` (whose advice includes a pattern of shards when the caller takes
    one: ``patterns``, and the splits beside a remote one unless ``hint`` is false: a caller that
    takes no index there for shards without one), a missing table an :class:`IndexSourceError`,
    a malformed one an :class:`IndexFormatError`; each names the (redacted) URL or path."""
    url = index_url(location)
    data = _read_index_file(url, policy, stats, patterns, hint)
    base = parent(url)
    return IndexedShards(parse_index(data, redact(url), _table_opener(base, policy, stats)), base, url)


def strays(base: str, index: DatasetIndex) -> list[str]:
    """The ``.tar`` files in a local set's folder that its index does not name: shards added
    after the build, or a copy left there, which the set does not read and re-indexing the
    folder would take for data."""
    if is_remote(base) or not os.path.isdir(base):
        return []
    names = set(os.listdir(base))
    if sum(name.endswith(".json") and table_name_for(name) in names for name in names) > 1:
        return []  # the parts of a build, or sets indexed side by side (train.json, val.json): each names its own
    named = set(index.shards.names)
    return sorted(name for name in names if name.endswith(".tar") and name not in named)


def load_index(location: str | os.PathLike[str]) -> DatasetIndex:
    """An index from a local file or folder, or from a URL (``http(s)://``, ``s3://``...) of an
    ``index.json`` or of a folder or bucket prefix holding one."""
    return open_index(location).index
