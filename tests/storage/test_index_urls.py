"""``inspect``, ``verify``, ``describe`` and ``load_index`` by URL: nginx (HTTP) and SeaweedFS (S3).

Every remote answer is compared with the same call on the local folder the servers serve. The
damaged copies (a flipped byte, a deleted shard) live in their own folders and bucket prefixes,
so the shared shard set stays intact for the other tests.
"""

from __future__ import annotations

import pickle
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.cli import main
from pipeline.storage import redact
from pipeline.storage.indexes import NoIndexError
from tests.storage.conftest import upload_folder
from tests.storage.servers import make_bucket

from ..helpers import index_content, read_back

BUCKET = "index-urls"
FLIPPED_SHARD = "part-000003.tar"
FLIPPED_RECORD = 2
MISSING_SHARD = "part-000002.tar"
#: the shard sets each server holds: the intact one, one with a byte flipped, one with a shard gone
SETS = ("intact", "flipped", "holes")


def _copy(web_root: Path, name: str) -> Path:
    """A copy of the shared set under ``web_root``, which nginx serves as ``/name``."""
    return Path(shutil.copytree(web_root / "data", web_root / name))


@pytest.fixture(scope="module")
def flipped(web_root: Path) -> tuple[Path, int]:
    """A copy with one byte flipped in the array data of one record: it decodes, but its checksum
    differs. Returns the folder and the byte where that record starts."""
    folder = _copy(web_root, "index-urls-flipped")
    shard = folder / FLIPPED_SHARD
    data = bytearray(shard.read_bytes())
    record = list(pipeline.iter_records(bytes(data), FLIPPED_SHARD))[FLIPPED_RECORD]
    payload = bytes(record.members["msgpack"])
    x = pipeline.decode_fields(record, FLIPPED_SHARD)["x"]
    at = record.offset + 512 + payload.index(x.tobytes()) + 1  # a byte of one of its floats
    data[at] ^= 0x01
    shard.write_bytes(bytes(data))
    return folder, record.offset


@pytest.fixture(scope="module")
def holes(web_root: Path) -> Path:
    """A copy without one of its shards."""
    folder = _copy(web_root, "index-urls-holes")
    (folder / MISSING_SHARD).unlink()
    return folder


@pytest.fixture
def bucket(s3_env: str, web_root: Path, flipped: tuple[Path, int]) -> str:
    """The three sets as prefixes of one bucket; the holes are made by deleting a key."""
    import boto3

    make_bucket(BUCKET)
    upload_folder(web_root / "data", BUCKET, "intact")
    upload_folder(flipped[0], BUCKET, "flipped")
    upload_folder(web_root / "data", BUCKET, "holes")
    boto3.client("s3").delete_object(Bucket=BUCKET, Key=f"holes/{MISSING_SHARD}")
    return BUCKET


@dataclass(frozen=True)
class Served:
    """The shard sets on one server: ``url(name)`` is the folder URL of one of :data:`SETS`."""

    folders: dict[str, str]
    missing_cause: str  # what the server answers for a missing object

    def url(self, name: str) -> str:
        return self.folders[name]

    def spellings(self, name: str) -> list[str]:
        """Every way to name a set's index: the folder, with a slash, the index file (over HTTP also
        with a query string, a cache-buster say, or a fragment)."""
        folder = self.url(name)
        extra = [folder + "/index.json?v=2", folder + "/index.json#top"] if folder.startswith("http") else []
        return [folder, folder + "/", folder + "/index.json", *extra]


@pytest.fixture(params=["http", "s3"])
def served(request, flipped: tuple[Path, int], holes: Path) -> Served:
    if request.param == "http":
        nginx = request.getfixturevalue("nginx")
        names = {"intact": "data", "flipped": "index-urls-flipped", "holes": "index-urls-holes"}
        return Served({name: f"{nginx}/{folder}" for name, folder in names.items()}, "HTTP 404 not found")
    bucket = request.getfixturevalue("bucket")  # the credentials are in the environment, for subprocesses too
    return Served({name: f"s3://{bucket}/{name}" for name in SETS}, "S3 NoSuchKey: no such key")


def _summary(text: str) -> list[str]:
    """A summary without its first line (which names where the index was read)."""
    return text.splitlines()[1:]


@pytest.fixture(scope="module")
def local_summary(web_root: Path) -> list[str]:
    return _summary(pipeline.describe(web_root / "data"))


def _cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True)


def test_inspect_by_url_prints_the_local_summary(served: Served, local_summary: list[str], capsys) -> None:
    assert "first 3 samples" in local_summary and "fields" in local_summary
    for url in served.spellings("intact"):
        code, out, err = _cli(capsys, "inspect", url)
        assert (code, err) == (0, "")
        read = redact(url) if ".json" in url else f"{served.url('intact')}/index.json"  # the index URL as given
        assert out.splitlines()[0] == f"index    {read}"
        assert _summary(out) == local_summary, url


def test_inspect_and_verify_by_url_as_commands(served: Served, local_summary: list[str]) -> None:
    url = served.url("intact") + "/"
    inspect = _command("inspect", url)
    assert inspect.returncode == 0, inspect.stderr
    assert _summary(inspect.stdout) == local_summary
    verify = _command("verify", url)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.endswith(f"\nverified {url}: every shard matches its index\n") and verify.stderr == ""
    assert verify.stdout.count(f"ok   {url}part-") == 9  # each shard by its URL


def test_verify_by_url_passes_then_names_the_flipped_record(served: Served, flipped: tuple[Path, int],
                                                           capsys) -> None:
    for url in served.spellings("intact"):
        code, out, _ = _cli(capsys, "verify", url, "--quiet")
        assert code == 0 and out.startswith(f"verified {redact(url)}"), out  # a query string may be a signature
    code, out, _ = _cli(capsys, "verify", served.url("flipped"), "--quiet")
    assert code == 1 and len(out.splitlines()) == 2, out
    assert out.startswith(f"FAIL {served.url('flipped')}/{FLIPPED_SHARD} record {FLIPPED_RECORD} "
                          f"(byte {flipped[1]}): record ") and "is corrupt: checksum" in out
    assert out.endswith(f"\nnot verified {served.url('flipped')}: 1 of 9 shards failed: copy them again from where they came from, or build the set again (--overwrite)\n")


def test_a_shard_missing_on_the_server_is_a_problem_naming_its_url(served: Served) -> None:
    url = served.url("holes")
    assert [str(p) for p in pipeline.verify(url)] == [
        f"{url}/{MISSING_SHARD}: missing file or unreadable: {served.missing_cause}"]


def test_a_wrong_url_is_one_error_line_naming_it(served: Served, capsys) -> None:
    nowhere = served.url("intact") + "-nowhere"
    for url, named in ((nowhere, f"{nowhere}/index.json"), (f"{nowhere}/", f"{nowhere}/index.json"),
                       (f"{served.url('intact')}/other.json", f"{served.url('intact')}/other.json")):
        for command in ("inspect", "verify"):
            code, out, err = _cli(capsys, command, url)
            assert (code, out) == (1, "")
            assert err == f"error: {named}: cannot read index file ({served.missing_cause}); pass an index.json, " \
                          f"its folder, or a URL of either (https://..., s3://bucket/prefix)\n"
    result = _command("verify", nowhere)
    assert result.returncode == 1 and result.stderr.startswith(f"error: {nowhere}/index.json: cannot read index")
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.fixture(scope="module")
def split_build(web_root: Path) -> Path:
    """A build split into train and validation (80 and 20 samples), which nginx serves as
    ``/index-urls-splits``: a folder of shard sets, with no index of its own."""
    out = web_root / "index-urls-splits"
    pipeline.write_shards(out, {"x": np.arange(100, dtype=np.float32)[:, None], "y": np.arange(100)},
                          validation=0.2, quiet=True)
    return out


@pytest.mark.parametrize("server", ["http", "s3"])
def test_the_folder_of_a_split_build_is_told_to_hold_its_splits(server: str, split_build: Path, request,
                                                               capsys) -> None:
    """As a local one is: the build's output given where a split is wanted (with or without its
    slash), or a split's name misspelt, also at the top of a bucket."""
    if server == "http":
        folder, cause = f"{request.getfixturevalue('nginx')}/index-urls-splits", "HTTP 404 not found"
        given = {folder: folder, folder + "/": folder, folder + "/index.json": folder,
                 folder + "/trian/": folder + "/trian"}
    else:
        request.getfixturevalue("s3_env")
        for bucket, prefix in ((BUCKET, "splits/"), ("index-urls-splits", "")):
            make_bucket(bucket)
            for split in ("train", "validation"):
                upload_folder(split_build / split, bucket, f"{prefix}{split}")
        folder, cause = f"s3://{BUCKET}/splits", "S3 NoSuchKey: no such key"
        given = {folder: folder, folder + "/": folder, folder + "/trian": folder + "/trian"}
        root = "s3://index-urls-splits"
        with pytest.raises(NoIndexError, match=re.escape(f"{root}/trian/index.json: cannot read index file ({cause}); "
                                                         f"{root} holds the shard sets 'train', 'validation' (one per "
                                                         f"split): pass one of them, e.g. {root}/train") + "$"):
            pipeline.make_loader(f"{root}/trian", num_workers=0)
    told = f"{folder} holds the shard sets 'train', 'validation' (one per split): pass one of them, e.g. {folder}/train"
    for url, index_folder in given.items():
        with pytest.raises(NoIndexError) as error:
            pipeline.make_loader(url, num_workers=0)
        assert str(error.value) == f"{index_folder}/index.json: cannot read index file ({cause}); {told}"
    # verify and inspect check each split, as they do in a local folder (they refused the folder)
    assert _cli(capsys, "verify", "--quiet", folder + "/") == (0, "".join(
        f"== {folder}/{split}\nverified {folder}/{split}: every shard matches its index\n"
        for split in ("train", "validation")), "")
    code, out, _ = _cli(capsys, "inspect", folder)
    assert code == 0 and [line for line in out.splitlines() if line.startswith("== ")] == [
        f"== {folder}/train", f"== {folder}/validation"]
    assert _cli(capsys, "inspect", folder + "/trian")[0] == 1  # (a split misspelt: the error above)
    if server == "http":  # a password in the URL is left out of the line naming each split, as of every message
        secret = folder.replace("http://", "http://user:s3cret@")
        code, out, _ = _cli(capsys, "verify", "--quiet", secret)
        assert code == 0 and f"== {folder}/train\n" in out and "s3cret" not in out + pipeline.describe(secret, 0)
    loader = pipeline.make_loader(f"{folder}/train", num_workers=0, batch_size=10)
    assert sorted(int(y) for batch in loader for y in batch["y"]) == sorted(read_back(split_build / "train")[1]["y"])


def test_verify_describe_and_iter_samples_from_python(served: Served, web_root: Path) -> None:
    local = pipeline.describe(web_root / "data", samples=5)
    url = served.url("intact")
    assert pipeline.verify(url) == []
    assert _summary(pipeline.describe(url, samples=5)) == _summary(local)
    remote_keys = [key for key, _ in pipeline.iter_samples(url)]
    assert remote_keys == [key for key, _ in pipeline.iter_samples(web_root / "data")]


def test_an_s3_prefix_holding_url_characters_is_inspected_as_it_is_read(s3_env: str, web_root: Path,
                                                                         capsys) -> None:
    """'#' and '?' are part of an S3 key: the index's URL was found once, then again with them
    taken for a fragment and a query (s3://b/odd#name/index.json/index.json), and inspect failed."""
    make_bucket(BUCKET)
    upload_folder(web_root / "data", BUCKET, "odd#name?x")
    samples = pipeline.load_index(web_root / "data").samples
    assert main(["inspect", f"s3://{BUCKET}/odd#name?x"]) == 0
    out = capsys.readouterr().out
    assert f"samples  {samples:,} in 9 shards" in out
    assert f"index    s3://{BUCKET}/odd#name?x/index.json\n" in out  # (shown whole: not a fragment, nor a query)


def test_load_index_by_folder_url_index_url_and_prefix(served: Served, web_root: Path) -> None:
    local = index_content(pipeline.load_index(web_root / "data"))
    for url in served.spellings("intact"):
        index = pipeline.load_index(url)
        assert index_content(index) == local, url
        assert index_content(pickle.loads(pickle.dumps(index))) == local  # for workers started with spawn


def test_a_loader_streams_a_set_by_every_spelling_of_its_url(served: Served) -> None:
    samples = pipeline.load_index(served.url("intact")).samples
    for url in served.spellings("intact"):  # an HTTP folder without its slash, too (nginx would redirect it)
        dataset = pipeline.ShardDataset(url, batch_size=64, shuffle=False)
        assert sum(len(next(iter(batch.values()))) for batch in dataset) == samples, url


def test_a_missing_shard_table_is_an_index_error_naming_its_url(nginx: str, web_root: Path) -> None:
    folder = _copy(web_root, "index-urls-no-table")
    (folder / "index.bin").unlink()
    with pytest.raises(pipeline.IndexFormatError,
                       match=rf"{nginx}/index-urls-no-table/index\.bin at byte 0: cannot read shard table: "
                             r"HTTP 404 not found"):
        pipeline.load_index(f"{nginx}/index-urls-no-table")


def test_an_index_refused_for_bad_credentials_says_so_without_advice_on_what_to_pass(bucket: str,
                                                                                     monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(pipeline.IndexFormatError) as refused:
        pipeline.load_index(f"s3://{bucket}/intact")
    assert str(refused.value) == (f"s3://{bucket}/intact/index.json: cannot read index file (S3 SignatureDoesNotMatch: "
                                  f"signature does not match (bad credentials))")


@pytest.mark.parametrize("where", ["", "/private"])  # (a missing file there is 403, not 404)
def test_a_shard_url_without_a_suffix_streams_as_a_shard(nginx: str, web_root: Path, where: str) -> None:
    """Read first as a folder (no index under it, whether the server says "not found" or
    "forbidden", as a bucket that may not be listed does), then as what it is."""
    bare = web_root / "suffixless"
    bare.mkdir(exist_ok=True)
    shutil.copy(web_root / "data" / "part-000000.tar", bare / "part-000000")
    expected = pipeline.load_index(web_root / "data").shards.samples[0]
    dataset = pipeline.ShardDataset(f"{nginx}{where}/suffixless/part-000000", batch_size=64, shuffle=False)
    assert sum(len(batch["i"]) for batch in dataset) == expected


def test_a_misspelt_folder_url_says_no_index_is_there_not_that_a_shard_is_missing(nginx: str) -> None:
    """Read as a shard once no index was found under it: the error was the shard's bare 404,
    with a warning that shards without an index are not cached."""
    with pytest.raises(pipeline.IndexFormatError) as refused:
        pipeline.make_loader(f"{nginx}/data-typo/train", batch_size=64)
    assert str(refused.value).startswith(f"{nginx}/data-typo/train/index.json: cannot read index file (HTTP 404")
