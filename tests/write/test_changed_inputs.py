"""An input file that changes while a build reads it: an error naming it, never shards that mix
rows of two versions of the file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.cli import main
from pipeline.write.sources.arrays import FileColumn
from pipeline.write.sources.table_arrow import ArrowSource
from pipeline.write.sources.tables import ParquetSource


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
                       f"to\\): rows of two versions of it would be mixed; once it stays as it is, build again \\(in "
                       f"Python, from a source made anew\\) with overwrite=True \\(--overwrite\\), not resume: the "
                       f"shards finished hold the old rows"):
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



def _table_files(folder: Path, suffix: str, value: float) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    paths = []
    for name in ("a", "b"):
        table = pa.table({"x": np.full(100, value)})
        path = folder / f"{name}{suffix}"
        if suffix == ".parquet":
            pq.write_table(table, path)
        else:
            with pa.ipc.new_file(path, table.schema) as writer:
                writer.write_table(table)
        paths.append(path)
    return paths


def _joblib_pairs(folder: Path, value: float) -> list[Path]:
    import joblib
    folder.mkdir(exist_ok=True)
    joblib.dump([np.full((4, 2), value)] * 3, folder / "x_4.job")  # (the recipe: a list of batches of 4)
    joblib.dump([np.arange(4)] * 3, folder / "y_4.job")
    return [folder / "x_4.job"]


SOURCES = {
    "parquet": (lambda folder, value: _table_files(folder, ".parquet", value), ParquetSource),
    "arrow": (lambda folder, value: _table_files(folder, ".arrow", value), ArrowSource),
    "joblib": (lambda folder, value: _joblib_pairs(folder / "job", value), None),
}


@pytest.mark.parametrize("layout", SOURCES)
def test_a_table_or_batch_file_changed_after_the_source_was_made_stops_the_build(tmp_path: Path, layout: str) -> None:
    """Files reopened by path, a row group or a batch file at a time: one replaced part way gave
    shards of rows of both versions, and a build that said it succeeded."""
    make, source_type = SOURCES[layout]
    paths = make(tmp_path, 0.0)
    source = pipeline.JoblibBatchSource(tmp_path / "job") if source_type is None else source_type(paths)
    later = tmp_path / "later"
    later.mkdir()
    newer = make(later, 1.0)[-1]  # the last file written anew, elsewhere, then renamed over the one read
    os.utime(newer, ns=(0, paths[-1].stat().st_mtime_ns + 1_000_000))
    os.replace(newer, paths[-1])
    with pytest.raises(pipeline.SampleError, match=re.escape(f"{paths[-1]}: changed while the build read it")):
        pipeline.build_shards(source, tmp_path / "out", shard_samples=50, quiet=True)


def test_a_file_replaced_by_one_of_the_same_size_and_time_is_told_by_its_inode(tmp_path: Path) -> None:
    """A copy that keeps times (cp -p, rsync -a, touch -r) renamed over the input: only its inode
    differs, which the check compares on the machine that took the version."""
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((1000, 4), np.float32))
    column = pipeline.open_npy(path)
    np.save(tmp_path / "new.npy", np.ones((1000, 4), np.float32))
    os.utime(tmp_path / "new.npy", ns=(0, path.stat().st_mtime_ns))
    os.replace(tmp_path / "new.npy", path)
    with pytest.raises(pipeline.SampleError, match=re.escape(f"{path}: changed while the build read it")):
        pipeline.write_shards(tmp_path / "out", {"x": column}, shard_samples=100, quiet=True)


def test_a_folder_given_for_an_array_file_is_named_as_one(tmp_path: Path) -> None:
    """It said "no such .npy file" of a folder that is there."""
    (tmp_path / "x").mkdir()
    with pytest.raises(IsADirectoryError, match=re.escape(f"{tmp_path / 'x'}: a folder, not a .npy file: name the "
                                                          f".npy file that holds the field")):
        pipeline.write_shards(tmp_path / "out", {"x": tmp_path / "x"}, quiet=True)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'y.npy'}: no such .npy file")):
        pipeline.open_npy(tmp_path / "y.npy")
