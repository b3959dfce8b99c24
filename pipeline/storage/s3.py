"""``s3://bucket/key`` through boto3: the standard credential chain (``AWS_PROFILE``, the
environment, config files, instance roles), ``AWS_ENDPOINT_URL`` or an explicit endpoint for any
S3-compatible store, ranged GETs and uploads. Error codes are sorted into permanent and
transient failures."""

from __future__ import annotations

import os
import re
from typing import Any, Callable, TypeVar

from ..fork_safe import ForkSafeLock
from . import obstore_ranges, s3_presigned
from .errors import SourceError, TransientError, redact
from .retry import RetryPolicy, with_retries
from .streams import Response

T = TypeVar("T")

_TRANSIENT_CODES = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "RequestTimeTooSkewed",
                    "Throttling", "ThrottlingException", "500", "502", "503", "504"}
_CREDENTIALS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"  # where boto3 finds them
_DESCRIBED = {"NoSuchKey": "no such key", "NoSuchBucket": "no such bucket", "AccessDenied": "access denied",
              "InvalidAccessKeyId": "invalid access key (bad credentials)",
              "SignatureDoesNotMatch": "signature does not match (bad credentials)",
              "InvalidRange": "range not satisfiable (the object is shorter than expected)",
              "404": "not found",
              "403": f"forbidden (the credentials are wrong, or may not do this here: check {_CREDENTIALS}, and the "
                     f"bucket's permissions)"}
_CODE = re.compile(r"<Code>([^<]+)</Code>")
_clients: dict[tuple, Any] = {}
_lock = ForkSafeLock()


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``."""
    rest = url[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise SourceError(url, None, "an S3 URL needs a bucket: s3://bucket/key")
    return bucket, key


def endpoint_and_identity() -> tuple[str | None, tuple]:
    """The S3 endpoint the environment names (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``),
    and what of the identity it sets (profile, key, a hash of the secret): a client is made anew
    when either changes. A variable set empty (``export AWS_ENDPOINT_URL=``) names none, as
    boto3 reads it: passed on as ``endpoint_url=""``, botocore would refuse it as invalid; and
    ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`` names none, as it tells boto3."""
    env = os.environ
    identity = (env.get("AWS_PROFILE"), env.get("AWS_ACCESS_KEY_ID"), hash(env.get("AWS_SECRET_ACCESS_KEY")))
    if env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").strip().lower() == "true":  # (as botocore reads it)
        return None, identity
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None, identity


class ClientSetupError(ValueError):
    """No S3 client can be made from the environment's settings (an endpoint without its scheme,
    a profile that is not there, a region that is no region): no retry mends a setting, so reads
    fail at once, saying which."""


def _new_client(endpoint: str | None, config: Any) -> Any:
    """A boto3 S3 client; botocore's refusal of a setting as a :class:`ClientSetupError` naming it."""
    import boto3
    from botocore.exceptions import ConfigParseError, ProfileNotFound

    try:
        return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)
    except (ValueError, ProfileNotFound, ConfigParseError) as exc:  # "Invalid endpoint: localhost:9000", ...
        hint = _setting_hint(endpoint, isinstance(exc, ProfileNotFound))
        raise ClientSetupError(f"no S3 client can be made from these settings ({exc}){hint}") from None


def _setting_hint(endpoint: str | None, no_profile: bool) -> str:
    """What to change, where a setting of the environment is plainly what botocore refused."""
    if no_profile:
        name = "AWS_PROFILE" if "AWS_PROFILE" in os.environ else "AWS_DEFAULT_PROFILE"
        return (f": {name}={os.environ.get(name)!r} must name a profile of the AWS config or credentials files "
                f"(AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE), or be unset")
    if endpoint and "://" not in endpoint:
        setting = "AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
        return f": {setting}={redact(endpoint)!r} needs its scheme, as in http://{redact(endpoint)}"
    return ""


def client(policy: RetryPolicy) -> Any:
    """A boto3 S3 client for this process, endpoint from ``AWS_ENDPOINT_URL`` when set."""
    endpoint, identity = endpoint_and_identity()
    key = (os.getpid(), endpoint, identity, policy.connect_timeout, policy.read_timeout)
    with _lock:
        if key not in _clients:
            try:
                import boto3  # noqa: F401 - for the message below when it is missing
                from botocore.config import Config
            except ImportError:
                raise SourceError("s3://", None, "s3:// URLs need boto3: pip install 'pipeline[s3]'") from None
            # Every retry is ours (one budget per read, counted once), so botocore makes one attempt
            # per call. Its ``max_attempts`` counts retries *after* the first attempt (botocore's
            # args.py turns it into total_max_attempts = max_attempts + 1), so max_attempts=1 would
            # still retry each failed call once, unseen and uncounted; ``total_max_attempts`` counts
            # the first attempt too. Set here, it and the mode override AWS_MAX_ATTEMPTS,
            # AWS_RETRY_MODE and config files; in "standard" mode every retry condition is gated by
            # that count, and no retry quota or client-side rate limiting ("adaptive") comes in. What
            # botocore still re-sends by itself is no retry: a request redirected to another region.
            # SigV4 for presigned URLs too (boto3 would sign those with the old V2 by default).
            config = Config(connect_timeout=policy.connect_timeout, read_timeout=policy.read_timeout,
                            retries={"total_max_attempts": 1, "mode": "standard"}, s3={"addressing_style": "path"},
                            signature_version="s3v4")
            _clients[key] = _new_client(endpoint, config)
        return _clients[key]


def described_error(url: str, offset: int, code: str, status: int | None, message: str | None = None) -> SourceError:
    """An S3 error code (``NoSuchKey``, or the HTTP status where the body had none) as a
    permanent error that says what it means, or a transient one worth a retry."""
    if code in _TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429)):
        return TransientError(url, offset, f"S3 {code or status}")
    return SourceError(url, offset, f"S3 {code}: {_DESCRIBED.get(code, message or 'error')}")


def body_error(url: str, offset: int, text: str, status: int | None) -> SourceError | None:
    """The error an S3 error body (XML naming its ``<Code>``) and the HTTP status describe, as
    :func:`described_error` sorts it; ``None`` when neither says anything."""
    code = _CODE.search(text)
    if not code and not status:
        return None
    return described_error(url, offset, code.group(1) if code else str(status), status)


def map_error(url: str, offset: int, exc: BaseException) -> SourceError:
    """botocore's exceptions to ours: error codes decide permanent or transient."""
    from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return described_error(url, offset, str(error.get("Code", "")), status if isinstance(status, int) else None,
                               error.get("Message"))
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return SourceError(url, offset, f"no usable AWS credentials: {exc}; set {_CREDENTIALS}")
    if isinstance(exc, ClientSetupError):
        return SourceError(url, offset, str(exc))
    return TransientError(url, offset, f"{type(exc).__name__}: {exc}")


class _Body:
    """An S3 response body read as it arrives (``read1``), so that stalls are seen; one that
    ends before its ``length`` is a cut (botocore checks the length in its own ``read`` only:
    read past it, a connection closed early would read as the object's end, and a whole shard
    read to its end would come out short without a word)."""

    def __init__(self, body: Any, version: str | None = None, length: int | None = None) -> None:
        self.body = body
        self.raw = getattr(body, "_raw_stream", None)
        self.version = version  # the object's ETag
        self.length = length
        self.received = 0

    def read1(self, size: int) -> bytes:
        if self.raw is not None and hasattr(self.raw, "read1"):
            data = self.raw.read1(size)
        else:
            data = self.body.read(min(size, 64 << 10))
        self.received += len(data)
        if not data and size and self.length is not None and self.received < self.length:
            raise ConnectionError(f"the connection closed after {self.received} of the response's {self.length} bytes")
        return data

    def close(self) -> None:
        self.body.close()


def open_range(url: str, start: int, stop: int | None, policy: RetryPolicy) -> Response:
    """A GET of bytes ``[start, stop)`` (``stop=None``: to the end): through obstore for a
    range of a chunk's size where it may (:mod:`.obstore_ranges`), else to its presigned URL
    (:mod:`.s3_presigned`), and through boto3 where that does not take it or is refused."""
    bucket, key = split_url(url)
    if obstore_ranges.serves(start, stop) and obstore_ranges.plain_path(key):
        return obstore_ranges.open_s3_range(url, bucket, key, start, stop, policy)
    arguments: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if start or stop is not None:
        arguments["Range"] = f"bytes={start}-{'' if stop is None else stop - 1}"
    try:
        s3 = client(policy)
        presigned = s3_presigned.takes(s3, bucket, key)
        if presigned:
            response = s3_presigned.open_range(s3, url, bucket, key, start, stop, policy)
            if response is not None:
                return response
        answer = s3.get_object(**arguments)
        body = _Body(answer["Body"], answer.get("ETag"), answer.get("ContentLength"))
        if presigned:  # boto3 read what the presigned URL was refused
            s3_presigned.refused(s3, bucket)
        return body
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - sorted by map_error
        raise map_error(url, start, exc) from None


def _retried(url: str, policy: RetryPolicy, call: Callable[[], T], what: str = "request") -> T:
    """``call()`` with botocore's errors sorted by :func:`map_error` and the transient ones
    retried under one budget (botocore itself makes one attempt: see :func:`client`)."""

    def attempt() -> T:
        try:
            return call()
        except SourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - sorted by map_error
            raise map_error(url, 0, _underlying(exc)) from None

    return with_retries(attempt, url, policy, what)


def _underlying(exc: BaseException) -> BaseException:
    """The client's error behind boto3's S3UploadFailedError, which the transfer manager raises
    while handling it: that one says what happened (and whether it is worth a retry)."""
    from boto3.exceptions import S3UploadFailedError

    return exc.__context__ if isinstance(exc, S3UploadFailedError) and exc.__context__ is not None else exc


def upload_file(path: str, url: str, policy: RetryPolicy) -> None:
    """Upload a local file (multipart when large), retried on transient failures."""
    from boto3.s3.transfer import TransferConfig

    bucket, key = split_url(url)
    config = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20)
    _retried(url, policy, lambda: client(policy).upload_file(path, bucket, key, Config=config), "upload")


def put_bytes(url: str, data: bytes, policy: RetryPolicy) -> None:
    """Write a small object (an index) in one PUT, retried on transient failures."""
    bucket, key = split_url(url)
    _retried(url, policy, lambda: client(policy).put_object(Bucket=bucket, Key=key, Body=data), "upload")


def _error_code(exc: BaseException) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def exists(url: str, policy: RetryPolicy) -> bool:
    """Whether the object is there, retried on transient failures."""
    bucket, key = split_url(url)

    def head() -> bool:
        try:
            client(policy).head_object(Bucket=bucket, Key=key)
            return True
        except Exception as exc:  # noqa: BLE001 - a missing object is an answer; the rest, map_error's
            if _error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    return _retried(url, policy, head)


def delete(url: str, policy: RetryPolicy) -> None:
    """Delete the object, retried on transient failures."""
    bucket, key = split_url(url)
    _retried(url, policy, lambda: client(policy).delete_object(Bucket=bucket, Key=key))


def list_names(folder_url: str, prefix: str, policy: RetryPolicy) -> list[str]:
    """Names of the objects directly under ``folder_url`` (``s3://bucket/dir/``) starting with
    ``prefix``."""
    bucket, key = split_url(folder_url)

    def listing() -> list[str]:
        pages = client(policy).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key + prefix)
        return [item["Key"][len(key):] for page in pages for item in page.get("Contents", [])]

    return sorted(n for n in _retried(folder_url, policy, listing) if "/" not in n)
