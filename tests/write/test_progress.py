"""The end of a build's output: a summary line, after a warning when the build had no samples
(an empty set is valid, but a loader reads it as nothing at all, silently)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

import pipeline
from pipeline.write.progress import BuildProgress


def test_a_build_of_no_samples_warns_before_its_summary(tmp_path: Path, capsys) -> None:
    index = pipeline.write_shards(tmp_path / "out", {"x": np.zeros((0, 3), np.float32)})
    assert index.samples == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (f"warning: wrote 0 samples (arrays -> {tmp_path / 'out'}): the set is empty, and a loader "
                        f"reading it yields nothing; is the input empty?")
    assert len(lines) == 2 and lines[1].startswith("wrote 0 samples in 0 shards, 0.0 MB, in ")
    pipeline.write_shards(tmp_path / "quiet", {"x": np.zeros((0, 3), np.float32)}, quiet=True)
    assert capsys.readouterr().err == ""


def test_a_build_of_samples_or_one_that_kept_them_does_not_warn() -> None:
    for kept in (False, True):
        log = io.StringIO()
        progress = BuildProgress(10, "arrays -> out", stream=log)
        progress.update(10, 4096, kept=kept)
        summary = progress.close("out/index.json")
        assert log.getvalue() == summary + "\n" and "warning" not in summary
