"""Errors of reading and writing bytes by URL: each names the URL, the byte offset and the cause."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from ..format.errors import LocatedError


def redact(url: str) -> str:
    """The URL without its query string or user info, which may hold signatures or secrets:
    what goes into logs and error messages."""
    if "://" not in url or url.startswith("pipe:"):
        return url
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "<redacted>" if parts.query else "", ""))


class SourceError(LocatedError, OSError):
    """Bytes cannot be read from (or written to) a URL. Permanent: retrying will not help.
    The URL in the message is redacted (no query string, no user info)."""

    display = staticmethod(redact)


class TransientError(SourceError):
    """A failure worth retrying: a dropped connection, a timeout, a stall, HTTP 5xx, S3 SlowDown."""
