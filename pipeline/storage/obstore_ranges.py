"""Ranged GETs of ``s3://`` and ``http(s)://`` objects through obstore (Rust's ``object_store``),
for those who turn it on (``PIPELINE_OBSTORE=workers``) and have it installed.

Why: a loader reads a shard as hundreds of ranged GETs of about half a megabyte, and a request
through a Python client costs the client CPU, most of it under the GIL; obstore does that work
in Rust with the GIL released, for about a third to a half of the CPU a request (the README and
``scripts/bench_remote.py`` have the figures). On a fast network that CPU is what caps a worker's
requests per second. Everything else (whole-object streams, uploads, listings) stays on boto3
and urllib3.

Why it is not the default: it is not the same client. S3 takes boto3's credentials, region and
endpoint (also an ``endpoint_url`` in a config file's profile) but not what only botocore reads
(``AWS_CA_BUNDLE``, the redirect to a bucket's own region: set ``AWS_REGION``); obstore hands
back a range whole, so a stall is caught by a limit on the whole request rather than on each
read (scaled to the range's size, see :func:`_time_limit`); and it is not fork-safe. Ranges
are taken only up to :data:`MAX_RANGE`; URLs and keys whose path obstore would rewrite (a query
string, ``//``, ``.``/``..`` segments, an encoded ``/``) go through the Python clients. obstore
makes one attempt per request (its own retries are off): every retry is ours, counted once
(:mod:`.retry`).

Fork safety: obstore's runtime does not survive a fork, and a forked child that calls it after
its parent did hangs for ever. A DataLoader forks its workers from the training process, so
``PIPELINE_OBSTORE=workers`` uses it in DataLoader workers only (:func:`use_in_this_worker`),
which fork nothing, and the training process keeps to the Python clients; ``=always`` uses it in
every process; ``=never`` (the default) in none. A process forked after its parent used obstore
through this module reads through the Python clients; code of your own that uses obstore in the
training process needs ``never``.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
from datetime import timedelta
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

from ..fork_safe import ForkSafeLock
from .errors import SourceError, TransientError
from .http_proxy import proxy_for
from .retry import RetryPolicy

MAX_RANGE = 4 << 20  # longer ranges stream through the Python clients, whose stall check runs per read
log = logging.getLogger("pipeline.storage")
_STATUS = re.compile(r"status code: (\d{3})")
_OTHER_RANGE = re.compile(r"Requested \d+\.\.\d+, got")
_stores: dict[tuple, Any] = {}
_lock = ForkSafeLock()
_runtime_pid: int | None = None  # the process that started obstore's runtime (inherited through fork)
_worker_pid: int | None = None  # the DataLoader worker that may use it under "workers"


def use_in_this_worker() -> None:
    """Let this process read ranges through obstore under ``PIPELINE_OBSTORE=workers``: called in a
    DataLoader worker, which forks nothing after."""
    global _worker_pid
    _worker_pid = os.getpid()


def enabled() -> bool:
    """Whether ranged reads go through obstore here (see the module's docstring): it must import
    (``always`` and ``workers`` make its absence an error), and this process must not have been
    forked from one that had used it."""
    choice = check_setting()
    pid = os.getpid()
    if choice == "never" or (choice == "workers" and _worker_pid != pid):
        return False
    if _runtime_pid not in (None, pid):
        _log_fallback()
        return False
    return True


def check_setting() -> str:
    """``PIPELINE_OBSTORE``'s value, checked (as a loader is made, and at each read): another
    value, or obstore asked for but not installed, is an error naming the variable."""
    choice = os.environ.get("PIPELINE_OBSTORE", "never").lower()
    if choice not in ("never", "workers", "always"):
        raise ValueError(f"PIPELINE_OBSTORE={choice!r} is not never, workers or always (unset it for the "
                         f"default, never)")
    if choice != "never":
        try:
            import obstore  # noqa: F401
        except ImportError:
            raise ValueError(f"PIPELINE_OBSTORE={choice}, but obstore is not installed: pip install "
                             f"'pipeline[obstore]' (or unset it)") from None
    return choice


def serves(start: int, stop: int | None) -> bool:
    """Whether obstore reads bytes ``[start, stop)`` here: a range of at most :data:`MAX_RANGE`,
    with obstore :func:`enabled` (the caller asks next whether it takes the path)."""
    return stop is not None and stop - start <= MAX_RANGE and enabled()


@functools.lru_cache(maxsize=1)
def _log_fallback() -> None:
    log.info("process %d was forked after obstore was used: it reads ranges through the Python clients", os.getpid())


def _store(key: tuple, make: Callable[[], Any]) -> Any:
    """The store ``make()`` builds, once per ``key`` in this process."""
    global _runtime_pid
    with _lock:
        _runtime_pid = os.getpid()
        if key not in _stores:
            _stores[key] = make()
        return _stores[key]


def _time_limit(policy: RetryPolicy, size: int) -> float:
    """Seconds a whole request of ``size`` bytes may take: as long as the Python clients allow a
    link that delivers ``stall_bytes`` every ``read_timeout`` (in powers of two, one store each),
    so that a slow link fails no more often here; a stalled one is caught later, by as much."""
    return policy.read_timeout * 2 ** max(math.ceil(math.log2(max(size, 1) / policy.stall_bytes)), 0)


def _client_options(policy: RetryPolicy, limit: float, http: bool) -> dict[str, Any]:
    return {"connect_timeout": timedelta(seconds=policy.connect_timeout), "timeout": timedelta(seconds=limit),
            "allow_http": http}


def _s3_store(bucket: str, policy: RetryPolicy, limit: float) -> Any:
    """An S3 store for ``bucket``: boto3's credentials (profiles, roles, the environment; asked
    again every few minutes, so that refreshed ones are taken), region (``AWS_REGION`` too, which
    boto3 leaves to the other AWS SDKs) and endpoint
    (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``), path-style addressing as
    :func:`.s3.client` uses."""
    from .s3 import endpoint_and_identity

    endpoint, identity = endpoint_and_identity()

    def make() -> Any:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
        from obstore.store import S3Store

        session = boto3.session.Session()
        region = session.region_name or os.environ.get("AWS_REGION") or "us-east-1"  # (boto3 reads AWS_DEFAULT_REGION)
        config: dict[str, Any] = {"region": region, "virtual_hosted_style_request": False}
        address = endpoint or _profile_endpoint(session)
        if address:
            config["endpoint"] = address
        return S3Store(bucket, config=config, retry_config={"max_retries": 0},
                       client_options=_client_options(policy, limit, bool(address and address.startswith("http://"))),
                       credential_provider=Boto3CredentialProvider(session, ttl=timedelta(minutes=5)))

    return _store(("s3", bucket, endpoint, identity, policy.connect_timeout, limit), make)


def _profile_endpoint(session: Any) -> str | None:
    """The endpoint botocore takes from the config file (a profile's ``endpoint_url``, which
    obstore does not read: its reads would go to AWS), unless it is AWS's own."""
    address = session.client("s3").meta.endpoint_url
    host = urlsplit(address).hostname or ""
    return None if host.endswith(("amazonaws.com", "amazonaws.com.cn")) else address


def plain_path(path: str) -> bool:
    """Whether obstore (or urllib3, for a presigned URL) sends ``path`` (an S3 key, a URL's
    path) as it is: no empty, ``.`` or ``..`` segment, no encoded ``/``."""
    return all(part not in ("", ".", "..") for part in path.split("/")) and "%2f" not in path.lower()


def takes_http(url: str) -> bool:
    """Whether obstore may read ``url``: no query string, fragment or credentials, which urllib3
    sends as they are and obstore would not, a :func:`plain_path`, and no proxy to go through
    (urllib3's pools go through the environment's: see :mod:`.http_proxy`)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # urllib3 says what is wrong with it
        return False
    return not (parts.query or parts.fragment or "@" in parts.netloc) and plain_path(parts.path.lstrip("/")) \
        and proxy_for(url) is None


def _http_store(origin: str, policy: RetryPolicy, limit: float) -> Any:
    def make() -> Any:
        from obstore.store import HTTPStore

        return HTTPStore.from_url(origin, retry_config={"max_retries": 0},
                                  client_options=_client_options(policy, limit, origin.startswith("http://")))

    return _store(("http", origin, policy.connect_timeout, limit), make)


class _Whole:
    """A range obstore has already received, read out as a stream's ``read1`` would."""

    def __init__(self, data: Any) -> None:
        self.view = memoryview(data)
        self.position = 0

    def read1(self, size: int) -> memoryview:
        piece = self.view[self.position:self.position + size]
        self.position += len(piece)
        return piece

    def close(self) -> None:
        self.view.release()


def open_s3_range(url: str, bucket: str, key: str, start: int, stop: int, policy: RetryPolicy) -> _Whole:
    """Bytes ``[start, stop)`` of ``s3://bucket/key`` (a :func:`plain_path`) in one GET (at most
    :data:`MAX_RANGE`); errors sorted by their S3 code (or HTTP status) as
    :func:`.s3.map_error` sorts boto3's."""
    from .s3 import body_error

    def sort(text: str, status: int | None) -> SourceError | None:
        return body_error(url, start, text, status)

    limit = _time_limit(policy, stop - start)
    return _get(url, lambda: _s3_store(bucket, policy, limit), key, start, stop, sort)


def open_http_range(url: str, start: int, stop: int, policy: RetryPolicy) -> _Whole:
    """Bytes ``[start, stop)`` of ``url`` (which :func:`takes_http`) in one GET; errors sorted by
    status as :func:`.http.status_error` sorts urllib3's."""
    from .http import status_error

    parts = urlsplit(url)

    def sort(text: str, status: int | None) -> SourceError | None:
        if "Range request not supported" in text:
            error = status_error(url, start, 200)
            return SourceError(url, start, f"{error.reason}; PIPELINE_OBSTORE=never reads it whole") \
                if start == 0 else error
        return None if status is None else status_error(url, start, status)

    limit = _time_limit(policy, stop - start)
    return _get(url, lambda: _http_store(f"{parts.scheme}://{parts.netloc}/", policy, limit),
                unquote(parts.path.lstrip("/")), start, stop, sort)


def _get(url: str, store: Callable[[], Any], path: str, start: int, stop: int,
         sort: Callable[[str, int | None], SourceError | None]) -> _Whole:
    """One ranged GET from ``store()``. A store that cannot be set up (credentials, a setting) is
    a permanent error; obstore's errors carry the status in their text, sorted by ``sort(text,
    status)``; bytes other than those asked for are permanent; the rest (cuts, timeouts) transient."""
    import obstore

    try:
        where = store()
    except Exception as exc:  # noqa: BLE001 - boto3's and obstore's set-up errors alike
        raise SourceError(url, start, f"obstore cannot read it ({type(exc).__name__}: {_first_line(exc)}); "
                          "PIPELINE_OBSTORE=never reads it through boto3 and urllib3") from None
    try:
        return _Whole(obstore.get_range(where, path, start=start, end=stop))
    except Exception as exc:  # noqa: BLE001 - obstore's exceptions are told apart by their text
        text = str(exc)
        status = _STATUS.search(text)
        error = sort(text, int(status.group(1)) if status else None)
        if error is not None:
            raise error from None
        if _OTHER_RANGE.search(text):
            raise SourceError(url, start, f"the server sent other bytes than asked for: {_first_line(exc)}") from None
        raise TransientError(url, start, f"{type(exc).__name__}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]
