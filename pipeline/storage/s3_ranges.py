"""Ranged GETs of ``s3://`` objects through obstore (Rust's ``object_store``), when it is installed.

Why: a loader reads a shard as hundreds of ranged GETs of about half a megabyte, and with boto3
each costs the client 2.6 ms of CPU (signing, botocore's parsing, reading the body in Python),
most of it under the GIL; through obstore, which does that work in Rust with the GIL released,
0.9 ms (5.6 against 3.1 ms at 4 MB; measured against an S3 server on 127.0.0.1, 8 threads). On a
fast network that CPU is what caps a worker's requests per second. Everything else (whole-object streams, uploads, listings, existence
checks) stays on boto3 (:mod:`.s3`), whose credential chain this module also uses, so that both
clients see the same identity, endpoint and region.

What differs from boto3's reads, and why it is safe: obstore hands back a range whole, so a
stall is caught by a time limit on the whole request (``PIPELINE_READ_TIMEOUT``) rather than on
each read; ranges are therefore taken here only up to :data:`MAX_RANGE` (a chunk), and longer
reads stream through boto3. obstore makes one attempt per request (its own retries are off):
every retry is ours, counted once, under one budget (:mod:`.retry`).

Where: obstore is not fork-safe. Its runtime's threads do not survive a fork, and a forked child
that calls it hangs for ever. A DataLoader forks its workers from the training process, which
reads the index and may read shards itself (0 workers, a validation loader); so by default
(``PIPELINE_S3_CLIENT=auto``) only DataLoader workers, which fork nothing, read through obstore
(:func:`use_in_this_worker`), and every other process through boto3. ``PIPELINE_S3_CLIENT=obstore``
uses it in every process, ``=boto3`` in none. Either way a process forked after its parent used
obstore reads through boto3.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
from typing import Any

from .errors import SourceError, TransientError
from .retry import RetryPolicy

MAX_RANGE = 16 << 20  # longer ranges stream through boto3, whose stall check runs per read
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
    """Let this process read S3 ranges through obstore under ``PIPELINE_S3_CLIENT=auto``: called
    in a DataLoader worker, which forks nothing after."""
    global _worker_pid
    _worker_pid = os.getpid()


def enabled() -> bool:
    """Whether ranged reads go through obstore here (see the module's docstring): it must import
    (``PIPELINE_S3_CLIENT=obstore`` makes its absence an error), and this process must not have
    been forked from one that had used it."""
    choice = os.environ.get("PIPELINE_S3_CLIENT", "auto").lower()
    if choice not in ("auto", "boto3", "obstore"):
        raise SourceError("s3://", None, f"PIPELINE_S3_CLIENT={choice!r}: use auto, boto3 or obstore")
    pid = os.getpid()
    if choice == "boto3" or (choice == "auto" and _worker_pid != pid):
        return False
    if _runtime_pid not in (None, pid):
        _log_fallback()
        return False
    try:
        import obstore  # noqa: F401
    except ImportError:
        if choice == "obstore":
            raise SourceError("s3://", None, "PIPELINE_S3_CLIENT=obstore, but obstore is not installed: "
                              "pip install 'pipeline[s3]'") from None
        return False
    return True


@functools.lru_cache(maxsize=1)
def _log_fallback() -> None:
    log.info("process %d was forked after obstore was used: it reads S3 ranges through boto3", os.getpid())


def _store(bucket: str, policy: RetryPolicy) -> Any:
    """An obstore S3 store for this process and bucket: boto3's credentials (profiles, roles,
    the environment), region and endpoint (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``),
    path-style addressing as :func:`.s3.client` uses, no retries of its own."""
    env = os.environ
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    identity = (env.get("AWS_PROFILE"), env.get("AWS_ACCESS_KEY_ID"), hash(env.get("AWS_SECRET_ACCESS_KEY")))
    key = (bucket, endpoint, identity, policy.connect_timeout, policy.read_timeout)
    global _runtime_pid
    with _lock:
        _runtime_pid = os.getpid()
        if key not in _stores:
            import boto3
            from obstore.auth.boto3 import Boto3CredentialProvider
            from obstore.store import S3Store

            session = boto3.session.Session()
            options = {"connect_timeout": f"{policy.connect_timeout}s", "timeout": f"{policy.read_timeout}s",
                       "allow_http": bool(endpoint and endpoint.startswith("http://"))}
            config: dict[str, Any] = {"region": session.region_name or "us-east-1",
                                      "virtual_hosted_style_request": False}
            if endpoint:
                config["endpoint"] = endpoint
            _stores[key] = S3Store(bucket, config=config, client_options=options, retry_config={"max_retries": 0},
                                   credential_provider=Boto3CredentialProvider(session))
        return _stores[key]


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


def open_range(url: str, bucket: str, key: str, start: int, stop: int, policy: RetryPolicy) -> _Whole:
    """Bytes ``[start, stop)`` of ``s3://bucket/key`` in one GET (at most :data:`MAX_RANGE`)."""
    import obstore

    try:
        return _Whole(obstore.get_range(_store(bucket, policy), key, start=start, end=stop))
    except Exception as exc:  # noqa: BLE001 - obstore's exceptions carry the status in their text
        raise map_error(url, start, exc) from None


def map_error(url: str, offset: int, exc: BaseException) -> SourceError:
    """obstore's exceptions to ours, by the S3 error code (or the HTTP status) in their text, as
    :func:`.s3.map_error` sorts boto3's."""
    from .s3 import described_error

    text = str(exc)
    code = _CODE.search(text)
    status = _STATUS.search(text)
    if code or status:
        return described_error(url, offset, code.group(1) if code else status.group(1),  # type: ignore[union-attr]
                               int(status.group(1)) if status else None)
    reason = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return TransientError(url, offset, f"{type(exc).__name__}: {reason[:200]}")
