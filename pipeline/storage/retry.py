"""Retries with exponential back-off and jitter, the budget one read may spend on them, and the
timeouts every remote read obeys.

Retries are counted where they happen and reported to whoever asked for the read (a
:class:`RetrySink`: a dataset's stats, say), never into a count of the whole process, which
every dataset of the process and every reader thread would share.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, TypeVar
from urllib.parse import urlsplit

from .errors import RetriesSpent, SourceError, TransientError, redact

log = logging.getLogger("pipeline.storage")
T = TypeVar("T")
#: What a resolver answers for a name that does not exist: a typo, not a passing failure (unlike
#: ``EAI_AGAIN``, a resolver that did not answer in time, which is retried), unless the name
#: has answered before (see :data:`_answered`).
_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}
#: The hosts (for S3, the buckets) that have sent bytes to this process, or to the process
#: that forked it (a DataLoader worker inherits the training process's, which read the index).
#: Why: a name that resolved once is no typo; its saying "no such name" an hour into a run is
#: a resolver's passing fault (a DNS server restarting, a record being replaced), which must not
#: end a job of days, so it is retried like a refused connection.
_answered: set[str] = set()


def answered_hosts() -> frozenset[str]:
    """The hosts that have answered this process, for a worker it starts with spawn (which
    inherits nothing) to take on: :func:`take_answered_hosts`."""
    return frozenset(_answered)


def take_answered_hosts(hosts: frozenset[str]) -> None:
    """Count ``hosts`` as having answered this process (see :data:`_answered`)."""
    _answered.update(hosts)


def _host_named(url: str) -> str:
    """The host name ``url`` is read from, in words: an S3 URL's is its endpoint's."""
    if url.startswith(("http://", "https://")):
        return f"host name {urlsplit(url).hostname!r}"
    from .s3 import endpoint_and_identity  # (s3 reads through this module)

    endpoint = endpoint_and_identity()[0] if url.startswith("s3://") else None
    if endpoint:
        return f"the S3 endpoint's host name {urlsplit(endpoint).hostname!r} (AWS_ENDPOINT_URL)"
    return "the endpoint's host name"


class ReadAbandoned(Exception):
    """A read whose result nobody will take any more (its loop broke off, its epoch was left)
    gave up at a failure instead of retrying. Not a SourceError: the data is not at fault, so
    nothing counts it lost, and nobody sees it."""


class Flag(Protocol):
    """What says that reads are abandoned: a ``threading.Event``, or a ``multiprocessing`` one."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


#: Set by whoever started the reads of this context (see :func:`abandoned_when`).
_abandon: ContextVar[Flag | None] = ContextVar("abandon", default=None)
#: How often a back-off looks at what abandons its read, in seconds.
_LOOK_S = 0.05
#: The flag of every read of this process (see :func:`abandon_process_reads_when`).
_process_abandon: list[Flag] = []


class _Exiting:
    """Set as the interpreter begins to exit, before it waits for the threads of Python's thread
    pools (which take no new work from then on): a read retrying in one would hold the exit for
    as long as it retries. (A thread of the user's that goes on reading after the main thread
    returned meets :class:`ReadAbandoned` at its next failure then, as it meets Python's own
    refusal of new work for its thread pools.) A plain attribute, not an Event: a process forked
    while a thread held an Event's lock would hang when setting it at its own exit."""

    def __init__(self) -> None:
        self.value = False

    def is_set(self) -> bool:
        return self.value

    def set(self) -> None:
        self.value = True

    def wait(self, timeout: float | None = None) -> bool:
        time.sleep(timeout or 0.0)
        return self.value


_exiting = _Exiting()
#: Set by a hook of ``threading``'s, where one exists: the kind ``concurrent.futures`` joins its
#: threads in. Hooks run last registered first, hence the import before.
_at_threads_exit = getattr(threading, "_register_atexit", None)
if _at_threads_exit is not None:
    import concurrent.futures.thread  # noqa: F401 - registers its join of the pools' threads first

    _at_threads_exit(_exiting.set)


@contextmanager
def abandoned_when(flag: Flag) -> Iterator[None]:
    """Reads started inside (in this thread, and in threads that run with a copy of its context)
    give up at their next failure, or in the middle of their back-off, once ``flag`` is set.
    Why: a server that refuses every request would otherwise keep each read nobody wants
    retrying for minutes, holding the threads later reads need, and the interpreter's exit
    (which waits for a thread pool's threads)."""
    token = _abandon.set(flag)
    try:
        yield
    finally:
        _abandon.reset(token)


def abandon_process_reads_when(flag: Flag) -> None:
    """Every read of this process gives up, as under :func:`abandoned_when`, once ``flag`` is
    set. For a DataLoader worker, whose loader shuts it down: its main thread, waiting for a read
    that retries, would not see the shutdown until the read ended (PyTorch waits 5 s a worker)."""
    _process_abandon[:] = [flag]


def process_reads_abandoned() -> bool:
    """Whether this process's loader stopped it (see :func:`abandon_process_reads_when`): work
    under way (a transform's) may give up too."""
    return any(flag.is_set() for flag in _process_abandon)


def _abandon_flags() -> list[Flag]:
    own = _abandon.get()
    return [_exiting, *_process_abandon, own] if own is not None else [_exiting, *_process_abandon]


def _abandoned_during(pause: float, flags: list[Flag]) -> bool:
    """Wait ``pause`` seconds, or less: True as soon as one of ``flags`` is set."""
    deadline = time.monotonic() + pause
    while not any(flag.is_set() for flag in flags):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        flags[-1].wait(min(left, _LOOK_S))  # the thread's own flag, looking at the others now and then
    return True


class RetrySink(Protocol):
    """What a read reports its requests and retries to; called from reader threads, so it must
    be thread-safe."""

    def requested(self) -> None: ...

    def retried(self) -> None: ...


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. ``read_timeout``: seconds a read may go without receiving
    ``stall_bytes`` bytes before the connection counts as stalled (a silent server and one
    that trickles a byte at a time are both caught). ``attempts`` and ``deadline``: see
    :class:`RetryBudget`. Frozen and picklable: a dataset reads it from the environment once
    and hands it to its workers."""

    attempts: int = 8
    base_delay: float = 0.25
    max_delay: float = 15.0
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    stall_bytes: int = 64 << 10
    deadline: float = 120.0

    @classmethod
    def from_env(cls) -> "RetryPolicy":
        """Defaults, overridden by ``PIPELINE_RETRY_ATTEMPTS``, ``PIPELINE_RETRY_DELAY`` (the first
        back-off, seconds), ``PIPELINE_RETRY_DEADLINE``, ``PIPELINE_CONNECT_TIMEOUT`` and
        ``PIPELINE_READ_TIMEOUT``."""
        return cls(attempts=max(int(_setting("PIPELINE_RETRY_ATTEMPTS", cls.attempts, int)), 1),
                   base_delay=_setting("PIPELINE_RETRY_DELAY", cls.base_delay, float),
                   connect_timeout=_setting("PIPELINE_CONNECT_TIMEOUT", cls.connect_timeout, float, positive=True),
                   read_timeout=_setting("PIPELINE_READ_TIMEOUT", cls.read_timeout, float, positive=True),
                   deadline=_setting("PIPELINE_RETRY_DEADLINE", cls.deadline, float))

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based): exponential, jittered."""
        return min(self.max_delay, self.base_delay * 2**attempt) * random.uniform(0.5, 1.0)


def _setting(name: str, default: float, kind: Callable[[str], float], positive: bool = False) -> float:
    """The environment variable ``name`` as a number, else ``default``; one that is not a
    number (or, where ``positive``, not above 0: a timeout of 0 s, which urllib3 refuses at every
    request, naming no setting) is an error naming it."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or (positive and not 0 < value < math.inf):  # (NaN too; inf overflows the clients' timers)
        unit = "a whole number" if kind is int else ("a finite number of seconds above 0" if positive
                                                     else "a number of seconds")
        raise ValueError(f"{name}={text!r} is not {unit} (unset it for the default, {default:g})") from None
    return value


class RetryBudget:
    """What one read (or upload) may spend on failures, shared by everything it does: its first
    request, the reconnects after a refused request, the resumes after a cut. One budget, so
    that retries never nest (a retried request inside a resumed read would multiply the
    attempts).

    A run of failures with no byte arriving in between gets ``policy.attempts`` attempts in all,
    and no retry starts more than ``policy.deadline`` seconds after the run's first failure.
    Bytes arriving end the run: a long stream through a link that cuts now and then gets
    through as long as each attempt gets further, and a reader that paused between two reads
    (a training step) loses nothing for it."""

    def __init__(self, policy: RetryPolicy, url: str, stats: RetrySink | None = None) -> None:
        self.policy = policy
        self.url = url
        self.stats = stats
        self.failures = 0
        self._first_failure = 0.0
        self._host = _host(url)
        self._answered = False

    def progressed(self) -> None:
        """Bytes arrived: the next failure starts a new run (and the host has answered)."""
        self.failures = 0
        if not self._answered:
            _answered.add(self._host)
            self._answered = True

    def failed(self, exc: TransientError, what: str, resuming: bool = False) -> None:
        """Count the failed attempt ``exc``; then wait out the back-off before the next attempt
        (reported to ``stats`` and logged, once), or raise a SourceError, naming the URL, the
        byte offset and the last cause, when the budget is spent."""
        unknown = _unknown_host(exc)
        if unknown is not None:  # an S3 URL names a bucket: the host is its endpoint's
            named = _host_named(self.url)
            if self._host not in _answered:
                raise SourceError(self.url, exc.offset, f"{named} does not resolve: {unknown}") from None
            exc = TransientError(self.url, exc.offset, f"{named} does not resolve ({unknown}), though it answered "
                                                       f"earlier in this run")
        flags = _abandon_flags()
        if any(flag.is_set() for flag in flags):
            raise ReadAbandoned(self.url)
        now = time.monotonic()
        if self.failures == 0:
            self._first_failure = now
        self.failures += 1
        if self.failures >= self.policy.attempts:
            raise RetriesSpent(self.url, exc.offset,
                               f"{what} failed {self.failures} times, last: {exc.reason}") from None
        pause = self.policy.delay(self.failures - 1)
        spent = now - self._first_failure
        if spent + pause > self.policy.deadline:
            raise RetriesSpent(self.url, exc.offset, f"{what} failed {self.failures} times in {spent:.1f}s "
                               f"(retry deadline {self.policy.deadline:g}s), last: {exc.reason}") from None
        log.warning("%s %s of %s at byte %s in %.2fs (attempt %d/%d): %s", "resuming" if resuming else "retrying",
                    what, redact(self.url), exc.offset, pause, self.failures + 1, self.policy.attempts, exc.reason)
        if _abandoned_during(pause, flags):
            raise ReadAbandoned(self.url)
        if self.stats is not None:  # counted once it is sure to be made
            self.stats.retried()


def _unknown_host(exc: BaseException) -> str | None:
    """The resolver's words when ``exc`` was caused by a host name that does not exist, else
    None. The backends' errors (urllib3's, botocore's) wrap a ``socket.gaierror``: it is found
    among their causes and contexts."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, socket.gaierror) and cause.errno in _NO_SUCH_NAME:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__
    return None


def _host(url: str) -> str:
    """What a resolver is asked for ``url``'s reads: its host (for S3, its bucket), by scheme;
    ``""`` for a URL that does not parse (its request fails, with an error of its own)."""
    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.hostname}"
    except ValueError:
        return ""


def with_retries(action: Callable[[], T], url: str, policy: RetryPolicy, what: str) -> T:
    """Run ``action`` (an upload, a listing: a call that is all or nothing, unlike a read that
    resumes); on a TransientError wait and try again, within one :class:`RetryBudget`."""
    budget = RetryBudget(policy, url)
    while True:
        try:
            result = action()
        except TransientError as exc:
            budget.failed(exc, what)
            continue
        budget.progressed()
        return result
