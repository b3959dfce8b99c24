"""A build killed at any moment never leaves an index naming an incomplete shard, and
``--resume`` completes it with the very files an uninterrupted build writes, keeping the shards
the killed run finished."""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.format.scan import scan_shard
from pipeline.write.resume import shard_plan
from pipeline.write.rows import RowBlock
from pipeline.write.source import Source
from tests.helpers import child_pids, read_back
from tests.images import image_folder

OPTIONS = dict(pack=32, shard_bytes=40 << 10, quiet=True)


def files(folder: Path) -> dict[str, bytes]:
    """Every file of a build (shards, index and what is saved beside it), by name."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def inodes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in folder.glob("*.tar")}


def build_command(out: Path, inputs: dict[str, str], *extra: str) -> list[str]:
    """A build of many small shards by three worker processes, a few seconds long."""
    return [sys.executable, "-m", "pipeline", "build", "arrays", str(out),
            "--array", f"x={inputs['x']}", "--array", f"y={inputs['y']}",
            "--pack", "8", "--shard-bytes", "32KiB", "--workers", "3", "--quiet", *extra]


def run_and_kill(command: list[str], out: Path, shards: int, extra: float) -> None:
    """Run ``command`` and SIGKILL it and its worker processes, as a crash or the out-of-memory
    killer would, ``extra`` seconds after ``shards`` shard files are in ``out`` (unless it has
    ended by then): a moment anywhere in the build, however fast the machine."""
    proc = subprocess.Popen(command, start_new_session=True, stderr=subprocess.DEVNULL)
    while proc.poll() is None and len(list(out.glob("*.tar"))) < shards:
        time.sleep(0.005)
    time.sleep(extra)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def check_after_kill(out: Path) -> tuple[int, bool]:
    """Every file under a shard's name is a whole shard, and an index, if any, is sound;
    returns the number of shards and whether there is an index."""
    shards = list(out.glob("*.tar"))
    for path in shards:
        scan_shard(path.read_bytes(), path.name)
    indexed = (out / "index.json").exists()
    if indexed:
        assert pipeline.verify(out) == []
    return len(shards), indexed


def test_builds_killed_at_random_moments_resume_to_the_uninterrupted_result(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    inputs = {"x": str(tmp_path / "x.npy"), "y": str(tmp_path / "y.npy")}
    np.save(inputs["x"], rng.random((30_000, 128), dtype=np.float32))
    np.save(inputs["y"], rng.integers(0, 10, 30_000))
    subprocess.run(build_command(tmp_path / "whole", inputs), check=True)
    whole = files(tmp_path / "whole")
    total = len(list((tmp_path / "whole").glob("*.tar")))
    assert total > 100

    moments = random.Random(2024)
    found = []  # (shards on disk, index written) after each kill
    for chain in range(3):  # each chain: a build, then resumed builds, every one killed at random
        out = tmp_path / f"out{chain}"
        for attempt in range(4):
            resume = ("--resume",) if attempt else ()
            on_disk = len(list(out.glob("*.tar")))
            run_and_kill(build_command(out, inputs, *resume), out, moments.randint(on_disk, total),
                         moments.uniform(0, 0.02))
            found.append(check_after_kill(out))
        subprocess.run(build_command(out, inputs, "--resume"), check=True)
        assert files(out) == whole  # byte-identical, and no temporary file left
    assert len(found) >= 10
    assert any(0 < shards < total and not indexed for shards, indexed in found)  # some killed mid-build


def test_the_workers_of_a_killed_build_stop_with_it(tmp_path: Path) -> None:
    """SIGKILL of the build alone (not its process group) gives its pool no chance to stop: its
    workers must notice and exit, not go on writing shards beside a resumed build."""
    inputs = {"x": str(tmp_path / "x.npy"), "y": str(tmp_path / "y.npy")}
    np.save(inputs["x"], np.random.default_rng(5).random((30_000, 128), dtype=np.float32))
    np.save(inputs["y"], np.arange(30_000))
    out = tmp_path / "out"
    build = subprocess.Popen(build_command(out, inputs), start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        while build.poll() is None and len(list(out.glob("*.tar"))) < 5:
            time.sleep(0.005)
        workers = [pid for pid in child_pids(build.pid) if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(workers) == 3
        build.kill()
        build.wait()
        deadline = time.monotonic() + 10
        while any(map(running, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(running, workers))
        written = sorted(out.glob("*.tar"))
        time.sleep(0.5)
        assert sorted(out.glob("*.tar")) == written  # nothing writes any more
        subprocess.run(build_command(out, inputs, "--resume"), check=True)
        assert pipeline.verify(out) == []
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever is left of the job
            os.killpg(build.pid, signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_resume_rewrites_damaged_and_missing_shards_and_keeps_the_others(tmp_path: Path, npy_inputs,
                                                                         capsys) -> None:
    pipeline.write_shards(tmp_path / "whole", npy_inputs, **OPTIONS)
    out = tmp_path / "out"
    pipeline.write_shards(out, npy_inputs, **OPTIONS)
    for path in out.glob("index*"):
        path.unlink()  # as if killed just before the index was written
    shards = sorted(out.glob("*.tar"))
    with open(shards[1], "r+b") as f:
        f.truncate(3000)
    data = bytearray(shards[2].read_bytes())
    data[512] = 0xC1  # the first byte of the first record's msgpack map: a code msgpack never uses
    shards[2].write_bytes(bytes(data))
    shards[3].write_bytes(shards[3].read_bytes()[:-1024])  # cut at a record boundary
    shards[4].unlink()
    (out / f".{shards[5].name}.tmp-12345").write_bytes(b"half a shard")
    (out / ".index.json.tmp-12345").write_bytes(b"{")
    before = inodes(out)

    capsys.readouterr()
    index = pipeline.write_shards(out, npy_inputs, resume=True, **{**OPTIONS, "quiet": False})

    assert files(out) == files(tmp_path / "whole")
    after = inodes(out)
    rewritten = {name for name in after if before.get(name) != after[name]}
    assert rewritten == {p.name for p in shards[1:5]}
    written = sum(s.samples for s in index.shards if s.url in rewritten)
    assert (f"wrote {written} samples in 4 shards and kept {len(shards) - 4} shards "
            f"({index.samples - written} samples) that an earlier run finished") in capsys.readouterr().err


def test_a_resume_under_other_options_removes_the_shards_beyond_its_plan(tmp_path: Path, capsys) -> None:
    """A killed build of many small shards resumed as one of fewer, larger ones: the small ones
    past the new plan would pass, to a later ``pipeline index`` of the folder, for data."""
    arrays = {"v": np.arange(400)}
    pipeline.write_shards(tmp_path, arrays, shard_samples=10, quiet=True)  # 40 shards, then "killed":
    for name in ("index.json", "index.bin"):
        (tmp_path / name).unlink()
    (tmp_path / ".shard-000041.tar.tmp-12345").write_bytes(b"half a shard")
    with tarfile.open(tmp_path / "shard-000050.tar", "w") as theirs:  # another tool's (webdataset): not ours to delete
        member = tarfile.TarInfo("s0.cls")
        member.size = 1
        theirs.addfile(member, io.BytesIO(b"1"))
    pipeline.write_shards(tmp_path, arrays, shard_samples=100, resume=True)
    assert "removed 36 shards an earlier run wrote beyond this build's (shard-000004.tar, ...)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.bin", "index.json"] + [
        f"shard-{i:06d}.tar" for i in (0, 1, 2, 3, 50)]
    assert read_back(tmp_path)[1]["v"] == list(range(400))


def test_an_overwrite_after_a_killed_build_leaves_only_its_own_set(tmp_path: Path, capsys) -> None:
    """--overwrite, which the error about a killed build's shards offers, replaces them: the
    shards and temporary files beyond its plan go too (not another tool's), as a resume's do."""
    pipeline.write_shards(tmp_path, {"v": np.arange(400)}, shard_samples=10, quiet=True)  # 40 shards, "killed":
    for name in ("index.json", "index.bin"):
        (tmp_path / name).unlink()
    (tmp_path / ".shard-000041.tar.tmp-12345").write_bytes(b"half a shard")
    (tmp_path / "shard-000050.tar").write_bytes(b"another tool's")
    pipeline.write_shards(tmp_path, {"v": np.arange(150)}, shard_samples=100, overwrite=True)
    assert "removed 38 shards an earlier run wrote beyond this build's (shard-000002.tar, ...)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.bin", "index.json", "shard-000000.tar",
                                                           "shard-000001.tar", "shard-000050.tar"]
    assert read_back(tmp_path)[1]["v"] == list(range(150))


def test_a_build_to_a_file_url_writes_the_folder_it_names(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    pipeline.write_shards(f"file://{tmp_path}/out", {"v": np.arange(30)}, quiet=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["index.bin", "index.json", "shard-000000.tar"]
    assert not Path("file:").exists()
    assert read_back(tmp_path / "out")[1]["v"] == list(range(30))
    assert pipeline.load_index(f"file://{tmp_path}/out").samples == 30


def test_resume_of_a_finished_build_does_nothing_and_says_so(tmp_path: Path, npy_inputs) -> None:
    command = [sys.executable, "-m", "pipeline", "build", "arrays", str(tmp_path / "out"),
               "--array", f"x={npy_inputs['x']}", "--array", f"y={npy_inputs['y']}", "--pack", "32"]
    subprocess.run(command, check=True, capture_output=True)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    result = subprocess.run(command + ["--resume"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "already complete" in result.stderr and "nothing to resume" in result.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()} == before
    refused = subprocess.run(command, capture_output=True, text=True)
    assert refused.returncode == 1 and "already exists" in refused.stderr


def test_resume_of_a_finished_build_removes_what_killed_runs_left(tmp_path: Path, npy_inputs) -> None:
    """A run killed after writing its index (before its clean-up) leaves the temporary files of
    shards an earlier killed run was writing: resuming the finished build removes them."""
    pipeline.write_shards(tmp_path / "whole", npy_inputs, **OPTIONS)
    out = tmp_path / "out"
    pipeline.write_shards(out, npy_inputs, **OPTIONS)
    (out / ".shard-000001.tar.tmp-4242").write_bytes(b"half a shard")
    pipeline.write_shards(out, npy_inputs, resume=True, **OPTIONS)
    assert files(out) == files(tmp_path / "whole")


def test_resume_refuses_the_index_of_another_build(tmp_path: Path, npy_inputs) -> None:
    pipeline.write_shards(tmp_path, npy_inputs, **OPTIONS)
    with pytest.raises(pipeline.OutputExistsError, match="other shards than this one plans"):
        pipeline.write_shards(tmp_path, npy_inputs, resume=True, **{**OPTIONS, "pack": 16})
    with pytest.raises(ValueError, match="give one of them"):
        pipeline.write_shards(tmp_path, npy_inputs, resume=True, overwrite=True, **OPTIONS)


def test_a_shard_whose_stored_types_differ_from_the_source_is_rewritten(tmp_path: Path) -> None:
    """Packed, a column of Python ints is stored as an int64 array while the index describes
    the source's ``int``: such a shard cannot be told from another build's, so it is rewritten
    and the index is the one a fresh build writes."""
    (tmp_path / "data").mkdir()
    for i in range(20):
        np.save(tmp_path / "data" / f"s{i}.npy", np.full(3, i, np.float32))
    labels = {f"s{i}": i % 3 for i in range(20)}
    partition = {"train": [f"s{i}" for i in range(20)]}
    options = dict(pack=4, shard_samples=8, quiet=True)
    pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "whole", **options)
    pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", **options)
    train = tmp_path / "out" / "train"
    for path in train.glob("index*"):
        path.unlink()
    (train / "train-000002.tar").unlink()
    before = inodes(train)
    pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", resume=True, **options)
    assert files(train) == files(tmp_path / "whole" / "train")
    assert all(before[name] != ino for name, ino in inodes(train).items() if name in before)


@pytest.mark.parametrize("stopped, pack, samples", [(10, 11, 300), (1, 4, 201)])
def test_a_resume_under_another_pack_rewrites_shards_of_as_many_records(tmp_path: Path, stopped: int, pack: int,
                                                                        samples: int) -> None:
    """100 samples make 10 records under a pack of 10 and of 11 alike; a reader of the pack-11
    index finds sample 10 in record 0, where the stopped run's pack-10 shard does not hold it.
    A last shard of one sample is one record under any pack, unpacked under a pack of 1 only.
    (``pack="auto"`` follows the source's size, so a source grown since its stopped build
    changes the pack without the user asking.)"""
    arrays = {"v": np.arange(samples)}
    pipeline.write_shards(tmp_path / "whole", arrays, pack=pack, shard_samples=100, quiet=True)
    pipeline.write_shards(tmp_path / "out", arrays, pack=stopped, shard_samples=100, quiet=True)
    for path in (tmp_path / "out").glob("index*"):
        path.unlink()  # killed just before the index was written
    pipeline.write_shards(tmp_path / "out", arrays, pack=pack, shard_samples=100, resume=True, quiet=True)
    assert files(tmp_path / "out") == files(tmp_path / "whole")
    assert read_back(tmp_path / "out")[1]["v"] == list(range(samples))


class DiesAt(Source):
    """The rows of ``inner``; reading past row ``last`` fails, as a build killed part way."""

    description = "dies part way"

    def __init__(self, inner: Source, last: int) -> None:
        self.inner, self.last = inner, last

    def __len__(self) -> int:
        return len(self.inner)

    def read(self, start: int, stop: int) -> RowBlock:
        if stop > self.last:
            raise RuntimeError("the build dies here")
        return self.inner.read(start, stop)


@pytest.mark.parametrize("prefix", ["shard", "a[1]*"])  # the second is a glob pattern as text
def test_a_new_build_first_deletes_the_shards_an_earlier_build_left_under_its_names(tmp_path: Path,
                                                                                    prefix: str) -> None:
    """Shards of another dataset under the planned names (a killed build of other data) must
    not pass for this build's when it is resumed after dying in turn."""
    rng = np.random.default_rng(3)
    old, new = ({"x": rng.random((3000, 8), dtype=np.float32)} for _ in range(2))
    options = dict(OPTIONS, prefix=prefix)
    pipeline.write_shards(tmp_path / "whole", new, **options)
    out = tmp_path / "out"
    pipeline.write_shards(out, old, **options)
    for path in out.glob("index*"):
        path.unlink()
    with pytest.raises(pipeline.OutputExistsError, match=re.escape(
            f"{out / (prefix + '-000000.tar')} already exists (5 file(s) under the shard names this build writes), "
            f"and no index names it: a build that stopped part way? resume=True (--resume) finishes it; "
            f"overwrite=True (--overwrite) replaces them")):
        pipeline.build_shards(pipeline.ArraySource(new), out, **options)  # they might be another tool's: not without
    with pytest.raises(RuntimeError, match="dies here"):
        pipeline.build_shards(DiesAt(pipeline.ArraySource(new), 1000), out, overwrite=True, **options)
    assert 0 < len(list(out.glob("*.tar"))) < len(list((tmp_path / "whole").glob("*.tar")))
    pipeline.write_shards(out, new, resume=True, **options)
    assert files(out) == files(tmp_path / "whole")


def _stop_at(image: Path) -> bytes:
    """Cut ``image`` short, so that a build that shrinks images stops there, part way (a file
    that is no image at all is found before a shard is written); its bytes."""
    whole = image.read_bytes()
    image.write_bytes(whole[:40])
    return whole


@pytest.mark.parametrize("validation, workers", [(0.2, 1), (None, 2)])
def test_a_file_removed_before_a_resume_gives_the_set_a_fresh_build_gives(tmp_path: Path, validation, workers) -> None:
    """The build stops at a damaged image, whose error says to remove it; the resume that
    follows must not keep finished shards whose rows moved: it kept 7 shards of rows shifted by
    one (7 images lost, 7 twice, 6 of validation in train) and said the set verified."""
    image_folder(tmp_path / "root", {"a": 20, "b": 20, "c": 20}, size=(8, 8))
    bad = tmp_path / "root" / "b" / "0030.jpg"
    _stop_at(bad)
    options = dict(shard_samples=3, validation=validation, workers=workers, max_side=4, quiet=True,
                   **({"seed": 3} if validation else {}))
    with pytest.raises(pipeline.SampleError, match="b/0030.jpg: cannot read the image to shrink it"):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", **options)
    bad.unlink()  # as the error says
    resumed = pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", resume=True, **options)
    fresh = pipeline.build_imagefolder(tmp_path / "root", tmp_path / "fresh", **options)
    splits = ("train", "validation") if validation else ("",)
    for split in splits:
        assert read_back(tmp_path / "out" / split) == read_back(tmp_path / "fresh" / split)
    keys = [key for split in splits for key in read_back(tmp_path / "out" / split)[0]]
    assert len(keys) == len(set(keys)) == 59
    assert (type(resumed) is dict) == bool(validation) and (type(fresh) is dict) == bool(validation)
    assert not list((tmp_path / "out").rglob(".*"))  # the plan, kept until the index is written


def test_a_file_mended_in_place_before_a_resume_keeps_every_finished_shard(tmp_path: Path, capsys) -> None:
    image_folder(tmp_path / "root", {"a": 20, "b": 20}, size=(8, 8))
    bad = tmp_path / "root" / "b" / "0035.jpg"
    whole = _stop_at(bad)
    with pytest.raises(pipeline.SampleError):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", shard_samples=3, max_side=4, quiet=True)
    bad.write_bytes(whole)  # the same name: no row moved
    capsys.readouterr()
    pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", shard_samples=3, max_side=4, resume=True)
    assert "kept 11 shards (33 samples)" in capsys.readouterr().err
    assert read_back(tmp_path / "out")[0] == sorted(read_back(tmp_path / "out")[0])


def _changed_shards(before: Source, after: Source, shard_samples: int) -> list[int]:
    """The shards whose rows' digests differ between two plans of ``shard_samples`` rows each."""
    plans = []
    for source in (before, after):
        bounds = list(range(0, len(source), shard_samples)) + [len(source)]
        names = [f"s-{n:06d}.tar" for n in range(len(bounds) - 1)]
        plans.append(shard_plan(source, bounds, range(len(names)), names))
    return [n for n, name in enumerate(plans[1]) if plans[0].get(name) != plans[1][name]]


def test_a_batch_file_or_a_table_file_removed_changes_the_plan_of_the_shards_after_it(tmp_path: Path) -> None:
    """Rows of spans of files (joblib batch pairs, Parquet files and their row groups): the
    shards wholly before a removed file keep their plan, those after it do not."""
    from tests.write.test_converters import make_joblib_batches

    make_joblib_batches(tmp_path / "jb", [40, 40, 40], per_sample=True)
    before = pipeline.JoblibBatchSource(tmp_path / "jb")
    for name in ("x_1.job", "y_1.job"):
        (tmp_path / "jb" / name).unlink()
    assert _changed_shards(before, pipeline.JoblibBatchSource(tmp_path / "jb"), 10) == [4, 5, 6, 7]
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.write.sources.tables import ParquetSource

    (tmp_path / "pq").mkdir()
    for n in range(3):
        pq.write_table(pa.table({"y": np.arange(40) + 40 * n}), tmp_path / "pq" / f"{n}.parquet", row_group_size=20)
    before = ParquetSource(tmp_path / "pq")
    (tmp_path / "pq" / "1.parquet").unlink()
    assert _changed_shards(before, ParquetSource(tmp_path / "pq"), 10) == [4, 5, 6, 7]
    arrays = pipeline.ArraySource({"y": np.arange(120)})  # rows known by position only: assumed unchanged
    assert _changed_shards(arrays, pipeline.ArraySource({"y": np.arange(120) + 1}), 10) == []


def test_a_resume_refuses_another_tools_shard_under_its_names_and_offers_no_resume_for_it(tmp_path: Path,
                                                                                          npy_inputs) -> None:
    out = tmp_path / "out"
    out.mkdir()
    foreign = out / "shard-000000.tar"
    with tarfile.open(foreign, "w") as tar:  # webdataset's naming, another tool's samples
        tar.add(__file__, arcname="000000.json")
    before = foreign.read_bytes()
    with pytest.raises(pipeline.OutputExistsError) as refused:
        pipeline.write_shards(out, npy_inputs, **OPTIONS)
    assert "already exists" in str(refused.value) and "resume=True" not in str(refused.value)
    with pytest.raises(pipeline.OutputExistsError, match=re.escape(
            f"{foreign} is no shard of this library's (1 file(s) under the shard names this build writes hold no "
            f".msgpack records: another tool's?): a resume keeps or replaces a stopped build's own shards only")):
        pipeline.write_shards(out, npy_inputs, resume=True, **OPTIONS)
    assert foreign.read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["shard-000000.tar"]
