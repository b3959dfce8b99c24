"""An input file that changes while a build reads it: an error naming it, never shards that mix
rows of two versions of the file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.cli import main
from pipeline.write.sources.arrays import FileColumn


def replaced(path: Path) -> None:
    """As a job that writes features anew does: a new file renamed over the old one."""
    np.save(path.with_name("new.npy"), np.ones((1000, 4), np.float32))
    os.replace(path.with_name("new.npy"), path)


def written_to(path: Path) -> None:
    """The same file, its rows rewritten in place (its size and inode unchanged)."""
    with open(path, "r+b") as file:
        file.seek(-16, os.SEEK_END)
        file.write(np.ones(4, np.float32).tobytes())
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 1_000_000))  # (a coarse clock may keep the time)


@pytest.mark.parametrize("change", [replaced, written_to])
@pytest.mark.parametrize("layout", ["npy", "npz"])
def test_an_array_file_changed_after_it_was_opened_stops_the_build_naming_it(tmp_path: Path, change, layout) -> None:
    """The build read a .npy by its path for every chunk: one replaced part way gave shards of
    62,496 rows of the old file and 937,504 of the new, and a build that said it succeeded."""
    x = np.zeros((1000, 4), np.float32)
    if layout == "npy":
        path = tmp_path / "x.npy"
        np.save(path, x)
        column = pipeline.open_npy(path)
    else:
        path = tmp_path / "x.npz"
        np.savez(path, x=x)
        column = pipeline.open_npz(path)["x"]
    change(path)
    with pytest.raises(pipeline.SampleError, match=f"{path}: changed while the build read it \\(replaced, or written "
                       f"to\\): rows of two versions of it would be mixed; once it stays as it is, build again with "
                       f"overwrite=True \\(--overwrite\\), not resume: the shards finished hold the old rows"):
        pipeline.write_shards(tmp_path / "out", {"x": column}, shard_samples=100, quiet=True)
    assert not (tmp_path / "out" / "index.json").exists()


def test_the_command_line_offers_no_resume_for_a_file_changed_part_way(tmp_path: Path, monkeypatch, capsys) -> None:
    """--resume, which a build stopped part way offers, would keep the shards of the old rows."""
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((1000, 4), np.float32))
    read = FileColumn.read

    def replaced_after_the_first_chunk(self, start: int, stop: int) -> np.ndarray:
        if start:
            replaced(path)
        return read(self, start, stop)
    monkeypatch.setattr(FileColumn, "read", replaced_after_the_first_chunk)
    assert main(["build", "arrays", str(tmp_path / "out"), "--array", f"x={path}", "--shard-samples", "100",
                 "--quiet"]) == 1
    error = capsys.readouterr().err
    assert "not resume: the shards finished hold the old rows" in error and "--resume" not in error, error
    assert list((tmp_path / "out").glob("*.tar"))  # (the first shard was written)


def test_an_array_file_left_as_it_is_builds(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.arange(1000))
    pipeline.write_shards(tmp_path / "out", {"x": pipeline.open_npy(tmp_path / "x.npy")}, shard_samples=100,
                          workers=2, quiet=True)
    assert pipeline.load_index(tmp_path / "out").samples == 1000 and pipeline.verify(tmp_path / "out") == []

