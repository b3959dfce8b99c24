"""Ranged GETs of S3 objects as plain HTTP requests to presigned URLs, on a urllib3 pool.

Why: a loader reads a shard as hundreds of ranged GETs of about a megabyte. Through boto3 each
costs botocore's request machinery (its event hooks, the request signature, the response
parser): profiled here, botocore's call was half the GIL time of a worker streaming from S3,
about 11 ms of CPU a 1 MB range against 2.2 ms for the same range over plain HTTP. A presigned
URL is signed once per object (by the same boto3 client: its credentials, region, endpoint and
addressing style) and then read like any HTTP URL, with the same range resume, stall check and
retry budget (:mod:`.streams`, :mod:`.retry`).

What stays on boto3: every status that delivers no bytes and is not worth a retry (a 4xx, a
redirect). boto3 makes that request again and answers it as it always does (``NoSuchKey``, a
bad signature); where boto3 then reads the bytes (it followed the redirect to a bucket's own
region, say), that bucket stays on boto3 (:func:`refused`). 5xx and 429 are
retried here like boto3's own transient errors. Also on boto3: processes whose environment sets
a proxy (botocore honours it, this pool would not), and keys that urllib3 would rewrite (``.``
or ``..`` segments, ``//``, an encoded ``/``). ``PIPELINE_S3_PRESIGNED=0`` turns it off.

A URL is signed for :data:`VALID_SECONDS` and signed again after :data:`RESIGN_SECONDS`, which
also picks up refreshed credentials (botocore refreshes temporary ones well before they expire).
"""

from __future__ import annotations

import os
import time
import urllib.request
from typing import Any

import urllib3

from ..fork_safe import ForkSafeLock
from . import http, obstore_ranges
from .per_process import per_process
from .retry import RetryPolicy
from .streams import Response

VALID_SECONDS = 3600
RESIGN_SECONDS = 300
KEEP_SIGNED = 1024  # URLs kept; past that the stale ones go, then all (a worker reads a few shards at a time)
_signed: dict[tuple, tuple[str, float]] = {}  # (client, bucket, key) -> (URL, when signed)
_on_boto3: set[tuple[int, str]] = set()  # (client, bucket) answered by boto3 where the URL was refused
_lock = ForkSafeLock()


def _ca_bundle() -> str | None:
    """The CA bundle botocore verifies S3's TLS with (``AWS_CA_BUNDLE``, a config file's
    ``ca_bundle``), for the pool to verify with the same."""
    import botocore.session

    return botocore.session.get_session().get_config_variable("ca_bundle")


#: One pool per process, verifying TLS against botocore's CA bundle.
_pool = per_process(lambda: urllib3.PoolManager(num_pools=16, maxsize=8, ca_certs=_ca_bundle()))


def check_setting() -> bool:
    """Whether ``PIPELINE_S3_PRESIGNED`` lets ranges be read here (``1``, the default) or not
    (``0``); another value is an error naming it, rather than taken for either."""
    value = os.environ.get("PIPELINE_S3_PRESIGNED", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"PIPELINE_S3_PRESIGNED={value!r} is not 0 or 1 (unset it for the default, 1)")
    return value == "1"


def takes(client: Any, bucket: str, key: str) -> bool:
    """Whether a range of ``bucket/key`` is read here (see the module's docstring)."""
    if not check_setting() or urllib.request.getproxies():
        return False
    return (id(client), bucket) not in _on_boto3 and obstore_ranges.plain_path(key)


def _signed_url(client: Any, bucket: str, key: str) -> str:
    now = time.monotonic()
    with _lock:
        url, when = _signed.get((id(client), bucket, key), ("", -RESIGN_SECONDS))
    if now - when < RESIGN_SECONDS:
        return url
    url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=VALID_SECONDS)
    with _lock:
        if len(_signed) >= KEEP_SIGNED:
            for old in [name for name, (_, when) in _signed.items() if now - when >= RESIGN_SECONDS]:
                del _signed[old]
            if len(_signed) >= KEEP_SIGNED:
                _signed.clear()
        _signed[(id(client), bucket, key)] = (url, now)
    return url


def open_range(client: Any, url: str, bucket: str, key: str, start: int, stop: int | None,
               policy: RetryPolicy) -> Response | None:
    """A GET of bytes ``[start, stop)`` of ``bucket/key`` (``url``, which errors name) through
    its presigned URL; ``None`` when the answer is boto3's to give (a 4xx or a redirect)."""
    response = http.request_range(_pool(), _signed_url(client, bucket, key), start, stop, policy, url)
    if http.delivers(response.status, start):
        return response
    from .s3 import body_error

    status = response.status
    if status == 429 or status >= 500:
        text = response.read(64 << 10).decode(errors="replace")  # an S3 error body is short; the rest, discard's
        http.discard(response)
        raise body_error(url, start, text, status)  # type: ignore[misc]  # never None: a status is given
    http.discard(response)
    return None


def refused(client: Any, bucket: str) -> None:
    """Send the ranges of ``bucket`` to boto3 from now on: it read what a presigned URL was
    refused (a redirect to the bucket's own region, say)."""
    with _lock:
        _on_boto3.add((id(client), bucket))
