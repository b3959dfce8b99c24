"""``http://`` and ``https://`` through urllib3: ranged GETs, status codes sorted into
permanent and transient failures."""

from __future__ import annotations

import logging
import os
from typing import Any

import urllib3

from .errors import RedactingFilter, SourceError, TransientError
from .retry import RetryPolicy
from .streams import Response

_PERMANENT = {400: "bad request", 401: "unauthorized", 403: "forbidden", 404: "not found", 410: "gone",
              416: "range not satisfiable (the object is shorter than expected)"}
_pools: dict[int, urllib3.PoolManager] = {}
for _name in ("urllib3.connectionpool", "urllib3.poolmanager"):  # they log request lines and redirects
    logging.getLogger(_name).addFilter(RedactingFilter())


def _pool() -> urllib3.PoolManager:
    """One connection pool per process (a pool inherited through fork would share sockets)."""
    pid = os.getpid()
    if pid not in _pools:
        _pools.clear()
        _pools[pid] = urllib3.PoolManager(num_pools=16, maxsize=8)
    return _pools[pid]


def map_error(url: str, offset: int, exc: BaseException) -> SourceError:
    """urllib3's exceptions while reading a body: all are cuts or timeouts, worth retrying."""
    return TransientError(url, offset, f"{type(exc).__name__}: {exc}")


def open_range(url: str, start: int, stop: int | None, policy: RetryPolicy) -> Response:
    headers = {}
    if start or stop is not None:
        headers["Range"] = f"bytes={start}-{'' if stop is None else stop - 1}"
    try:
        response: Any = _pool().request(
            "GET", url, headers=headers, preload_content=False, redirect=True, retries=False,
            timeout=urllib3.Timeout(connect=policy.connect_timeout, read=policy.read_timeout))
    except urllib3.exceptions.LocationValueError as exc:
        raise SourceError(url, start, f"not a valid URL: {exc}") from None
    except urllib3.exceptions.HTTPError as exc:
        raise TransientError(url, start, f"{type(exc).__name__}: {exc}") from None
    status = response.status
    if status == 206 or (status == 200 and start == 0):  # the stream stops at ``stop`` itself
        return response
    response.release_conn()
    if status == 200:  # the server ignored Range: reading from 0 again would duplicate bytes
        raise SourceError(url, start, "the server does not honour Range requests")
    if status in _PERMANENT:
        raise SourceError(url, start, f"HTTP {status} {_PERMANENT[status]}")
    if status == 429 or status >= 500:
        raise TransientError(url, start, f"HTTP {status}")
    raise SourceError(url, start, f"unexpected HTTP {status}")

