"""Credentials and signed URLs never reach logs (ours or the HTTP and S3 libraries' at DEBUG),
warnings, error messages, chained exceptions, the loader's state or its stats."""

from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path
from typing import Callable, Iterator

import pytest

import pipeline
from pipeline import SourceError, make_loader
from pipeline.storage import read_range
from tests.storage.servers import ACCESS_KEY, SECRET_KEY, FaultProxy, make_bucket, port_of, refused_port

SIGNATURE, CREDENTIAL, PASSWORD = "sig-6f1d2e9a", "cred-AKIA7QZX", "pw-c4a1b7e2"
SIGNED = f"?X-Amz-Signature={SIGNATURE}&X-Amz-Credential={CREDENTIAL}%2F20250101%2Fus-east-1&X-Amz-Expires=60"
WRONG_SECRET = "wrong-secret-e3b0c442"
SECRETS = (SIGNATURE, CREDENTIAL, PASSWORD, SECRET_KEY, WRONG_SECRET)

warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")


def with_secrets(base: str, path: str) -> str:
    """``base/path`` with a password in the URL and a signed query string."""
    return base.replace("://", f"://reader:{PASSWORD}@") + path + SIGNED


def chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the exceptions chained to it, as a traceback shows them (a context
    suppressed by ``raise ... from None`` is not shown)."""
    while exc is not None:
        yield exc
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)


class Leaks:
    """Everything a failure shows: log records at DEBUG (every logger), warnings, and the
    exceptions raised, with their chains and attributes."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        self.texts: list[str] = []

    def error(self, action: Callable[[], object], expected: type[BaseException] = SourceError) -> BaseException:
        """Run ``action``, which must fail with ``expected``; keep what it shows."""
        with pytest.raises(expected) as caught:
            action()
        for exc in chain(caught.value):
            self.texts += [str(exc), repr(exc), repr(vars(exc))]
        return caught.value

    def check(self) -> None:
        self.texts += [record.getMessage() for record in self.caplog.records]
        self.texts += [str(record.exc_info) for record in self.caplog.records if record.exc_info]
        shown = "\n".join(self.texts)
        assert shown and not [secret for secret in SECRETS if secret in shown], shown


@pytest.fixture
def leaks(caplog, recwarn, fast_retries, monkeypatch) -> Iterator[Leaks]:
    monkeypatch.setenv("PIPELINE_RETRY_ATTEMPTS", "3")
    caplog.set_level(logging.DEBUG)
    found = Leaks(caplog)
    yield found
    found.texts += [str(warning.message) for warning in recwarn]
    found.check()


def test_http_errors_retries_and_resumes_never_show_passwords_or_signatures(nginx: str, leaks: Leaks) -> None:
    error = leaks.error(lambda: read_range(with_secrets(nginx, "/data/nope.tar"), 0, 10))
    assert str(error).endswith("/data/nope.tar?<redacted> at byte 0: HTTP 404 not found")
    port = port_of(nginx)
    unavailable, cutting = FaultProxy(port, {}, fail_after=0), FaultProxy(port, {"cut": 1.0})
    with refused_port() as closed:
        refused_upstream = FaultProxy(closed, {})
        try:
            error = leaks.error(lambda: read_range(with_secrets(unavailable.url, "/data/part-000000.tar"), 0, 10))
            assert "request failed 3 times, last: HTTP 503" in str(error)
            assert read_range(with_secrets(cutting.url, "/data/part-000000.tar"), 0, 60_000)  # resumed after cuts
            error = leaks.error(lambda: read_range(with_secrets(refused_upstream.url, "/data/part-000000.tar"), 0, 10))
            assert "request failed 3 times" in str(error)
        finally:
            for proxy in (unavailable, cutting, refused_upstream):
                proxy.close()
        error = leaks.error(lambda: read_range(with_secrets(f"http://127.0.0.1:{closed}", "/x.tar"), 0, 10))
    assert "Connection refused" in str(error)
    logged = [record.getMessage() for record in leaks.caplog.records]
    assert any("retrying request" in line for line in logged) and any("resuming" in line for line in logged)


def test_urls_that_do_not_parse_are_errors_without_their_secrets(leaks: Leaks) -> None:
    for url in (f"http://reader:{PASSWORD}@[::1/x.tar{SIGNED}", f"http://reader:{PASSWORD}@host:port/x.tar{SIGNED}"):
        leaks.error(lambda: read_range(url, 0, 10))  # noqa: B023 - called at once


def test_a_pipe_command_fails_without_its_secret_headers_or_user(nginx: str, leaks: Leaks) -> None:
    """A ``pipe:curl`` with a token in a header, or a user and password, showed them in its error,
    and ``curl -v`` writes the headers it sends on standard error, whose end the error shows."""
    command = (f"pipe:curl -sfv -H 'Authorization: Bearer {SIGNATURE}' -H 'X-Api-Key: {CREDENTIAL}' "
               f"-u reader:{PASSWORD} {nginx}/data/nope.tar")
    error = leaks.error(lambda: pipeline.storage.open_stream(command).read())
    assert "Authorization: <redacted>" in str(error) and "-u <redacted>" in str(error), str(error)
    assert "command exited with status 22" in str(error)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_over_signed_shard_urls_keeps_them_out_of_errors_logs_and_state(
        nginx: str, web_root: Path, tmp_path: Path, leaks: Leaks, workers: int) -> None:
    (web_root / "signed").mkdir(exist_ok=True)
    (web_root / "signed" / "corrupt.tar").write_bytes(b"not a tar file" * 100)
    good = [with_secrets(nginx, f"/data/part-00000{i}.tar") for i in range(2)]
    for bad in ("/signed/corrupt.tar", "/signed/missing.tar"):
        with pytest.warns(UserWarning, match="is not used: shards without an index are streamed") as warned:
            loader = make_loader(good + [with_secrets(nginx, bad)], num_workers=workers, batch_size=64,
                                 cache_dir=tmp_path / "cache")
        leaks.error(lambda: [batch for batch in loader], Exception)  # noqa: B023 - called at once
        leaks.texts += [repr(loader.state_dict()), repr(loader.stats())] + [str(w.message) for w in warned]
    assert not (tmp_path / "cache").exists()  # (shards without an index are not cached: no folder is made)


def test_skipped_shards_are_logged_without_the_password_of_their_url(
        nginx: str, web_root: Path, leaks: Leaks) -> None:
    holes = web_root / "holes"
    if not holes.exists():
        shutil.copytree(web_root / "data", holes)
        (holes / "part-000002.tar").unlink()
    loader = make_loader(with_secrets(nginx, "/holes/").removesuffix(SIGNED), num_workers=0, batch_size=64,
                         on_error="skip")  # log records of worker processes would stay in the workers
    assert sum(len(batch["i"]) for batch in loader) == pipeline.load_index(holes).samples
    assert loader.stats()["skipped_pieces"] > 0
    assert any("skipping" in record.getMessage() for record in leaks.caplog.records)
    leaks.texts += [repr(loader.state_dict()), repr(loader.stats())]


def test_presigned_s3_urls_read_over_http_and_fail_without_their_signature(
        s3_env: str, web_root: Path, leaks: Leaks) -> None:
    import boto3
    from botocore.config import Config

    make_bucket("secrets")
    boto3.client("s3").upload_file(str(web_root / "data" / "part-000000.tar"), "secrets", "part-000000.tar")
    with leaks.caplog.at_level(logging.WARNING):  # the S3 library logs what it signs at DEBUG
        signed = boto3.client("s3", config=Config(signature_version="s3v4")).generate_presigned_url(
            "get_object", Params={"Bucket": "secrets", "Key": "part-000000.tar"}, ExpiresIn=600)
    signature = signed.rsplit("X-Amz-Signature=", 1)[1].split("&")[0]
    local = (web_root / "data" / "part-000000.tar").read_bytes()
    assert read_range(signed, 100, 5000) == local[100:5000]
    tampered = signed.replace(signature, signature[::-1])
    error = leaks.error(lambda: read_range(tampered, 0, 10))
    assert "HTTP 403 forbidden" in str(error)
    leaks.texts.append(signature)  # must be the only place it shows
    shown = "\n".join(record.getMessage() for record in leaks.caplog.records)
    assert signature not in shown and signature[::-1] not in shown


def test_s3_errors_never_show_the_secret_key(s3_env: str, web_root: Path, leaks: Leaks, monkeypatch) -> None:
    import boto3

    make_bucket("secrets")
    boto3.client("s3").upload_file(str(web_root / "data" / "part-000000.tar"), "secrets", "part-000000.tar")
    assert read_range("s3://secrets/part-000000.tar", 0, 10)
    leaks.error(lambda: read_range("s3://secrets/nope.tar", 0, 10))
    leaks.error(lambda: read_range("s3://no-such-bucket-here/x.tar", 0, 10))
    loader = make_loader(["s3://secrets/part-000000.tar"], num_workers=2, batch_size=64)  # reads a record now
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", WRONG_SECRET)
    error = leaks.error(lambda: read_range("s3://secrets/part-000000.tar", 0, 10))
    assert "SignatureDoesNotMatch" in str(error)
    leaks.error(lambda: [batch for batch in loader])
    leaks.error(lambda: make_loader(["s3://secrets/part-000000.tar"], num_workers=0))  # its first record read
    leaks.texts += [repr(loader.state_dict()), repr(loader.stats())]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "not-" + ACCESS_KEY)
    error = leaks.error(lambda: read_range("s3://secrets/part-000000.tar", 0, 10))
    assert "InvalidAccessKeyId" in str(error)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    with refused_port() as closed:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://reader:{PASSWORD}@127.0.0.1:{closed}")
        error = leaks.error(lambda: read_range("s3://secrets/part-000000.tar", 0, 10))
    assert "failed 3 times" in str(error)
