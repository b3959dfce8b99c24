"""Ranged GETs of ``s3://`` and ``http(s)://`` objects through obstore (Rust's ``object_store``),
when it is installed.

Why: a loader reads a shard as hundreds of ranged GETs of about half a megabyte, and a request
through a Python client costs the client CPU, most of it under the GIL: 2.6 ms for 512 KB through
boto3 (signing, botocore's parsing, reading the body), 0.9 ms through urllib3, with 8 threads.
obstore does that work in Rust with the GIL released: 0.9 ms for S3, 0.3-0.4 ms for HTTP
(measured against SeaweedFS and nginx on 127.0.0.1; ``scripts/bench_remote.py``). On a fast
network that CPU is what caps a worker's requests per second. Everything else (whole-object
streams, uploads, listings) stays on boto3 and urllib3; S3 takes boto3's credential chain,
endpoint and region, so both clients see the same identity.

What differs, and why it is safe: obstore hands back a range whole, so a stall is caught by a
time limit on the whole request (``PIPELINE_READ_TIMEOUT``) rather than on each read; ranges are
therefore taken only up to :data:`MAX_RANGE` (a chunk), and longer reads stream through the
Python clients. obstore makes one attempt per request (its own retries are off): every retry is
ours, counted once, under one budget (:mod:`.retry`). An HTTP URL with a query string, a
fragment or credentials in it goes through urllib3, which sends it as it is.

Where: obstore is not fork-safe. Its runtime's threads do not survive a fork, and a forked child
that calls it hangs for ever. A DataLoader forks its workers from the training process, which
reads the index and may read shards itself (0 workers, a validation loader); so by default
(``PIPELINE_OBSTORE=auto``) only DataLoader workers, which fork nothing, read through obstore
(:func:`use_in_this_worker`), and every other process through the Python clients.
``PIPELINE_OBSTORE=always`` uses it in every process, ``=never`` in none. Either way a process
forked after its parent used obstore reads through the Python clients.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

from .errors import SourceError, TransientError
from .retry import RetryPolicy

MAX_RANGE = 16 << 20  # longer ranges stream through the Python clients, whose stall check runs per read
log = logging.getLogger("pipeline.storage")
_CODE = re.compile(r"<Code>([^<]+)</Code>")
_STATUS = re.compile(r"status code: (\d{3})")
_stores: dict[tuple, Any] = {}
_lock = threading.Lock()
_runtime_pid: int | None = None  # the process that started obstore's runtime (inherited through fork)
_worker_pid: int | None = None  # the DataLoader worker that may use it under "auto"


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)  # a fork copies the lock as it stands: held, by a reader thread


def use_in_this_worker() -> None:
    """Let this process read ranges through obstore under ``PIPELINE_OBSTORE=auto``: called in a
    DataLoader worker, which forks nothing after."""
    global _worker_pid
    _worker_pid = os.getpid()


def enabled() -> bool:
    """Whether ranged reads go through obstore here (see the module's docstring): it must import
    (``PIPELINE_OBSTORE=always`` makes its absence an error), and this process must not have been
    forked from one that had used it."""
    choice = os.environ.get("PIPELINE_OBSTORE", "auto").lower()
    if choice not in ("auto", "always", "never"):
        raise SourceError("PIPELINE_OBSTORE", None, f"{choice!r} is not auto, always or never")
    pid = os.getpid()
    if choice == "never" or (choice == "auto" and _worker_pid != pid):
        return False
    if _runtime_pid not in (None, pid):
        _log_fallback()
        return False
    try:
        import obstore  # noqa: F401
    except ImportError:
        if choice == "always":
            raise SourceError("PIPELINE_OBSTORE", None, "always, but obstore is not installed: "
                              "pip install 'pipeline[obstore]'") from None
        return False
    return True


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


def _client_options(policy: RetryPolicy, http: bool) -> dict[str, Any]:
    return {"connect_timeout": f"{policy.connect_timeout}s", "timeout": f"{policy.read_timeout}s", "allow_http": http}


def _s3_store(bucket: str, policy: RetryPolicy) -> Any:
    """An S3 store for ``bucket``: boto3's credentials (profiles, roles, the environment), region
    and endpoint (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``), path-style addressing as
    :func:`.s3.client` uses."""
    env = os.environ
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")

    def make() -> Any:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
        from obstore.store import S3Store

        session = boto3.session.Session()
        config: dict[str, Any] = {"region": session.region_name or "us-east-1", "virtual_hosted_style_request": False}
        if endpoint:
            config["endpoint"] = endpoint
        return S3Store(bucket, config=config, retry_config={"max_retries": 0},
                       client_options=_client_options(policy, bool(endpoint and endpoint.startswith("http://"))),
                       credential_provider=Boto3CredentialProvider(session))

    identity = (env.get("AWS_PROFILE"), env.get("AWS_ACCESS_KEY_ID"), hash(env.get("AWS_SECRET_ACCESS_KEY")))
    return _store(("s3", bucket, endpoint, identity, policy.connect_timeout, policy.read_timeout), make)


def takes_http(url: str) -> bool:
    """Whether obstore may read ``url``: no query string, fragment or credentials, which urllib3
    sends as they are and obstore's paths would not."""
    try:
        parts = urlsplit(url)
    except ValueError:  # urllib3 says what is wrong with it
        return False
    return not (parts.query or parts.fragment or "@" in parts.netloc)


def _http_store(origin: str, policy: RetryPolicy) -> Any:
    def make() -> Any:
        from obstore.store import HTTPStore

        return HTTPStore.from_url(origin, retry_config={"max_retries": 0},
                                  client_options=_client_options(policy, origin.startswith("http://")))

    return _store(("http", origin, policy.connect_timeout, policy.read_timeout), make)


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
    """Bytes ``[start, stop)`` of ``s3://bucket/key`` in one GET (at most :data:`MAX_RANGE`); errors
    sorted by their S3 code (or HTTP status) as :func:`.s3.map_error` sorts boto3's."""
    from .s3 import described_error

    def sort(text: str, status: int | None) -> SourceError | None:
        code = _CODE.search(text)
        return described_error(url, start, code.group(1) if code else str(status), status) \
            if code or status else None

    return _get(url, _s3_store(bucket, policy), key, start, stop, sort)


def open_http_range(url: str, start: int, stop: int, policy: RetryPolicy) -> _Whole:
    """Bytes ``[start, stop)`` of ``url`` (which :func:`takes_http`) in one GET; errors sorted by
    status as :func:`.http.status_error` sorts urllib3's."""
    from .http import status_error

    parts = urlsplit(url)

    def sort(text: str, status: int | None) -> SourceError | None:
        if "Range request not supported" in text:
            return status_error(url, start, 200)
        return None if status is None else status_error(url, start, status)

    return _get(url, _http_store(f"{parts.scheme}://{parts.netloc}/", policy), unquote(parts.path.lstrip("/")),
                start, stop, sort)


def _get(url: str, store: Any, path: str, start: int, stop: int,
         sort: Callable[[str, int | None], SourceError | None]) -> _Whole:
    """One ranged GET; obstore's exceptions (which carry the status in their text) sorted by
    ``sort(text, status)``, and the rest (cuts, timeouts) transient."""
    import obstore

    try:
        return _Whole(obstore.get_range(store, path, start=start, end=stop))
    except Exception as exc:  # noqa: BLE001 - obstore's exceptions are told apart by their text
        text = str(exc)
        status = _STATUS.search(text)
        error = sort(text, int(status.group(1)) if status else None)
        if error is not None:
            raise error from None
        reason = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        raise TransientError(url, start, f"{type(exc).__name__}: {reason[:200]}") from None
