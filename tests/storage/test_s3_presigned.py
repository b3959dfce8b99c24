"""S3 ranges as plain HTTP GETs of presigned URLs (SeaweedFS on 127.0.0.1, behind a proxy that
sees every request): which requests go that way, which go to boto3, and that the bytes and the
errors are the same either way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline import SourceError, make_loader
from pipeline.storage import read_range
from tests.storage.conftest import upload_folder
from tests.storage.servers import FaultProxy, make_bucket, port_of

SHARD = "part-000001.tar"


@pytest.fixture
def proxied(s3_env: str, web_root: Path, monkeypatch):
    """A bucket, and the proxy that boto3 (and the presigned URLs it signs) now goes through."""
    make_bucket("signed")
    upload_folder(web_root / "data", "signed", "train")
    proxies = []

    def start(**options) -> FaultProxy:
        proxy = FaultProxy(port_of(s3_env), {}, **options)
        proxies.append(proxy)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        return proxy
    yield start
    for proxy in proxies:
        proxy.close()


def presigned(head: bytes) -> bool:
    return b"X-Amz-Signature=" in head.split(b"\r\n", 1)[0] and b"\r\nauthorization:" not in head.lower()


def test_ranges_go_to_urls_signed_once_per_object(proxied, web_root: Path) -> None:
    proxy = proxied()
    local = {name: (web_root / "data" / name).read_bytes() for name in ("part-000000.tar", SHARD)}
    for start in (0, 700, 5_000, 40_000):
        for name, data in local.items():
            assert read_range(f"s3://signed/train/{name}", start, start + 3_000) == data[start:start + 3_000]
    gets = [head for head in proxy.heads if head.startswith(b"GET /signed/train/part-")]
    assert len(gets) == 8 and all(presigned(head) for head in gets)
    assert all(re.search(rb"\r\nrange: bytes=\d+-\d+", head.lower()) for head in gets)
    signatures = {re.search(rb"GET (\S+?)\?.*X-Amz-Signature=(\w+)", head).groups() for head in gets}
    assert len(signatures) == 2  # one URL each object, reused for all its ranges


@pytest.mark.parametrize("setting", ["off", "proxy"])
def test_boto3_reads_when_turned_off_or_behind_a_proxy(proxied, web_root: Path, monkeypatch, setting: str) -> None:
    if setting == "off":
        monkeypatch.setenv("PIPELINE_S3_PRESIGNED", "0")
    else:  # botocore would send through the proxy the environment names; the presigned pool would not
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    proxy = proxied()
    local = (web_root / "data" / SHARD).read_bytes()
    assert read_range(f"s3://signed/train/{SHARD}", 100, 9_000) == local[100:9_000]
    gets = [head for head in proxy.heads if head.startswith(b"GET /signed/")]
    assert gets and not any(presigned(head) for head in gets)


def test_a_bucket_that_refuses_presigned_urls_is_read_by_boto3_from_then_on(proxied, web_root: Path) -> None:
    proxy = proxied(refuse=presigned)
    local = (web_root / "data" / SHARD).read_bytes()
    for start in (0, 2_000, 30_000):
        assert read_range(f"s3://signed/train/{SHARD}", start, start + 1_000) == local[start:start + 1_000]
    refused = [head for head in proxy.heads if presigned(head)]
    assert len(refused) == 1 and len(proxy.heads) == 4  # one refusal, then boto3 for each range


def test_errors_are_boto3_answers_and_name_the_object(proxied, monkeypatch) -> None:
    proxy = proxied()
    with pytest.raises(SourceError, match=r"s3://signed/train/nope\.tar at byte 7: S3 NoSuchKey: no such key") as err:
        read_range("s3://signed/train/nope.tar", 7, 10)
    assert "Signature" not in str(err.value)
    assert [presigned(head) for head in proxy.heads] == [True, False]  # the URL's 404, then boto3's
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(SourceError, match=r"part-000001\.tar at byte 0: S3 SignatureDoesNotMatch") as err:
        read_range(f"s3://signed/train/{SHARD}", 0, 10)
    assert "wrong-secret" not in str(err.value) and "Signature=" not in str(err.value)


def test_a_shard_refused_with_access_denied_is_named_as_refused_or_missing(proxied) -> None:
    """S3 answers AccessDenied for a key that does not exist when the credentials may not list
    the bucket, and for one they may not read: the error says both, not just "missing"."""
    proxied(refuse=lambda head: head.startswith(b"GET /signed/train/part-000003.tar"))
    loader = make_loader("s3://signed/train", num_workers=0, batch_size=64)
    with pytest.raises(SourceError, match=r"part-000003\.tar at byte \d+: S3 AccessDenied: access denied; the "
                                          r"credentials may not read this shard, or it is missing \(S3 denies .*"
                                          r"check their permissions; 'pipeline verify' lists what is missing$"):
        for _ in loader:
            pass


def test_a_setting_other_than_0_or_1_is_refused_as_a_loader_is_made(monkeypatch, tmp_path: Path) -> None:
    """'false' or 'off' were taken for 1: presigned reads went on, unsaid."""
    for value in ("false", "off"):
        monkeypatch.setenv("PIPELINE_S3_PRESIGNED", value)
        with pytest.raises(ValueError, match=re.escape(f"PIPELINE_S3_PRESIGNED={value!r} is not 0 or 1 (unset it for "
                                                       f"the default, 1)")):
            make_loader(tmp_path)
