"""A remote byte stream that survives cuts: it reopens with a range request from the byte
reached, so the bytes it returns have no gap and no duplicate."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Protocol

from .errors import SourceError, TransientError
from .retry import RetryBudget


class Response(Protocol):
    """What a backend hands back for a GET: bytes as they arrive, and a way to let go."""

    def read1(self, size: int) -> bytes: ...

    def close(self) -> None: ...


#: ``open(url, start, stop)`` -> a response whose first byte is byte ``start`` of the object;
#: raises SourceError (permanent) or TransientError.
Opener = Callable[[str, int, "int | None"], Response]
#: Maps a backend's own exceptions raised while reading a response to our errors.
ErrorMapper = Callable[[str, int, BaseException], SourceError]

_READ_SIZE = 1 << 20
#: What :meth:`ResumingStream.readinto` asks a response for at a time: as much as a read gives,
#: but below glibc's mmap threshold (128 KiB, fixed in the workers), so that the bytes a read
#: returns come from the heap's free blocks, not from fresh pages.
_PIECE_SIZE = 120 << 10


def response_version(response: Response) -> str | None:
    """The version of the object ``response`` is of, where its backend says: an S3 body's
    ``version`` (its ETag), an HTTP response's ``ETag`` header, else its ``Last-Modified``."""
    version = getattr(response, "version", None)
    if isinstance(version, str):
        return version
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    return headers.get("ETag") or headers.get("Last-Modified")


def _declares_length(response: Any) -> bool:
    """Whether a response says where its body ends (``Content-Length``, or chunked, whose end is
    marked), so that its client raises on a cut; one of HTTP/1.0's manner says nothing, and ends
    where the connection closes, cut or not. Responses without headers (S3 clients') declare it."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return True
    return headers.get("Content-Length") is not None or "chunked" in (headers.get("Transfer-Encoding") or "").lower()


class ResumingStream:
    """A file-like reader of bytes ``[start, stop)`` of ``url`` (``stop=None``: to the end).
    Its first request, the retries of a refused request and the resumes after a cut all spend
    one ``budget``, so that a read never makes more attempts than the budget allows (it would,
    were each resume given retries of its own)."""

    def __init__(self, url: str, start: int, stop: int | None, open_range: Opener,
                 map_error: ErrorMapper, budget: RetryBudget, size: int | None = None) -> None:
        self.url = url
        self.start = start
        self.position = start
        self.stop = stop
        self.size = size  # the object's size where known (an index's), to tell a cut from its end
        self._open_range = open_range
        self._map_error = map_error
        self.budget = budget
        self.policy = budget.policy
        self._response: Response | None = None
        self._version: str | None = None  # of the object the first response was of
        self._opened = False
        self._window_start = 0.0
        self._window_bytes = 0

    def _open(self) -> Response:
        """A response from ``position`` on, of the version of the object the first one was of:
        a resume after a cut that found the object replaced (a set rebuilt at the same URLs as
        it was read) would otherwise join the start of one version to the rest of another,
        which nothing checks in shards without an index."""
        response = self._open_range(self.url, self.position, self.stop)
        version = response_version(response)
        if not self._opened:
            self._opened, self._version = True, version
        elif version is not None and self._version is not None and version != self._version:
            response.close()
            raise SourceError(self.url, self.position, f"was replaced while it was read (its version {self._version} "
                              f"is now {version}, as the read resumed after a cut): read it again")
        return response

    def _read_some(self, size: int) -> bytes:
        if self._response is None:
            self._response = self._open()
            self._window_start, self._window_bytes = time.monotonic(), 0
        try:
            data = self._response.read1(size)
        except (SourceError, MemoryError):  # (memory: not the network's failure, nor worth a retry)
            raise
        except Exception as exc:  # noqa: BLE001 - every backend has its own exception zoo
            raise self._map_error(self.url, self.position, exc) from None
        now = time.monotonic()
        self._window_bytes += len(data)
        if self._window_bytes >= self.policy.stall_bytes:
            self._window_start, self._window_bytes = now, 0
        elif now - self._window_start > self.policy.read_timeout:
            raise TransientError(self.url, self.position, f"stalled: {self._window_bytes} bytes in "
                                 f"{now - self._window_start:.1f}s")
        if not data and self.stop is not None and self.position < self.stop:
            raise TransientError(self.url, self.position, f"connection closed before byte {self.stop}")
        if not data and self.size is not None and self.position < self.size and not _declares_length(self._response):
            # a response without a length ends where its connection closes: before the size known, a cut
            raise TransientError(self.url, self.position, f"connection closed before byte {self.size} (the response "
                                 f"gave no length)")
        return data

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all that is left for -1); fewer only at the end."""
        want = (self.stop - self.position if self.stop is not None else 1 << 62) if size < 0 else size
        return b"".join(self._pieces(want, _READ_SIZE))

    def readinto(self, out: memoryview) -> int:
        """Fill ``out`` with the next bytes; fewer (their number returned) only at the end."""
        filled = 0
        for data in self._pieces(len(out), _PIECE_SIZE):
            out[filled:filled + len(data)] = data
            filled += len(data)
        return filled

    def _pieces(self, want: int, piece: int) -> Iterator[bytes | memoryview]:
        """The next ``want`` bytes (fewer at the end), as the responses give them, at most
        ``piece`` bytes each; cuts resumed and refusals retried within the budget."""
        if self.stop is not None:
            want = min(want, self.stop - self.position)
        while want > 0:
            try:
                data = self._read_some(min(want, piece))
            except TransientError as exc:
                self.close()  # the next attempt reopens the stream at ``position``
                self.budget.failed(exc, "request", resuming=self.position > self.start)
                continue
            if not data:
                return
            self.budget.progressed()
            self.position += len(data)
            want -= len(data)
            yield data

    def close(self) -> None:
        if self._response is not None:
            try:
                self._response.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail again
                pass
            self._response = None

    def __enter__(self) -> "ResumingStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class BufferedStream:
    """A stream whose small reads are served from large ones: walking a tar reads a 512-byte
    header per member, and a request library's per-call cost (tens of microseconds) would
    otherwise dominate a shard of small samples. A large read passes straight through."""

    def __init__(self, stream: Any, chunk: int = _READ_SIZE) -> None:
        self.stream = stream
        self.chunk = chunk
        self._buffer = b""
        self._position = 0

    def read(self, size: int = -1) -> bytes:
        available = len(self._buffer) - self._position
        if size < 0:
            data = self._buffer[self._position:] + self.stream.read()
            self._buffer, self._position = b"", 0
            return data
        if size <= available:
            data = self._buffer[self._position:self._position + size]
            self._position += size
            return data
        head = self._buffer[self._position:]
        self._buffer, self._position = b"", 0
        if size - available >= self.chunk:
            return head + self.stream.read(size - available)
        self._buffer = self.stream.read(self.chunk)
        return head + self.read(size - available) if self._buffer else head

    def close(self) -> None:
        self.stream.close()

    def __enter__(self) -> "BufferedStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
