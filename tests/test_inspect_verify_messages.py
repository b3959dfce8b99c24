"""What ``inspect`` and ``verify`` tell a user who passes the wrong thing, or whose set is damaged:
each message names a path the user can open and says what to do; each failing run ends with a
result line and a non-zero exit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.cli import main
from pipeline.format.errors import IndexFormatError
from pipeline.storage import folder_lock
from pipeline.storage.indexes import NoIndexError
from tests.images import image_folder


def run(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def three(tmp_path: Path, monkeypatch) -> Path:
    """Three shards of 100 samples, a record each, built as ``s`` in the current folder (``tmp_path``)."""
    monkeypatch.chdir(tmp_path)
    pipeline.write_shards("s", {"x": np.arange(1200, dtype=np.float32).reshape(300, 4)}, prefix="train",
                          shard_samples=100, pack=100, quiet=True)
    return Path("s")


def test_a_shard_or_a_pattern_given_for_an_index_says_what_to_pass(three: Path, capsys) -> None:
    shard = "s/train-000000.tar"
    told = f"error: {shard} is a shard, not an index: pass its folder, which has one (s)\n"
    for command in ("inspect", "verify"):
        assert run(capsys, command, shard) == (1, "", told)
    with pytest.raises(IndexFormatError, match="is a shard, not an index"):
        pipeline.load_index(shard)
    Path("copy.json").write_bytes((three / "train-000000.tar").read_bytes())  # binary, whatever its name
    assert run(capsys, "inspect", "copy.json") == (1, "", "error: copy.json: not an index: binary data (byte 512 is "
                                                          "not text), not JSON\n")
    pattern = "s/train-{000000..000001}.tar"
    assert run(capsys, "verify", pattern) == (
        1, "", f"error: {pattern} is a pattern of shards, not an index: pass their folder, which has one (s)\n")
    (three / "index.json").unlink()  # shards without one: the command that writes one
    assert run(capsys, "verify", pattern) == (
        1, "", f"error: {pattern} is a pattern of shards, not an index: pass their folder or index.json (or index "
               f"them first: pipeline index '{pattern}')\n")


def test_only_what_takes_patterns_suggests_one_for_shards_without_an_index(three: Path, capsys) -> None:
    raw = Path("raw")
    raw.mkdir()
    for n in range(2):
        shutil.copy(three / "train-000000.tar", raw / f"w-00000{n}.tar")
    told = "raw holds 2 shard(s) without an index: index them in place with 'pipeline index raw'"
    for command in ("inspect", "verify"):
        assert run(capsys, command, "raw") == (1, "", f"error: raw/index.json: no such index file; {told}\n")
    here = Path.cwd() / "raw"  # (a loader's paths are absolute: it reads them after the script may change folder)
    told_loader = told.replace("raw", str(here))
    with pytest.raises(IndexFormatError, match=re.escape(f"; {told_loader}, or pass their paths (a pattern: "
                                                         f"{here}/name-{{000000..000009}}.tar)") + "$"):
        pipeline.make_loader("raw")


def test_a_missing_local_shard_of_a_pattern_is_a_source_error_naming_it(three: Path) -> None:
    with pytest.raises(pipeline.SourceError) as caught:
        pipeline.make_loader("s/train-{000000..000005}.tar", num_workers=0)
    assert not isinstance(caught.value, IndexFormatError)  # a missing file, as over HTTP: not a bad index
    missing = str(Path.cwd() / "s/train-000003.tar")  # (a loader's paths are absolute)
    assert (caught.value.url, str(caught.value)) == (missing, f"{missing}: no such shard or folder")


@pytest.mark.parametrize("listed", [["s", "s"], ["s/index.json"], ["s/train-000000.tar", "s/"]])
def test_a_shard_set_in_a_list_of_shards_says_how_to_pass_sets(three: Path, listed: list[str]) -> None:
    with pytest.raises(ValueError) as caught:
        pipeline.make_loader(listed, num_workers=0)
    named = next(u for u in listed if not u.endswith(".tar"))
    assert str(caught.value) == (
        f"{named} is a shard set (a folder or an index), in a list of shards: pass one set alone (make_loader("
        f"{named!r})), or mix sets as a mapping {{name: set}}, e.g. {{'a': 'A/', 'b': 'B/'}} (with weights= if you like)")


def test_a_mistyped_path_is_offered_only_splits(three: Path, capsys) -> None:
    pipeline.write_shards("wds", {"x": np.zeros(4)}, quiet=True)  # sets beside each other: no splits
    what = "pass an index.json, its folder, or a URL of either (https://..., s3://bucket/prefix)"
    assert run(capsys, "inspect", "nonexist") == (1, "", f"error: nonexist: no such index file; {what}\n")
    assert run(capsys, "inspect", ".") == (  # a folder given for a set: the sets in it (no splits of a build)
        1, "", "error: ./index.json: no such index file; . holds the shard sets 's', 'wds': pass one of them, e.g. "
               "./s\n")
    Path("out").mkdir()
    three.rename("out/train")
    assert run(capsys, "inspect", "out/tain") == (
        1, "", "error: out/tain: no such index file; out holds the shard sets 'train' (one per split): pass one of "
               "them, e.g. out/train\n")


def test_inspect_and_verify_of_a_folder_of_splits_take_each_split(tmp_path: Path, capsys, monkeypatch) -> None:
    """They refused the folder a split build wrote, saying to pass one split."""
    monkeypatch.chdir(tmp_path)
    pipeline.write_shards("out", {"x": np.arange(40, dtype=np.float32).reshape(20, 2)}, validation=5, pack=5,
                          quiet=True)
    assert run(capsys, "verify", "out") == (0, "== out/train\nok   out/train/train-000000.tar\nverified out/train: "
                                               "every shard matches its index\n== out/validation\nok   out/validation/"
                                               "validation-000000.tar\nverified out/validation: every shard matches "
                                               "its index\n", "")
    code, out, err = run(capsys, "inspect", "out", "--samples", "0")
    assert (code, err) == (0, "") and out.startswith("== out/train\nindex    out/train/index.json\nsamples  15 in 1 ")
    assert "\n== out/validation\nindex    out/validation/index.json\nsamples  5 in 1 shards" in out
    shard = Path("out/validation/validation-000000.tar")
    shard.write_bytes(shard.read_bytes()[:-1024])
    code, out, err = run(capsys, "verify", "out", "--quiet")
    assert (code, err) == (1, "") and out.startswith("== out/train\nverified out/train: every shard matches its "
                                                     "index\n== out/validation\nFAIL out/validation/validation-000000.tar")
    assert out.splitlines()[-1].startswith("not verified out/validation: 1 of 1 shards failed")
    Path("out/validation/index.json").unlink()  # a split whose build did not finish: reported, not passed over
    code, out, err = run(capsys, "verify", "out", "--quiet")
    assert (code, out) == (1, "== out/train\nverified out/train: every shard matches its index\n== out/validation\n")
    assert err.startswith("error: out/validation/index.json: no such index file")


def test_verify_and_describe_of_a_folder_of_splits_take_each_split_as_the_commands_do(tmp_path: Path, capsys,
                                                                                      monkeypatch) -> None:
    """pipeline.verify and pipeline.describe refused the folder (NoIndexError) that the commands took."""
    monkeypatch.chdir(tmp_path)
    pipeline.write_shards("out", {"x": np.arange(40, dtype=np.float32).reshape(20, 2)}, validation=5, pack=5,
                          quiet=True)
    told: list[str] = []
    assert pipeline.verify(Path("out"), on_file=lambda status, shown, problem: told.append(shown)) == []
    assert told == ["out/train/train-000000.tar", "out/validation/validation-000000.tar"]
    code, out, _ = run(capsys, "inspect", "out", "--samples", "1")
    assert code == 0 and pipeline.describe("out", samples=1) + "\n" == out and out.count("\n== ") == 1
    shard = Path("out/validation/validation-000000.tar")
    shard.write_bytes(shard.read_bytes()[:-1024])
    assert [problem.shard for problem in pipeline.verify("out")] == [str(shard)]  # each split's problems, named


def test_inspect_rejects_a_negative_number_of_samples(three: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["inspect", "s", "--samples", "-1"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.endswith("pipeline inspect: error: argument --samples: must be at least 0, got -1\n")
    assert run(capsys, "inspect", "s", "--samples", "0")[0] == 0


def _header(set_folder: str) -> str:
    return (f"index    {set_folder}/index.json\n"
            "samples  300 in 3 shards, 3 records (pack=100)\n"
            "bytes    10.5 KiB; shard sizes min 3.5 KiB / mean 3.5 KiB / max 3.5 KiB\n"
            "fields\n"
            "  x                float32 [4]\n")


def test_inspect_checks_the_records_it_shows_and_prints_the_index_when_a_shard_is_gone(three: Path, capsys) -> None:
    at = pipeline.load_index(three).shards[0].offsets[0]
    shard = three / "train-000000.tar"
    whole = shard.read_bytes()
    damaged = bytearray(whole)
    damaged[at + 512 + 100] ^= 0xFF  # in the array bytes: decodes, but its checksum differs
    shard.write_bytes(bytes(damaged))
    code, out, err = run(capsys, "inspect", "s", "--samples", "1")
    assert (code, out) == (1, _header("s"))
    assert err.startswith(f"error: {shard} at byte 0: record '000000000000' is corrupt: checksum ")
    shard.unlink()
    assert run(capsys, "inspect", "s") == (1, _header("s"), f"error: {shard} at byte 0: cannot open: No such file or "
                                                             f"directory\n")
    shard.write_bytes(whole)
    code, out, err = run(capsys, "inspect", "s", "--samples", "1")
    assert (code, err) == (0, "") and out.startswith(_header("s") + "first 1 samples\n")


def test_a_missing_table_says_how_to_rebuild_it(three: Path, capsys) -> None:
    (three / "index.bin").unlink()
    told = "error: s/index.bin: no such shard table (it is written with the index: copy it with index.json, or " \
           "re-index the shards: pipeline index s --overwrite)\n"
    assert run(capsys, "inspect", "s") == (1, "", told)
    assert run(capsys, "index", "s", "--overwrite", "--quiet")[0] == 0
    assert run(capsys, "verify", "s", "--quiet") == (0, "verified s: every shard matches its index\n", "")


def _without_reading_others_files() -> list[str]:
    """A command prefix that runs without the power to read files whatever their mode (root's)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root, without setpriv to drop the power to read any file")
    return [setpriv, "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]


def test_a_table_that_cannot_be_read_is_named_with_the_reason(three: Path) -> None:
    (three / "index.bin").chmod(0)
    for command in ("inspect", "verify"):
        done = subprocess.run([*_without_reading_others_files(), sys.executable, "-m", "pipeline", command, "s"],
                              capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout, done.stderr) == (
            1, "", "error: s/index.bin at byte 0: cannot read shard table: Permission denied\n")


def test_verify_names_shards_by_the_paths_they_are_at_and_ends_with_the_result(tmp_path: Path, capsys,
                                                                               monkeypatch) -> None:
    for name in ("a", "b"):  # shards in two folders, their index in a third: names that start with ../
        pipeline.write_shards(tmp_path / name, {"x": np.zeros(3)}, prefix="x", quiet=True)
    assert run(capsys, "index", str(tmp_path / "a/x-000000.tar"), str(tmp_path / "b/x-000000.tar"), "--output",
               str(tmp_path / "idx"), "--quiet")[0] == 0
    (tmp_path / "b/x-000000.tar").rename(tmp_path / "b/moved.tar")
    monkeypatch.chdir(tmp_path / "a")
    failed = "FAIL ../b/x-000000.tar: missing file or unreadable: cannot open: No such file or directory\n"
    result = "not verified ../idx: 1 of 2 shards failed: copy them again from where they came from, or build the set again (--overwrite)\n"
    assert run(capsys, "verify", "../idx") == (1, f"ok   ../a/x-000000.tar\n{failed}{result}", "")
    assert run(capsys, "verify", "../idx", "--quiet") == (1, failed + result, "")
    (tmp_path / "b/moved.tar").rename(tmp_path / "b/x-000000.tar")
    assert run(capsys, "verify", "../idx") == (
        0, "ok   ../a/x-000000.tar\nok   ../b/x-000000.tar\nverified ../idx: every shard matches its index\n", "")
    assert pipeline.verify(tmp_path / "idx") == []


def test_a_damaged_table_is_blamed_and_not_the_shards_it_misdescribes(three: Path, capsys) -> None:
    table = three / "index.bin"
    data = bytearray(table.read_bytes())
    checksums = len(data) - 4 * 3  # the last section: a 4-byte checksum per record
    data[checksums + 1] ^= 1  # shard 0's record 0: the table is wrong, the shard intact
    table.write_bytes(bytes(data))
    code, out, err = run(capsys, "verify", "s")
    lines = out.splitlines()
    assert (code, err, len(lines)) == (1, "", 5)
    assert lines[0].startswith("FAIL s/index.bin: sha256 ") and lines[0].endswith(
        ": the shard table is damaged, so the shards cannot be checked against it; copy it again with index.json, "
        "or re-index the shards: pipeline index s --overwrite")
    assert lines[1].startswith("?    s/train-000000.tar record 0 (byte 0): disagrees with the damaged shard table: "
                               "record '000000000000' is corrupt: checksum ")
    assert lines[2:] == ["ok   s/train-000001.tar", "ok   s/train-000002.tar",
                         "not verified s: its shard table is damaged (1 of 3 shards disagree with it, 0 failed)"]
    assert [p.shard for p in pipeline.verify("s")] == ["s/index.bin", "s/train-000000.tar"]
    assert os.path.exists(lines[1].split()[1])  # a path the user can open


def test_verify_images_decodes_every_image_and_names_those_that_do_not(tmp_path: Path, capsys,
                                                                        monkeypatch) -> None:
    """A photo cut short passes the build (it starts as an image) and the checksums (they are
    of what was written): only a training run found it, part way through an epoch."""
    monkeypatch.chdir(tmp_path)
    image_folder(Path("root"), {"a": 6, "b": 6}, size=(32, 32))
    cut = {}
    for name in ("a/0002.jpg", "a/0003.jpg", "b/0008.png"):
        whole = (Path("root") / name).read_bytes()
        cut[name] = len(whole) * 2 // 3
        (Path("root") / name).write_bytes(whole[:cut[name]])
    index = pipeline.build_imagefolder("root", "s", shard_samples=4, quiet=True)
    assert run(capsys, "verify", "s", "--quiet") == (0, "verified s: every shard matches its index\n", "")
    code, out, _ = run(capsys, "verify", "s", "--images", "--quiet")
    assert code == 1 and out.splitlines()[:2] == [
        f"FAIL s/shard-000000.tar record 2 (byte {index.shards[0].offsets[2]}): record 'a_0002': field 'image': a "
        f"truncated JPEG ({cut['a/0002.jpg']} bytes, it ends before its end-of-image marker); and 1 more: record "
        f"'a_0003': field 'image': a truncated JPEG ({cut['a/0003.jpg']} bytes, it ends before its end-of-image marker)",
        f"FAIL s/shard-000002.tar record 0 (byte 0): record 'b_0008': field 'image': a truncated PNG "
        f"({cut['b/0008.png']} bytes, it ends before its IEND chunk)"]
    # the shards are intact: copying them again, or building them from the same files, mends nothing
    assert out.splitlines()[2:] == ["not verified s: 2 of 3 shards failed: 2 hold images that do not decode, as they "
                                    "were when built (the shards are intact): replace those images and build again "
                                    "(shards indexed in place: write them again, then pipeline index), or train past "
                                    "them with on_error='skip'"]
    assert [p.record for p in pipeline.verify("s", images=True)] == [2, 0]
    packed = pipeline.build_imagefolder("root", "packed", shard_samples=4, pack=2, quiet=True)
    lines = run(capsys, "verify", "packed", "--images", "--quiet")[1].splitlines()
    assert lines[0] == (  # a packed record's key is its first sample's: each damaged image is named by its own
        f"FAIL packed/shard-000000.tar record 1 (byte {packed.shards[0].offsets[1]}): record 'a_0002': sample 'a_0002' "
        f"(row 0): field 'image': a truncated JPEG ({cut['a/0002.jpg']} bytes, it ends before its end-of-image "
        f"marker); and 1 more: record 'a_0002': sample 'a_0003' (row 1): field 'image': a truncated JPEG "
        f"({cut['a/0003.jpg']} bytes, it ends before its end-of-image marker)")
    assert lines[1].startswith("FAIL packed/shard-000002.tar record 0 (byte 0): record 'b_0008': sample 'b_0008' (row 0)")
    shard = Path("s/shard-000001.tar")  # damaged after the build as well: that shard is to copy again
    data = bytearray(shard.read_bytes())
    data[700] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert run(capsys, "verify", "s", "--images", "--quiet")[1].splitlines()[-1] == (
        "not verified s: 3 of 3 shards failed: 2 hold images that do not decode, as they were when built (the shards "
        "are intact): replace those images and build again (shards indexed in place: write them again, then pipeline "
        "index), or train past them with on_error='skip'; the other 1 are "
        "damaged: copy them again from where they came from, or build the set again (--overwrite)")


def test_a_tar_beside_the_shards_that_the_index_does_not_name_is_noted(three: Path, capsys) -> None:
    """A copy left in the folder passes verify unseen, and re-indexing the folder takes it in."""
    shutil.copy(three / "train-000000.tar", three / "train-000003.tar")
    note = "note s/train-000003.tar: beside the shards, not in the index (pipeline index would take it for one of them)"
    assert run(capsys, "verify", "s", "--quiet") == (0, f"{note}\nverified s: every shard matches its index\n", "")
    here = Path.cwd() / "s"  # (a loader's paths are absolute)
    with pytest.warns(UserWarning, match=re.escape(f"{here} holds 1 shard(s) its index does not name (e.g. "
                                                   f"train-000003.tar): they are not read; build them into the set, or "
                                                   f"index the folder's shards anew (pipeline index {here}), or move "
                                                   f"them out")) as caught:
        loader = pipeline.make_loader("s", batch_size=4, num_workers=2)
    assert len(caught) == 1 and caught[0].filename == __file__
    assert sum(len(batch["x"]) for batch in loader) == pipeline.load_index("s").samples
    Path("side").mkdir()
    for split in ("train", "val"):  # two sets indexed side by side in one folder: no strays of each other
        pipeline.write_shards(f"built/{split}", {"x": np.arange(20)}, prefix=split, shard_samples=10, quiet=True)
        for shard in Path(f"built/{split}").glob("*.tar"):
            shutil.copy(shard, "side")
        pipeline.index_shards(sorted(map(str, Path("side").glob(f"{split}-*.tar"))), f"side/{split}.json", quiet=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sum(len(batch["x"]) for batch in pipeline.make_loader("side/train.json", num_workers=0)) == 20
    for part in range(2):  # the parts of a build in one folder: each index names its own shards
        pipeline.write_shards("p", {"x": np.arange(40)}, shard_samples=10, part=pipeline.Part(part, 2), quiet=True)
    assert run(capsys, "verify", "p/index.part-00000-of-00002.json", "--quiet") == (
        0, "verified p/index.part-00000-of-00002.json: every shard matches its index\n", "")


@pytest.mark.parametrize("given", ["s/index.bin", "x.npy", "labels.pt"])
def test_a_builds_input_or_an_index_table_given_as_a_shard_says_what_to_pass(three: Path, given: str) -> None:
    """Each failed at its first read: "at byte 0: truncated header: expected 512 bytes"."""
    if not Path(given).exists():
        Path(given).write_bytes(b"\x93NUMPY" + bytes(200))
    told = ("is the shard table of an index: pass the index's folder, or its .json file" if given.endswith(".bin")
            else f"is a {given.rsplit('.', 1)[-1]} file, not a shard: build shards from it first")
    with pytest.raises(ValueError, match=re.escape(f"{Path.cwd() / given} {told}")):
        pipeline.make_loader(given)
    command = f"pipe:cat s/train-000000.tar && : {given}"  # (a command that may take an input and write a shard)
    assert sum(len(batch["x"]) for batch in pipeline.make_loader([command], num_workers=0)) > 0


def test_a_folder_a_build_stopped_in_says_to_resume_it_not_to_index_it(tmp_path: Path, capsys) -> None:
    """A build stopped part way left its plan and 3 of 5 shards: the advice was 'pipeline index
    DIR', which made a set of the 3 (and the build's --resume then refused it)."""
    labels = np.zeros(500)
    labels[400] = 1.5  # (an input error in the last shards, as a kill would leave them)
    out = tmp_path / "out"
    with pytest.raises(pipeline.SampleError):
        pipeline.write_shards(out, {"y": labels}, dtypes={"y": "int64"}, shard_samples=100, quiet=True)
    stopped = (f"a build of this library stopped part way in {out} (unless a build is writing it now, on another "
               f"machine or one whose lock this system cannot see): it left its plan, .index.plan.json, and no index; "
               f"run the same build command with --resume to finish it, or with --overwrite to build it again. To "
               f"index the shards it finished as they are (a part of the set), delete {out / '.index.plan.json'} "
               f"first, then 'pipeline index {out}'")
    for command in ("inspect", "index"):
        code, _, err = run(capsys, command, str(out))
        assert code == 1 and stopped in err and "pipeline index' " not in err
    with pytest.raises(NoIndexError, match=re.escape(stopped)):
        pipeline.make_loader(out, batch_size=10)
    held = folder_lock.take_folder_lock(out, shared=False)  # (as a build writing it now holds it)
    try:
        with pytest.raises(NoIndexError, match=re.escape(
                f"{out} is being written by a build now (its plan, .index.plan.json, is there; its index is written "
                f"last): wait for the build to end")):
            pipeline.load_index(out)
    finally:
        held.release()
    (out / ".index.plan.json").unlink()
    assert run(capsys, "index", str(out))[0] == 0 and pipeline.load_index(out).samples == 400
