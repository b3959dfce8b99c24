"""Bytes by URL: local files, HTTP(S), S3, ``pipe:`` and fsspec schemes, with retries."""

from .errors import SourceError, TransientError, redact
from .opener import is_remote, join, open_stream, parent, read_bytes, read_range, scheme
from .retry import RetryPolicy

__all__ = ["RetryPolicy", "SourceError", "TransientError", "is_remote", "join", "open_stream", "parent",
           "read_bytes", "read_range", "redact", "scheme"]
