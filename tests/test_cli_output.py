"""What the command line shows a person: help on every argument and an example for every
command, a progress bar on a terminal only, plain lines in a log, errors on a line of their own."""

from __future__ import annotations

import argparse
import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import joblib
import numpy as np

from pipeline.cli import make_parser
from pipeline.write import progress
from pipeline.write.progress import BuildProgress


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every command's parser, with its path (``("build", "joblib")``), leaves first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, path + (name,))
    yield path, parser


def test_every_argument_has_help_and_every_command_an_example() -> None:
    parser = make_parser()
    assert parser.format_usage().startswith("usage: pipeline ")
    leaves = 0
    for path, sub in commands(parser):
        for action in sub._actions:
            assert action.help and action.help != argparse.SUPPRESS, (path, action.dest)
        if not any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
            leaves += 1
            assert sub.epilog and sub.epilog.startswith("examples:\n  pipeline " + " ".join(path)), path
            assert sub.prog == "pipeline " + " ".join(path)
    assert leaves == 12  # build arrays/joblib/files/folder/imagefolder/parquet/arrow, index, merge-index, inspect,
    # verify, tune


def test_in_a_log_progress_is_plain_periodic_lines(monkeypatch) -> None:
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    log = io.StringIO()
    bar = BuildProgress(3000, "arrays -> out", stream=log)
    for _ in range(3):
        bar.update(1000, 2_000_000)
    bar.close("out/index.json")
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[0].startswith("arrays -> out: 1,000/3,000 samples (33%), 1 shards, ")
    assert lines[2].startswith("arrays -> out: 3,000/3,000 samples (100%), 3 shards, ")
    assert lines[3].startswith("wrote 3000 samples in 3 shards, 6.0 MB, in ")


def test_a_build_into_a_log_writes_no_carriage_returns(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((5000, 4), np.float32))
    result = subprocess.run([sys.executable, "-m", "pipeline", "build", "arrays", str(tmp_path / "out"),
                             "--array", f"x={tmp_path / 'x.npy'}", "--shard-samples", "500"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr and result.stderr.startswith("wrote 5000 samples in 10 shards")


def run_on_a_terminal(command: list[str]) -> tuple[int, str]:
    """``command`` with a terminal as its standard streams; its exit status and what it printed."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 40 rows, 160 columns
    process = subprocess.Popen(command, stdin=child, stdout=child, stderr=child, close_fds=True)
    os.close(child)
    output = b""
    while True:
        try:
            data = os.read(main, 1 << 16)
        except OSError:  # the terminal closes when the process ends
            break
        if not data:
            break
        output += data
    os.close(main)
    return process.wait(), output.decode("utf-8", "replace")


def test_on_a_terminal_a_bar_shows_and_an_error_starts_a_line_of_its_own(tmp_path: Path) -> None:
    batches = tmp_path / "batches"
    batches.mkdir()
    for b in range(3):  # one file per batch; the last one's x has a row too few
        joblib.dump(np.full((100 - (b == 2), 4), b), batches / f"x_{b}.job")  # (batches that differ)
        joblib.dump(np.full(100, b), batches / f"y_{b}.job")
    status, output = run_on_a_terminal([sys.executable, "-m", "pipeline", "build", "joblib", str(batches),
                                        str(tmp_path / "out"), "--shard-samples", "50", "--pack", "10"])
    assert status == 1
    error = output.index("error: ")
    assert f"joblib batches {batches} -> " in output[:error]  # the bar
    assert output[error - 1] == "\n", output
    assert "x_2.job: 99 feature rows but 100 labels in its y file" in output[error:]


def test_a_reader_that_leaves_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """``pipeline inspect DIR | head -1``: no 'Broken pipe' error (for verify, exit 1 would say a
    shard failed). The output (280 KB) is more than the pipe holds, so the command is still
    writing when the reader leaves."""
    import pipeline

    pipeline.write_shards(tmp_path / "s", {"x": np.zeros((4000, 8), np.float32)}, quiet=True)
    run = subprocess.Popen([sys.executable, "-m", "pipeline", "inspect", str(tmp_path / "s"), "--samples", "4000"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert run.stdout.readline().startswith("index ")
    run.stdout.close()  # as head does after its line
    assert run.wait(timeout=60) == 141  # 128 + SIGPIPE, as a shell tool's
    assert run.stderr.read() == ""


def test_a_command_run_with_its_output_closed_succeeds(tmp_path: Path) -> None:
    """``pipeline build ... >&-`` (a daemon's, a job runner's): Python's sys.stdout is None, and
    every command ended with a traceback of its flush and exit 1, a complete build too."""
    np.save(tmp_path / "x.npy", np.arange(100))
    for command in (["build", "arrays", str(tmp_path / "s"), "--array", f"x={tmp_path / 'x.npy'}"],
                    ["verify", str(tmp_path / "s")], ["inspect", str(tmp_path / "s")]):
        run = subprocess.run([sys.executable, "-m", "pipeline", *command], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1), timeout=120)
        assert (run.returncode, "Traceback" in run.stderr) == (0, False), run.stderr


def test_names_a_terminal_cannot_show_are_escaped_not_an_error(tmp_path: Path) -> None:
    """Under an ASCII locale, inspect of a set with a field named 'chat-é' printed nothing but
    "error: 'ascii' codec can't encode character"."""
    import pipeline

    pipeline.write_shards(tmp_path / "s", {"chat-é": np.arange(10)}, quiet=True)
    run = subprocess.run([sys.executable, "-m", "pipeline", "inspect", str(tmp_path / "s")], capture_output=True,
                         env={**os.environ, "PYTHONIOENCODING": "ascii"}, timeout=120)
    assert run.returncode == 0, run.stderr
    assert b"chat-\\xe9" in run.stdout


def test_a_caller_in_the_same_process_keeps_its_streams_as_they_were(tmp_path: Path, monkeypatch) -> None:
    """main() run by a caller's own code (a notebook, a script) set its standard output to escape
    what it cannot encode, for good."""
    import pipeline
    from pipeline.cli import main

    pipeline.write_shards(tmp_path / "s", {"x": np.arange(10)}, quiet=True)
    caller = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", caller)
    assert main(["inspect", str(tmp_path / "s")]) == 0
    assert caller.errors == "strict"
