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


def test_a_part_that_falls_on_no_shard_does_not_warn(tmp_path: Path, capsys) -> None:
    """3 shards built as 5 parts: the parts of none warned that the set was empty."""
    x = np.zeros((300, 3), np.float32)
    for i in range(5):
        pipeline.write_shards(tmp_path / "out", {"x": x}, shard_samples=100, part=pipeline.Part(i, 5))
    assert "warning" not in capsys.readouterr().err
    assert pipeline.merge_index_files([tmp_path / "out"])[0].samples == 300


def test_a_build_of_samples_or_one_that_kept_them_does_not_warn() -> None:
    for kept in (False, True):
        log = io.StringIO()
        progress = BuildProgress(10, "arrays -> out", stream=log)
        progress.update(10, 4096, kept=kept)
        summary = progress.close("out/index.json")
        assert log.getvalue() == summary + "\n" and "warning" not in summary


def test_a_long_shard_moves_the_progress_as_its_chunks_are_written(tmp_path: Path, monkeypatch, capsys) -> None:
    """A build of 15,000 files into one shard showed 0 samples done until the shard was whole."""
    monkeypatch.setattr("pipeline.write.progress.LOG_EVERY_S", 0.0)  # a line at every count (a log, not a bar)
    monkeypatch.setattr("pipeline.write.run._CHUNK_BYTES", 1000 * 8)  # chunks of 1,000 rows of 8 bytes
    pipeline.write_shards(tmp_path / "out", {"x": np.arange(3000, dtype=np.int64)}, pack=1, shard_samples=2500)
    lines = capsys.readouterr().err.splitlines()
    where = f"arrays -> {tmp_path / 'out'}"
    assert [line.split(", ")[:2] for line in lines[:-1]] == [
        [f"{where}: 1,000/3,000 samples (33%)", "0 shards"], [f"{where}: 2,000/3,000 samples (67%)", "0 shards"],
        [f"{where}: 2,500/3,000 samples (83%)", "0 shards"], [f"{where}: 2,500/3,000 samples (83%)", "1 shards"],
        [f"{where}: 3,000/3,000 samples (100%)", "1 shards"], [f"{where}: 3,000/3,000 samples (100%)", "2 shards"]]
    assert lines[-1].startswith("wrote 3000 samples in 2 shards, ")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_counts_a_shard_once_whether_its_chunks_were_shown_or_not() -> None:
    progress = BuildProgress(25, "arrays -> out", stream=_Terminal())
    progress.advance(4)
    progress.advance(6)
    assert progress._bar is not None and progress._bar.n == 10
    progress.update(10, 1000)  # the shard of those chunks
    progress.update(5, 500, kept=True)  # a shard an earlier run finished
    progress.update(10, 1000)  # a shard whose chunks were not shown
    assert progress._bar.n == 25 and (progress.samples, progress.kept_samples, progress.shards) == (20, 5, 2)
    assert progress.close("out/index.json").startswith("wrote 20 samples in 2 shards and kept 1 shards (5 samples)")


def test_a_build_that_only_kept_shards_says_so_without_rates() -> None:
    """Before: "wrote 0 samples in 0 shards and kept 2 shards ..., 0.0 MB, ... (0 samples/s, 0.0 MB/s)"."""
    progress = BuildProgress(10, "arrays -> out", quiet=True)
    progress.update(5, 500, kept=True)
    progress.update(5, 500, kept=True)
    assert progress.close("out/index.json") == ("kept 2 shards (10 samples) that an earlier run finished; wrote none "
                                                "-> out/index.json")
