"""One opener for every URL: map a URL to bytes, a byte range or a stream.

- local paths and ``file://``: ``pread``, no copies through a buffer;
- ``http(s)://``: urllib3, ranged GETs, resumed after cuts (:mod:`.http`);
- ``s3://bucket/key``: boto3, any S3-compatible endpoint (:mod:`.s3`);
- ``pipe:COMMAND``: the standard output of a shell command (webdataset's convention);
- any other scheme (``gs://``, ``az://``, ``hf://``...): fsspec, when it and the scheme's package
  are installed.

Remote reads are streamed in chunks (never a whole shard in memory unless asked), retried with
back-off and jitter on transient failures, and resumed from the byte reached; permanent failures
raise one :class:`SourceError` naming the URL, the byte offset and the cause.
"""

from __future__ import annotations

import errno
import mmap
import os
import posixpath
import stat
from typing import Any, BinaryIO
from urllib.parse import parse_qsl, quote, unquote, urljoin, urlsplit, urlunsplit

from . import http, s3
from .errors import CutShort, SourceError, redact
from .page_maps import map_pages
from .pipe_stream import PipeStream
from .retry import RetryBudget, RetryPolicy, RetrySink
from .streams import BufferedStream, ResumingStream


def scheme(url: str) -> str:
    """``file`` for local paths, else the URL's scheme (``pipe`` for ``pipe:COMMAND``)."""
    if url.startswith("pipe:"):
        return "pipe"
    if "://" not in url:
        return "file"
    return url.split("://", 1)[0].lower()


#: Where a remote index may name shards besides its own scheme: fsspec's other schemes include
#: local files (``local://``, ``simplecache::file://``), which a server's index must never reach.
_NETWORK_SCHEMES = ("http", "https", "s3")


def is_remote(url: str) -> bool:
    return scheme(url) != "file"


def local_path(url: str) -> str:
    """The file system path of a local URL (``file://`` or a plain path). A ``file://`` URL with
    a host other than ``localhost`` is refused: its host was dropped, so ``file://out`` named the
    current folder (a build with ``overwrite`` replaced the set there)."""
    if url[:5].lower() != "file:" or not url[5:].startswith("/"):
        return url
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost") or not parts.path:
        raise ValueError(f"{url}: a file:// URL names an absolute path on this machine, file:///folder/name (three "
                         f"slashes) or file://localhost/folder/name; {parts.netloc!r} would be a host. For a path "
                         f"relative to the current folder, give the path itself")
    return unquote(parts.path)  # (Path.as_uri() quotes: %20)


#: The backends of the schemes read with ranged requests.
_RANGED = {"http": http, "https": http, "s3": s3}


def _remote_stream(url: str, start: int, stop: int | None, policy: RetryPolicy | None,
                   stats: RetrySink | None, size: int | None = None) -> ResumingStream:
    """One read of ``url``: one retry budget, from ``policy`` (the environment's when None),
    its retries reported to ``stats``."""
    backend = _RANGED.get(scheme(url))
    if backend is None:
        raise SourceError(url, start, f"scheme {scheme(url)!r} has no ranged reader")
    budget = RetryBudget(policy or RetryPolicy.from_env(), url, stats)

    def open_range(url: str, start: int, stop: int | None) -> Any:
        if stats is not None:
            stats.requested()
        return backend.open_range(url, start, stop, budget.policy)
    return ResumingStream(url, start, stop, open_range, backend.map_error, budget, size)


def _open_local(url: str, start: int) -> int:
    """A read-only descriptor of a local file; a failure names the URL and the offset wanted.
    Opened without blocking, and refused unless a regular file: a FIFO in a shard's place would
    block the open until something writes to it, and a folder fail its mapping without a name."""
    try:
        fd = os.open(local_path(url), os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise SourceError(url, start, f"cannot open: {exc.strerror}{_advice(exc)}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise SourceError(url, start, f"is {_KINDS.get(stat.S_IFMT(mode), 'a special file')}, not a file: a shard "
                                      f"must be a regular file")
    return fd


_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device",
          stat.S_IFBLK: "a device"}


def _local_range(url: str, start: int, stop: int) -> bytes:
    fd = _open_local(url, start)
    try:
        chunks = []
        position = start
        while position < stop:
            data = os.pread(fd, min(stop - position, 64 << 20), position)
            if not data:
                raise CutShort(url, position, f"ends at byte {position}, expected data up to byte {stop}")
            chunks.append(data)
            position += len(data)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


def check_range(url: str, start: int, stop: int, size: int | None = None) -> None:
    """That ``[start, stop)`` is a range (of a file of ``size`` bytes, when given)."""
    if stop < start:  # an index's offsets out of order: its table is damaged
        raise SourceError(url, start, f"a range that ends (at byte {stop}) before it starts: is the index's table "
                                      f"(index.bin) damaged? 'pipeline verify' checks it")
    if size is not None and size < stop:
        raise CutShort(url, size, f"ends at byte {size}, expected data up to byte {stop}")


def _mapped(fd: int, url: str, at: int, length: int, offset: int = 0) -> memoryview:
    try:
        return map_pages(fd, length, offset)
    except OSError as exc:
        raise SourceError(url, at, f"cannot map it: {exc.strerror or exc}{_advice(exc)}") from None


def _advice(exc: OSError) -> str:
    """What to do about an error opening or mapping a file, where there is something to do."""
    if exc.errno == errno.EMFILE:
        return " (this process has as many files open as it may: raise the limit, ulimit -n)"
    return ""


def map_file(url: str, wanted_at: int = 0) -> tuple[memoryview, os.stat_result]:
    """A local file whole as a read-only view of its pages, and its status when mapped (a
    failure names the byte ``wanted_at``, for which it was mapped)."""
    fd = _open_local(url, wanted_at)
    try:
        status = os.fstat(fd)
        if status.st_size == 0:
            return memoryview(b""), status
        return _mapped(fd, url, wanted_at, status.st_size), status
    finally:
        os.close(fd)


def map_range(url: str, start: int, stop: int) -> memoryview:
    """Bytes ``[start, stop)`` of a local file as a read-only view of its pages (no copy into
    our memory: the page cache itself, unmapped when the last view of it goes)."""
    check_range(url, start, stop)  # (before the file is opened: an index that misstates it is what to mend)
    fd = _open_local(url, start)
    try:
        size = os.fstat(fd).st_size
        check_range(url, start, stop, size)
        if stop == start:
            return memoryview(b"")
        base = start - start % mmap.ALLOCATIONGRANULARITY
        return _mapped(fd, url, start, stop - base, base)[start - base:]
    finally:
        os.close(fd)


def read_range(url: str, start: int, stop: int, policy: RetryPolicy | None = None, *,
               stats: RetrySink | None = None) -> bytes:
    """Bytes ``[start, stop)`` of ``url``; fewer bytes than asked for is an error. Remote reads
    retry within one budget of ``policy`` and report each retry to ``stats``."""
    check_range(url, start, stop)
    kind = scheme(url)
    if kind == "file":
        return _local_range(url, start, stop)
    if kind in _RANGED:
        with _remote_stream(url, start, stop, policy, stats) as stream:
            data = stream.read()
    else:
        with open_stream(url, policy) as stream:
            _skip(stream, start, url)
            data = stream.read(stop - start)
    _check_length(url, start, stop, len(data))
    return data


def has_ranged_reads(url: str) -> bool:
    """Whether ``url`` is read with ranged requests (HTTP(S), S3): what :func:`read_range_into` takes."""
    return scheme(url) in _RANGED


def read_range_into(url: str, start: int, out: memoryview, policy: RetryPolicy | None = None, *,
                    stats: RetrySink | None = None) -> None:
    """:func:`read_range` of the ``len(out)`` bytes from ``start`` of a URL that
    :func:`has_ranged_reads`, into ``out``: memory the caller reuses (see :mod:`.buffers`)."""
    if not has_ranged_reads(url):
        raise ValueError(f"{redact(url)} is not read with ranged requests: use read_range")
    with _remote_stream(url, start, start + len(out), policy, stats) as stream:
        _check_length(url, start, start + len(out), stream.readinto(out))


def _check_length(url: str, start: int, stop: int, got: int) -> None:
    if got != stop - start:
        raise CutShort(url, start + got, f"ends at byte {start + got}, expected data up to byte {stop}")


def _skip(stream: Any, start: int, url: str) -> None:
    """Move ``stream`` to byte ``start``: by seeking, or by reading up to it where it cannot."""
    if hasattr(stream, "seek") and getattr(stream, "seekable", lambda: False)():
        stream.seek(start)
        return
    at = 0
    while at < start:
        data = stream.read(min(start - at, 1 << 20))
        if not data:
            raise CutShort(url, at, f"ends at byte {at}, expected data from byte {start}")
        at += len(data)


def _fsspec_open(url: str) -> Any:
    """A stream of ``url`` through fsspec. Every failure to open it is a SourceError naming the
    URL: fsspec's file systems raise what their libraries raise (``socket.gaierror`` for an
    FTP host that does not resolve, say), which names nothing."""
    try:
        import fsspec
    except ImportError:
        raise SourceError(url, None, f"scheme {scheme(url)!r} needs fsspec and its package for that scheme") from None
    try:
        return fsspec.open(url, "rb").open()
    except FileNotFoundError:
        raise SourceError(url, None, "not found") from None
    except (ImportError, ValueError, OSError) as exc:
        raise SourceError(url, None, f"fsspec cannot open it: {exc}") from None


def open_stream(url: str, policy: RetryPolicy | None = None, *, stats: RetrySink | None = None,
                size: int | None = None) -> BinaryIO:
    """A binary stream of a whole object (read sequentially); a remote one retries within one
    budget of ``policy`` and reports each retry to ``stats``, and resumes a response without a
    length that ends before ``size`` (the index's, where known), which only a cut tells apart."""
    kind = scheme(url)
    if kind == "file":
        return open(_open_local(url, 0), "rb", buffering=1 << 20)
    if kind in ("http", "https", "s3"):
        return BufferedStream(_remote_stream(url, 0, None, policy, stats, size))  # type: ignore[return-value]
    if kind == "pipe":
        return PipeStream(url)  # type: ignore[return-value]
    return _fsspec_open(url)


def read_bytes(url: str, policy: RetryPolicy | None = None, *, stats: RetrySink | None = None,
               limit: int | None = None) -> bytes:
    """A whole object (an index): small enough to hold in memory. One of more than ``limit``
    bytes (decompressed, where its server compressed it) is a :class:`SourceError`, read no
    further: a server's endless answer would otherwise take all memory."""
    with open_stream(url, policy, stats=stats) as stream:
        data = stream.read() if limit is None else stream.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise SourceError(url, limit, f"is larger than {limit} bytes, more than any file this is read as: not "
                                      f"the file named, or a server that does not stop sending")
    return data


def join(base: str, relative: str) -> str:
    """``relative`` resolved against the folder URL ``base`` (which ends in ``/`` or not); an
    absolute URL stays as it is. A ``pipe:`` command is refused: names come from indexes, and
    reading an index must never run a command; so is a URL in a remote folder of a scheme that
    can read local files (any but HTTP(S), S3 and the folder's own)."""
    if scheme(relative) == "pipe":
        raise SourceError(relative, None, f"a pipe: command cannot stand for a file in {redact(base)}")
    if "://" in relative:
        if is_remote(base) and scheme(relative) not in (*_NETWORK_SCHEMES, scheme(base)):
            raise SourceError(relative, None, f"a local file cannot stand for a file in {redact(base)}: a remote "
                                              f"index names its own shards, and reading it must never read this "
                                              f"machine's files (a remote index's shards are http(s)://, s3:// or "
                                              f"of its own scheme); index local shards with a local index")
        return relative
    kind = scheme(base)
    if kind == "file":
        return os.path.join(local_path(base), relative)
    if kind in ("http", "https"):  # (a name is a file's: '%', '#', '?' and ':' in it are quoted, or they
        # would read as an escape, a fragment, a query or a scheme)
        parts = urlsplit(base)
        folder = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/", "", ""))
        return _with_query(urljoin(folder, quote(relative, safe="/")), parts.query)
    if relative.startswith("/"):  # (a bucket's key is relative to its bucket: this is a path on some machine)
        raise SourceError(relative, None, f"an absolute path cannot stand for a file in {redact(base)}: the index "
                                          f"names a file of the machine that wrote it; index the shards where they "
                                          f"are now (pipeline index)")
    prefix, _, path = base.partition("://")
    return f"{prefix}://{posixpath.normpath(posixpath.join(path, relative))}"


def parent(url: str) -> str:
    """The folder URL of an object URL; an HTTP(S) one keeps its query (see :func:`_with_query`)."""
    kind = scheme(url)
    if kind == "file":
        return os.path.dirname(local_path(url)) or "."
    if kind in ("http", "https"):
        parts = urlsplit(url)
        return urlunsplit((parts.scheme, parts.netloc, parts.path.rsplit("/", 1)[0], parts.query, ""))
    return url.rsplit("/", 1)[0]


#: Query parameters of a presigned URL (S3, GCS): a signature of its one object, refused for another.
_OBJECT_SIGNATURES = frozenset({"x-amz-signature", "x-goog-signature", "signature"})


def _with_query(url: str, query: str) -> str:
    """``url`` with the query of the folder's URL it was joined to: a token a server takes in
    the query (an Azure SAS, say) admits its set's every file, not the index alone. A presigned
    URL's signature is not carried: it signs the index only."""
    names = {name.lower() for name, _ in parse_qsl(query, keep_blank_values=True)}
    return url if not query or names & _OBJECT_SIGNATURES else f"{url}?{query}"
