"""Exceptions of the shard format: each one names where the problem is.

Readers and writers raise these, never bare ``ValueError``/``KeyError``, so that a user
who sees one knows which file, shard, record or byte offset to look at.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
#: a request target's query, as in ``"GET /x.tar?X-Amz-Signature=... HTTP/1.1"``
_TARGET_QUERY = re.compile(r"(?<![\w:/])(/[^\s?'\"<>]*)\?[^\s'\"<>]+")
#: the value of a header that carries a secret (``-H 'Authorization: Bearer ...'`` in a ``pipe:``
#: command, ``> Authorization: ...`` in the standard error of ``curl -v``)
_SECRET_HEADER = re.compile(r"(?i)\b(authorization|proxy-authorization|cookie|x-[\w-]*(?:token|key|secret)[\w-]*)"
                            r"(\s*:\s*)[^'\"\r\n]+")
#: a command's user and password (``curl -u user:pass``)
_USER_OPTION = re.compile(r"(\s(?:-u|--user)[\s=]+)\S+")


def redact(url: str) -> str:
    """The URL without its query string or user info, which may hold signatures or secrets:
    what goes into logs and error messages. Never fails, even on a URL that does not parse."""
    if url.startswith("pipe:"):
        return redact_text(_USER_OPTION.sub(r"\1<redacted>", url))  # a command: its URLs, secret headers, user
    if "://" not in url:
        return url
    if url.startswith("s3://"):  # ('?' and '#' are characters of a key: only a user's part is hidden)
        scheme, _, rest = url.partition("://")
        bucket, slash, key = rest.partition("/")
        return f"{scheme}://{bucket.rpartition('@')[2]}{slash}{key}"
    try:
        parts = urlsplit(url)
    except ValueError:  # a bad IPv6 address, say: show no more than the scheme
        return url.split("://", 1)[0] + "://<redacted>"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "<redacted>" if parts.query else "", ""))


def redact_text(text: str) -> str:
    """``text`` (another library's message, say) with every URL in it redacted, the query of
    every request target (``/path?query``), and the values of headers that carry secrets."""
    text = _TARGET_QUERY.sub(r"\1?<redacted>", _URL.sub(lambda match: redact(match.group()), text))
    return _SECRET_HEADER.sub(r"\1\2<redacted>", text)


def explain(exc: BaseException) -> str:
    """Another library's exception in one line, for a message of ours: its type (with its module
    unless built in: ``struct.error``) and its message's first line, when it has one."""
    kind = type(exc)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = str(exc).strip()
    return f"{name}: {text.splitlines()[0]}" if text else name


class FormatError(Exception):
    """Base class of every error the shard format raises."""


class SampleError(FormatError, ValueError):
    """A sample cannot be encoded (unsupported type, bad field name) or decoded."""


class InputChanged(SampleError):
    """An input file changed while a build read it: the shards it finished hold rows of the old
    version, which a resume would keep, so the build starts again (``--overwrite``)."""


def unloadable(path: object, loader: str, detail: str, advice: str | None = None) -> SampleError:
    """The error for a file another library could not load (a build's input): its name, the
    library and its reason, and what to do (``advice``, where the reason tells more)."""
    advice = advice or ("if the file is truncated or damaged, save it again, then build again with --resume "
                        "(resume=True), which keeps the shards already written")
    return SampleError(f"{path}: cannot load with {loader} ({detail}); {advice}")


class LocatedError(FormatError):
    """An error at a place: a URL, the byte offset when known, and the reason.

    URLs may carry a password or a presigned URL's signature: the URL is kept and shown
    redacted (:func:`redact`), and so are URLs quoted in the reason.
    Built from its message alone (``LocatedError(message)``), as a DataLoader does when it
    re-raises a worker's exception in the main process, it keeps that message.
    """

    def __init__(self, url: str, offset: int | None = None, reason: str | None = None) -> None:
        self.offset = offset
        if reason is None:  # the message, redacted when it was made
            self.url, self.reason = url, None
            super().__init__(url)
            return
        self.url, self.reason = redact(url), redact_text(reason)
        super().__init__(f"{self.url}: {self.reason}" if offset is None else f"{self.url} at byte {offset}: {self.reason}")


class ShardError(LocatedError):
    """A shard is malformed: bad tar header, truncated member, undecodable record."""


class IndexFormatError(FormatError):
    """An index file is missing, unreadable, of an unknown version, or inconsistent."""


class IndexSchemaError(LocatedError, IndexFormatError):
    """A record as it was written (its checksum is the shard table's) that is not what the
    index's schema says: ``index.json`` was edited, or comes from another build. Its shards are
    sound, so it is no shard's damage: reading on, or skipping, would find every record wrong."""
