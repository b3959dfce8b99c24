"""``http://`` and ``https://`` through urllib3: ranged GETs, status codes sorted into
permanent and transient failures.

A pooled connection must never go back to its pool with part of a response unread: urllib3
(2.x) hands it to the next request as it is, ``release_conn()`` whatever is left, and that
request then fails (http.client's ``ResponseNotReady``, or the old body read as a status line),
costing a retry that nothing was wrong with. So a response we do not use is read to its end
when short, else closed (:func:`discard`); a body read to its end goes back to the pool by
itself; a body given up early (closed by the stream) or broken (urllib3 closes it when a read
fails) takes its connection down with it.

Redirects (301, 302, 303, 307, 308: a CDN, a Hugging Face ``resolve`` URL) are followed here, up
to :data:`MAX_REDIRECTS`, and not by urllib3: its redirects come with its retries (``retries=False``
turns both off), and retries are :mod:`.retry`'s alone, so that each is counted and budgeted once.
A range asked again of the new location keeps its ``Range`` header.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import urllib3

from . import obstore_ranges
from .errors import CutShort, RedactingFilter, ServerSetupError, SourceError, TransientError, redact
from .http_proxy import pool_for
from .per_process import per_process
from .retry import RetryPolicy
from .streams import Response

_PERMANENT = {400: "bad request",
              401: "unauthorized (a server behind a password: give the user and password in the URL, as curl takes "
                   "them)",
              403: "forbidden", 404: "not found", 410: "gone",
              416: "range not satisfiable (the object is shorter than expected)"}
_DRAIN_BYTES = 64 << 10  # an unused body up to this size is read off, so its connection serves again
#: What OpenSSL says of a plain-HTTP answer to a TLS handshake (3.2 and later: RECORD_LAYER_FAILURE).
_NOT_TLS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE")
MAX_REDIRECTS = 5  # a chain longer than this is a loop, or a misconfigured server
for _name in ("urllib3.connectionpool", "urllib3.poolmanager"):  # they log request lines and redirects
    logging.getLogger(_name).addFilter(RedactingFilter())


#: One connection pool per process (a pool inherited through fork would share sockets).
_pool = per_process(lambda: urllib3.PoolManager(num_pools=16, maxsize=8))


def map_error(url: str, offset: int, exc: BaseException) -> SourceError:
    """urllib3's exceptions while reading a body: all are cuts or timeouts, worth retrying."""
    return TransientError(url, offset, f"{type(exc).__name__}: {exc}")


def discard(response: Any) -> None:
    """Let go of a response we will not read (an error status, a 200 where a 206 was wanted)
    without leaving its body on a pooled connection: a short one is read off, keeping the
    connection alive (a 503 storm should not cost a new connection per retry); a long or
    unknown one closes the connection (reading a whole object to throw it away costs more)."""
    remaining = response.length_remaining
    if remaining is not None and remaining <= _DRAIN_BYTES:
        response.drain_conn()  # a clean end hands the connection back to the pool; a failure closes it
    else:
        response.close()
    response.release_conn()


def delivers(status: int, start: int) -> bool:
    """Whether a response of ``status`` to a GET of the bytes from ``start`` holds them."""
    return status == 206 or (status == 200 and start == 0)  # the stream stops at ``stop`` itself


def request_range(pool: urllib3.PoolManager, url: str, start: int, stop: int | None, policy: RetryPolicy,
                  named: str) -> Any:
    """The response of ``pool`` to a GET of bytes ``[start, stop)`` of ``url``, whatever its
    status (a redirect too: see :func:`follow_redirects`); a request that cannot be sent raises,
    naming ``named`` (``url``, or what it stands for: a presigned URL's object)."""
    headers = _credentials(url)
    if start or stop is not None:
        headers["Range"] = f"bytes={start}-{'' if stop is None else stop - 1}"
    whole = start == 0 and stop is None  # a range is of the object's own bytes, not of a Content-Encoding's decoding
    try:
        return pool.request("GET", url, headers=headers, preload_content=False, decode_content=whole, redirect=False,
                            retries=False, timeout=urllib3.Timeout(connect=policy.connect_timeout,
                                                                   read=policy.read_timeout))
    except urllib3.exceptions.LocationValueError as exc:
        raise SourceError(named, start, f"not a valid URL: {exc}") from None
    except urllib3.exceptions.SSLError as exc:
        raise tls_error(named, start, exc) from None
    except urllib3.exceptions.HTTPError as exc:
        raise TransientError(named, start, f"{type(exc).__name__}: {exc}") from None


def _credentials(url: str) -> dict[str, str]:
    """The ``Authorization`` header of a user and password in ``url`` (``https://user:pw@host/``,
    as curl takes them; urllib3 leaves them out), else none. A redirect to another host drops
    them with the URL's netloc."""
    try:
        parts = urlsplit(url)
    except ValueError:  # urllib3 says what is wrong with it
        return {}
    if parts.username is None:
        return {}
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return {"Authorization": urllib3.util.make_headers(basic_auth=pair)["authorization"]}


def _keeping_credentials(target: str, source: str) -> str:
    """``target`` with the user and password of ``source`` where it is of the same origin and
    names none of its own (a ``Location`` with scheme and host, as nginx sends, names none), as
    curl keeps them; to another origin they are not sent."""
    to, of = urlsplit(target), urlsplit(source)
    try:
        same = (to.scheme, to.hostname, to.port) == (of.scheme, of.hostname, of.port)
    except ValueError:  # a port out of range: the request to it says so
        return target
    if to.username is not None or of.username is None or not same:
        return target
    return to._replace(netloc=f"{of.netloc.rpartition('@')[0]}@{to.netloc}").geturl()


def tls_error(url: str, start: int, exc: urllib3.exceptions.SSLError) -> SourceError:
    """A TLS handshake's failure: permanent where no retry can mend it (a certificate that
    cannot be verified, a server that does not speak TLS at that port), else transient (a
    connection cut during the handshake)."""
    cause = exc.args[0] if exc.args else exc
    if isinstance(cause, ssl.SSLCertVerificationError):
        return SourceError(url, start, f"its TLS certificate cannot be verified ({cause.verify_message}): point "
                           f"SSL_CERT_FILE (for S3: AWS_CA_BUNDLE) at the bundle of the authority that signed it")
    if isinstance(cause, ssl.SSLError) and cause.reason in _NOT_TLS:
        return SourceError(url, start, f"the server does not speak TLS at this port (SSL: {cause.reason}): "
                           f"give its URL with http://, not https://")
    return TransientError(url, start, f"SSLError: {cause}")


def open_range(url: str, start: int, stop: int | None, policy: RetryPolicy) -> Response:
    """A GET of bytes ``[start, stop)`` of ``url`` (``stop=None``: to the end), whose body the
    caller reads; a status that does not deliver them raises (see :func:`status_error`). A range
    of a chunk's size goes through obstore where it may (:mod:`.obstore_ranges`)."""
    if obstore_ranges.serves(start, stop) and obstore_ranges.takes_http(url):
        return obstore_ranges.open_http_range(url, start, stop, policy)
    response, where = follow_redirects(url, start, stop, policy)
    size = object_size(response.headers.get("Content-Range")) if response.status == 206 else \
        whole_size(response) if response.status == 200 else None
    if stop is not None and size is not None and size < stop:  # (else a cut, retried, then a 416)
        discard(response)
        raise CutShort(url, size, f"ends at byte {size}, expected data up to byte {stop}")
    if delivers(response.status, start):
        return response
    discard(response)
    error = status_error(url, start, response.status)
    if where == url:
        raise error
    # the status is the last location's: say which, or the URL given would look wrong
    raise type(error)(url, start, f"{error.reason} (redirected to {redact(where)})")


def whole_size(response: Response) -> int | None:
    """The object's size a 200 (the whole object) gives: its length, unless encoded (gzip). A
    server answers a range of an empty file so (nginx), which read as a connection cut."""
    length = response.headers.get("Content-Length")
    if response.headers.get("Content-Encoding", "identity") != "identity" or not (length or "").isdigit():
        return None
    return int(length)


def object_size(content_range: str | None) -> int | None:
    """The whole object's size a ``Content-Range: bytes 0-99/1234`` header gives (``None``
    where it gives none: ``*``, or no header)."""
    total = (content_range or "").rpartition("/")[2].strip()
    return int(total) if total.isascii() and total.isdigit() else None


def follow_redirects(url: str, start: int, stop: int | None, policy: RetryPolicy) -> tuple[Any, str]:
    """The first response to a GET of bytes ``[start, stop)`` of ``url`` that is not a redirect,
    and the URL that gave it. A folder's URL without its ``/`` that the server redirects to the
    folder raises, saying what to pass instead (a shard or an index in it)."""
    where = url
    for _ in range(MAX_REDIRECTS + 1):
        response = request_range(pool_for(where, _pool()), where, start, stop, policy, url)
        location = response.get_redirect_location()
        if not location:  # not a redirect (or one without a Location: an error status of its own)
            return response, where
        discard(response)
        target = _keeping_credentials(urljoin(where, location), where)
        if urlsplit(target).path == urlsplit(where).path + "/":
            raise SourceError(url, start, f"is a folder (the server redirects it to {redact(target)}): pass the "
                              f"URL of its index.json, or of the shards in it")
        where = target
    raise SourceError(url, start, f"more than {MAX_REDIRECTS} redirects (the last to {redact(where)}): a redirect "
                      f"loop? Pass the URL the data is at")


def status_error(url: str, start: int, status: int) -> SourceError:
    """The error of a status that does not deliver bytes from ``start``: permanent (see
    :data:`_PERMANENT`), or transient (429, 5xx)."""
    if status == 200:  # the server ignored Range: reading from 0 again would duplicate bytes
        return ServerSetupError(url, start, "the server does not honour Range requests (it sent the whole file): "
                                "serve the shards from one that does (nginx, S3 and most static hosts do), or "
                                "pass cache_dir= to read whole shards, downloaded once")
    if status in _PERMANENT:
        return SourceError(url, start, f"HTTP {status} {_PERMANENT[status]}")
    if status == 429 or status >= 500:
        return TransientError(url, start, f"HTTP {status}")
    return SourceError(url, start, f"unexpected HTTP {status}")

