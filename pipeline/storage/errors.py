"""Errors of reading and writing bytes by URL: each names the URL, the byte offset and the cause.

URLs may carry secrets (a password before ``@``, a signature in a presigned URL's query), so
what we show of them is redacted: in error messages (every :class:`LocatedError` redacts its
URL and the URLs quoted in its reason) and in the log records of the HTTP library, which logs
every request line.
"""

from __future__ import annotations

import logging

from ..format.errors import LocatedError, redact, redact_text

__all__ = ["CutShort", "RedactingFilter", "ServerSetupError", "SourceError", "TransientError", "redact", "redact_text"]


class RedactingFilter(logging.Filter):
    """Redacts the URLs in a logger's records (for libraries that log whole request URLs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


class SourceError(LocatedError, OSError):
    """Bytes cannot be read from (or written to) a URL. Permanent: retrying will not help."""


class CutShort(SourceError):
    """An object that ends before the bytes asked of it: its ``offset`` is where it ends."""


class TransientError(SourceError):
    """A failure worth retrying: a dropped connection, a timeout, a stall, HTTP 5xx, S3 SlowDown."""


class RetriesSpent(SourceError):
    """A read that failed attempt after attempt until its retries were spent: the storage did not
    answer, or answered only errors worth a retry (5xx, cuts, stalls). One such read may be bad
    luck; reads of several shards in a row failing so are a lost server, not damaged pieces."""


class ServerSetupError(SourceError):
    """The server cannot serve a loader's reads at all (it ignores Range): a matter of its setup,
    not of one damaged piece, so it is raised even under ``on_error="skip"``, which would
    otherwise train on stand-ins for nearly every sample."""
