"""The command line: build, inspect and verify, with exit codes and messages users read."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipeline
from pipeline.cli import main
from tests.helpers import child_pids, command_line, read_back


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True)


@pytest.fixture
def built(tmp_path: Path) -> Path:
    np.save(tmp_path / "x.npy", np.arange(600, dtype=np.float32).reshape(200, 3))
    np.save(tmp_path / "y.npy", np.arange(200) % 7)
    result = run_cli("build", "arrays", str(tmp_path / "out"), "--array", f"x={tmp_path / 'x.npy'}",
                     "--array", f"y={tmp_path / 'y.npy'}", "--pack", "16", "--shard-samples", "64")
    assert result.returncode == 0, result.stderr
    assert "wrote 200 samples in 4 shards" in result.stderr and "samples/s" in result.stderr
    return tmp_path / "out"


def test_shard_bytes_none_is_no_size_limit_as_in_python(tmp_path: Path, capsys) -> None:
    """--shard-bytes took sizes only: no command line built what shard_bytes=None builds."""
    np.save(tmp_path / "x.npy", np.zeros((40, 1024), np.float32))  # 4 KiB a sample
    command = ["build", "arrays", "", "--array", f"x={tmp_path / 'x.npy'}", "--pack", "1", "--quiet"]
    shards = {}
    for size in ("40KiB", "none", "None"):
        command[2] = str(tmp_path / size)
        assert main([*command, "--shard-bytes", size]) == 0, capsys.readouterr().err
        shards[size] = len(pipeline.load_index(tmp_path / size).shards)
    assert shards["40KiB"] > 1 and shards["none"] == shards["None"] == 1
    usage = " ".join(run_cli("build", "arrays", "--help").stdout.split())
    assert "largest shard size, e.g. 256MiB, 1GB, or none for no size limit (default 256MiB)" in usage


def test_inspect_prints_schema_counts_and_samples(built: Path) -> None:
    result = run_cli("inspect", str(built), "--samples", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "200 in 4 shards, 13 records (pack=16)" in out
    assert "x                float32 [3]" in out and "y                int64 []" in out
    assert "000000000001" in out and "[3. 4. 5.]" in out


def test_verify_passes_then_names_shard_record_and_reason_of_corruption(built: Path) -> None:
    assert run_cli("verify", str(built), "--quiet").returncode == 0
    shard = built / "shard-000001.tar"
    index = pipeline.load_index(built)
    record_at = index.shards[1].offsets[2]
    data = bytearray(shard.read_bytes())
    data[record_at + 512 + 100] ^= 0xFF  # inside array bytes: decodes, but its checksum differs
    shard.write_bytes(bytes(data))
    result = run_cli("verify", str(built), "--quiet")
    assert result.returncode == 1
    assert re.search(rf"shard-000001\.tar record 2 \(byte {record_at}\): record '\d+' is corrupt: checksum", result.stdout)
    data[record_at + 512] = 0xC1  # the msgpack map header of record 2: undecodable
    shard.write_bytes(bytes(data))
    result = run_cli("verify", str(built), "--quiet")
    assert result.returncode == 1
    assert f"shard-000001.tar record 2 (byte {record_at}): record '000000000096': not a valid msgpack" \
        in result.stdout


def test_verify_reports_a_truncated_shard_and_a_missing_one(built: Path) -> None:
    (built / "shard-000000.tar").write_bytes((built / "shard-000000.tar").read_bytes()[:3000])
    (built / "shard-000002.tar").unlink()
    result = run_cli("verify", str(built), "--quiet")
    assert result.returncode == 1
    assert "shard-000000.tar: size is 3000 bytes" in result.stdout
    assert "shard-000002.tar: missing file" in result.stdout


def test_building_over_an_existing_index_needs_overwrite(built: Path, tmp_path: Path) -> None:
    args = ["build", "arrays", str(built), "--array", f"x={tmp_path / 'x.npy'}", "--quiet"]
    result = run_cli(*args)
    assert result.returncode == 1 and "; pass --overwrite (overwrite=True in Python)" in result.stderr
    assert "--resume (resume=True in Python) to keep what it wrote" in result.stderr and "Traceback" not in result.stderr
    assert run_cli(*args, "--overwrite").returncode == 0


def test_a_second_build_into_a_set_says_what_overwrite_deletes_and_how_to_keep_both(tmp_path: Path) -> None:
    """Week 2 added into week 1's folder: the refusal said only "pass --overwrite to replace it",
    and --overwrite deleted week 1's shards without a word."""
    np.save(tmp_path / "x.npy", np.zeros((500, 4), np.float32))
    week = ["build", "arrays", str(tmp_path / "set"), "--array", f"x={tmp_path / 'x.npy'}", "--shard-samples", "100"]
    assert run_cli(*week, "--prefix", "week1", "--quiet").returncode == 0
    refused = run_cli(*week, "--prefix", "week2")
    assert refused.returncode == 1 and (
        "set/index.json already exists, the index of a set of 5 shards (500 samples: week1-000000.tar, ...); pass "
        "--overwrite (overwrite=True in Python) to replace it, which deletes the shards it names") in refused.stderr
    assert (f"to keep them, build into another folder and read both sets as one: make_loader({{'old': "
            f"'{tmp_path / 'set'}', 'new': 'OTHER_FOLDER'}}) (README: Mixing shard sets)") in refused.stderr
    replaced = run_cli(*week, "--prefix", "week2", "--overwrite")
    assert replaced.returncode == 0
    assert "-> " + str(tmp_path / "set" / "index.json") + "; deleted 5 shards of an earlier build " \
        "(week1-000000.tar, ...)" in replaced.stderr


def test_bad_input_is_one_line_error_not_a_traceback(tmp_path: Path) -> None:
    result = run_cli("build", "files", str(tmp_path / "nope"), str(tmp_path / "out"),
                     "--labels", str(tmp_path / "l.json"), "--partition", str(tmp_path / "p.json"))
    assert result.returncode == 1 and "labels file" in result.stderr and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_cli("build", "arrays", str(tmp_path / "out"), "--array", "x")
    assert result.returncode == 2 and "expected NAME=PATH" in result.stderr
    np.save(tmp_path / "x.npy", np.arange(4))
    (tmp_path / "a-file").touch()
    for out in ("a-file", "a-file/sub"):  # an output that is, or is inside, a file
        result = run_cli("build", "arrays", str(tmp_path / out), "--array", f"x={tmp_path / 'x.npy'}")
        assert (result.returncode, result.stderr) == (1, f"error: {tmp_path / 'a-file'} is a file, not a folder: give "
                                                         f"an output folder that is not, nor is inside, a file\n")
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    for out in ("link", "link/sub"):  # an output that is, or is inside, a link to nothing
        result = run_cli("build", "arrays", str(tmp_path / out), "--array", f"x={tmp_path / 'x.npy'}")
        assert (result.returncode, result.stderr) == (1, f"error: {tmp_path / 'link'} is a link to {tmp_path / 'gone'}, "
                                                         f"which does not exist: make that folder, or give another "
                                                         f"output folder\n")
    result = run_cli("build", "arrays", str(tmp_path / "out"), "--array", f"x={tmp_path / 'x.npy'}", "--prefix", "")
    assert result.returncode == 1 and "shard name prefix '' is not a plain file name" in result.stderr


@pytest.mark.parametrize("extra, told", [([], "--resume"), (["--overwrite"], "--resume in place of --overwrite")])
def test_a_build_interrupted_says_how_to_finish_it(tmp_path: Path, extra: list[str], told: str) -> None:
    """Ctrl-C once the build wrote its first of 2,000 small shards (seconds of work)."""
    np.save(tmp_path / "x.npy", np.arange(20_000, dtype=np.float32))
    command = [sys.executable, "-m", "pipeline", "build", "arrays", str(tmp_path / "out"), "--array",
               f"x={tmp_path / 'x.npy'}", "--shard-samples", "10", "--pack", "1", "--quiet"]
    build = subprocess.Popen([*command, *extra], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "out" / "shard-000000.tar").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    build.send_signal(signal.SIGINT)  # (where it lands in a weakref callback, a shard's writer thread's end, Python
    _, stderr = build.communicate(timeout=60)  # would drop it: see pipeline.interrupts)
    assert (build.returncode, stderr) == (130, f"interrupted: run the same command with {told} to finish the build, "
                                               f"keeping the shards it finished\n")
    assert subprocess.run([*command, "--resume"], capture_output=True).returncode == 0
    assert read_back(tmp_path / "out")[1]["x"] == list(range(20_000))


def test_ctrl_c_while_the_pool_starts_is_one_line_not_the_workers_tracebacks(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the build's pool workers too, here while they import: each
    used to print a page of traceback above the build's line."""
    np.save(tmp_path / "x.npy", np.arange(20_000, dtype=np.float32))
    command = [sys.executable, "-m", "pipeline", "build", "arrays", str(tmp_path / "out"), "--array",
               f"x={tmp_path / 'x.npy'}", "--shard-samples", "10", "--pack", "1", "--workers", "2", "--quiet"]
    build = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def importing_numpy(pid: int) -> bool:  # (before its own signal handling is set, SIGINT ends a process silently)
        with contextlib.suppress(OSError):
            return "spawn_main" in command_line(pid) and "_multiarray_umath" in Path(f"/proc/{pid}/maps").read_text()
        return False

    deadline = time.monotonic() + 60
    while not any(map(importing_numpy, child_pids(build.pid))) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(build.pid, signal.SIGINT)  # the whole group, as a terminal sends it
    _, stderr = build.communicate(timeout=60)
    assert (build.returncode, stderr) == (130, "interrupted: run the same command with --resume to finish the build, "
                                               "keeping the shards it finished\n")
    assert not child_pids(build.pid)
    assert subprocess.run([*command, "--resume"], capture_output=True).returncode == 0
    assert read_back(tmp_path / "out")[1]["x"] == list(range(20_000))


def test_a_build_that_ignores_ctrl_c_has_workers_that_ignore_it_too(tmp_path: Path) -> None:
    """Started from a script with SIGINT ignored (as ``nohup`` or ``&`` in a script do), a build
    runs to its end however often the group is sent SIGINT: its workers used to take it up."""
    np.save(tmp_path / "x.npy", np.arange(20_000, dtype=np.float32))
    command = [sys.executable, "-m", "pipeline", "build", "arrays", str(tmp_path / "out"), "--array",
               f"x={tmp_path / 'x.npy'}", "--shard-samples", "10", "--pack", "1", "--workers", "2", "--quiet"]
    build = subprocess.Popen(["sh", "-c", 'trap "" INT; exec "$@"', "sh", *command], stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "out" / "shard-000010.tar").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    for _ in range(5):
        os.killpg(build.pid, signal.SIGINT)
        time.sleep(0.02)
    _, stderr = build.communicate(timeout=60)
    assert (build.returncode, stderr) == (0, "")
    assert read_back(tmp_path / "out")[1]["x"] == list(range(20_000))


def test_a_name_given_twice_is_an_error_and_a_text_fill_may_be_empty(tmp_path: Path, capsys) -> None:
    np.save(tmp_path / "a.npy", np.arange(10.0))
    np.save(tmp_path / "b.npy", np.arange(10))
    twice = ["build", "arrays", str(tmp_path / "out"), "--array", f"x={tmp_path / 'a.npy'}", "--array",
             f"x={tmp_path / 'b.npy'}"]  # the last would win, and a.npy be dropped
    with pytest.raises(SystemExit, match=re.escape(f"error: --array x= is given twice ('{tmp_path / 'a.npy'}' and "
                                                   f"'{tmp_path / 'b.npy'}'): give each name once")):
        main(twice)
    with pytest.raises(SystemExit, match=re.escape("error: --dtype x= is given twice ('float32' and 'int32')")):
        main([*twice[:5], "--dtype", "x=float32", "--dtype", "x=int32"])
    assert not (tmp_path / "out").exists()
    pq.write_table(pa.table({"caption": ["a", None, "c"]}), tmp_path / "t.parquet")
    assert main(["build", "parquet", str(tmp_path / "t.parquet"), str(tmp_path / "table"), "--fill", "caption=",
                 "--quiet"]) == 0
    assert read_back(tmp_path / "table")[1]["caption"] == ["a", "", "c"]


def test_seed_without_validation_is_told_unused_and_with_it_chooses_the_split(tmp_path: Path, capsys) -> None:
    """A build given --seed without --validation wrote every sample in the order given and said
    nothing: a user who took the seed for a shuffle of the build got none. It is told (a warning,
    not an error: a script may pass its seed whether it splits or not)."""
    np.save(tmp_path / "x.npy", np.arange(40))
    command = ["build", "arrays", str(tmp_path / "out"), "--array", f"x={tmp_path / 'x.npy'}", "--quiet"]
    assert main([*command, "--seed", "7"]) == 0
    assert capsys.readouterr().err == ("warning: seed=7 (--seed) chooses the samples validation= (--validation) "
                                       "holds out, and none is given: every sample is written, in the order given "
                                       "(the seed is not used)\n")
    assert read_back(tmp_path / "out")[1]["x"] == list(range(40))
    with pytest.warns(UserWarning, match=re.escape("seed=7 (--seed) chooses the samples validation= "
                                                   "(--validation) holds out, and none is given")) as told:
        pipeline.write_shards(tmp_path / "py", {"x": np.arange(40)}, seed=7, quiet=True)  # as in Python
    assert told[0].filename == __file__  # (the user's line)
    for bad in (-1, None, 1.5):  # refused as with validation=, not warned of as unused
        with pytest.raises(ValueError, match=re.escape(f"seed must be an integer >= 0 (it picks the validation "
                                                       f"rows), got {bad!r}")):
            pipeline.write_shards(tmp_path / "bad", {"x": np.arange(40)}, seed=bad, quiet=True)
    assert not (tmp_path / "bad").exists()
    held_out = []
    for seed in (["--seed", "7"], [], ["--seed", "0"]):
        assert main([*command, "--validation", "10", *seed, "--overwrite"]) == 0
        assert capsys.readouterr().err == ""
        held_out.append(sorted(int(x) for x in read_back(tmp_path / "out" / "validation")[1]["x"]))
    assert held_out[1] == held_out[2] != held_out[0]  # 0 is the default, and 7 draws another split
    assert all(len(rows) == 10 for rows in held_out)


def test_a_folder_of_splits_given_for_a_shard_set_is_an_error_naming_its_splits(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((20, 2), np.float32))
    assert run_cli("build", "arrays", str(tmp_path / "out"), "--array", f"x={tmp_path / 'x.npy'}", "--validation",
                   "0.2", "--quiet").returncode == 0
    splits = f"{tmp_path / 'out'} holds the shard sets 'train', 'validation' (one per split): pass one of them, " \
             f"e.g. {tmp_path / 'out' / 'train'}"
    result = run_cli("tune", "--workers", "0", str(tmp_path / "out"))  # (inspect and verify take each split)
    assert (result.returncode, result.stderr) == (1, f"error: {tmp_path / 'out' / 'index.json'}: no such index "
                                                     f"file; {splits}\n")
    with pytest.raises(pipeline.SourceError, match=re.escape(f"valid: no such shard or folder; {splits}")):
        pipeline.make_loader(tmp_path / "out" / "valid")


def test_a_folder_of_shards_without_an_index_is_an_error_that_says_how_to_index_them(tmp_path: Path) -> None:
    pipeline.write_shards(tmp_path / "sets" / "other", {"x": np.zeros(4)}, quiet=True)  # a set beside it: no split
    pipeline.write_shards(tmp_path / "sets" / "bare", {"x": np.zeros(8)}, shard_samples=4, quiet=True)
    for name in ("index.json", "index.bin"):
        (tmp_path / "sets" / "bare" / name).unlink()
    bare = tmp_path / "sets" / "bare"
    with pytest.raises(pipeline.IndexFormatError, match=re.escape(
            f"{bare} holds 2 shard(s) without an index: index them in place with 'pipeline index {bare}'")):
        pipeline.make_loader(bare)
    assert run_cli("index", str(bare), "--quiet").returncode == 0 and pipeline.load_index(bare).samples == 8


def test_an_option_of_another_command_is_refused_with_the_usage_of_this_one(tmp_path: Path) -> None:
    result = run_cli("build", "files", "data", "out", "--labels", "l.json", "--partition", "p.json",
                     "--validation", "0.1")
    assert result.returncode == 2 and result.stderr.startswith("usage: pipeline build files ")
    assert result.stderr.endswith("pipeline build files: error: unrecognized arguments: --validation 0.1\n")
    result = run_cli("--bogus", "inspect", "out")
    assert result.returncode == 2 and result.stderr.endswith("pipeline: error: unrecognized arguments: --bogus\n")


def test_build_files_and_folder_from_the_cli(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for n in range(6):
        np.save(data / f"s{n}.npy", np.full(3, n, np.int16))
    (tmp_path / "labels.json").write_text(json.dumps({f"s{n}": n for n in range(6)}))
    (tmp_path / "partition.json").write_text(json.dumps({"train": ["s0", "s1", "s2", "s3"],
                                                         "validation": ["s4", "s5"]}))
    result = run_cli("build", "files", str(data), str(tmp_path / "out"), "--labels", str(tmp_path / "labels.json"),
                     "--partition", str(tmp_path / "partition.json"), "--quiet")
    assert result.returncode == 0, result.stderr
    assert pipeline.load_index(tmp_path / "out" / "validation").samples == 2
    result = run_cli("build", "folder", str(data), str(tmp_path / "folder-out"), "--quiet")
    assert result.returncode == 0, result.stderr
    assert pipeline.load_index(tmp_path / "folder-out").fields["npy"].dtype == "bytes"


def test_demo_builds_verifies_and_trains_far_above_chance(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parent.parent / "scripts" / "demo.py"
    result = subprocess.run([sys.executable, str(script), "--samples", "20000", "--epochs", "1", "--out", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert pipeline.load_index(tmp_path / "train").samples == 18000
    assert pipeline.load_index(tmp_path / "validation").samples == 2000
    assert "built and verified" in result.stdout
    accuracy = float(re.search(r"validation accuracy ([\d.]+)%", result.stdout).group(1))
    assert accuracy > 60  # 10 classes: chance is 10%


def test_a_build_stopped_by_a_bad_input_says_how_to_finish_it_and_what_overwrite_removed(tmp_path: Path) -> None:
    """A file found bad while the shards are written: before, the error alone, and a set that
    --overwrite replaced was gone without a word. What is said is of this run: not after an
    error found before planning, with an earlier run's plan left in the folder."""
    (tmp_path / "data").mkdir()
    for n in range(12):
        np.save(tmp_path / "data" / f"{n}.npy", np.full(4, n, np.float32))
    (tmp_path / "labels.json").write_text(json.dumps({str(n): n % 2 for n in range(12)}))
    (tmp_path / "partition.json").write_text(json.dumps({"train": [str(n) for n in range(12)]}))
    command = ["build", "files", str(tmp_path / "data"), str(tmp_path / "out"), "--labels",
               str(tmp_path / "labels.json"), "--partition", str(tmp_path / "partition.json"), "--shard-samples", "4",
               "--quiet"]
    assert run_cli(*command).returncode == 0
    np.save(tmp_path / "data" / "9.npy", np.array([None]))  # pickled objects: refused when loaded
    told = (f"error: {tmp_path / 'data' / '9.npy'}: holds an array of Python objects, which only pickle could load: "
            f"save a numeric array\nthe build stopped part way")
    result = run_cli(*command, "--overwrite")
    assert (result.returncode, result.stderr) == (1, f"{told} (the set in {tmp_path / 'out' / 'train'} was removed "
                                                     f"as this build began: --overwrite replaces it); once the cause "
                                                     f"is mended (an input, or an option the error names), run the "
                                                     f"command again with --resume in place of --overwrite to finish "
                                                     f"it, keeping the shards it finished\n")
    assert not (tmp_path / "out" / "train" / "index.json").exists()
    result = run_cli(*command, "--resume")
    assert (result.returncode, result.stderr) == (1, f"{told}; once the cause is mended (an input, or an option the "
                                                     f"error names), run the command again with --resume to finish "
                                                     f"it, keeping the shards it finished\n")
    (tmp_path / "short.json").write_text(json.dumps({str(n): n % 2 for n in range(11)}))  # no label for ID 11
    short = [str(tmp_path / "short.json") if arg == str(tmp_path / "labels.json") else arg for arg in command]
    for wrong in ([*command, "--resume", "--overwrite"], [*short, "--resume"]):  # refused before planning
        result = run_cli(*wrong)
        assert result.returncode == 1 and "the build stopped part way" not in result.stderr, result.stderr
    np.save(tmp_path / "data" / "9.npy", np.full(4, 9, np.float32))
    assert run_cli(*command, "--resume").returncode == 0
    assert sorted(int(y[0]) for y in read_back(tmp_path / "out" / "train")[1]["x"]) == list(range(12))
    np.save(tmp_path / "data" / "9.npy", np.array([None]))
    result = run_cli(*command[:3], str(tmp_path / "fresh"), *command[4:], "--overwrite")  # no set there to remove
    assert result.returncode == 1 and result.stderr.startswith(f"{told.replace('out', 'fresh')}; once")
