"""Parallel and partial builds write the very shards a single process writes."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import IndexFormatError, OutputExistsError, Part, SampleError

from ..helpers import index_content

OPTIONS = dict(pack=32, shard_bytes=40 << 10, quiet=True)


def test_worker_processes_write_the_same_shards_and_index(tmp_path: Path, npy_inputs) -> None:
    single = pipeline.write_shards(tmp_path / "one", npy_inputs, **OPTIONS)
    pooled = pipeline.write_shards(tmp_path / "two", npy_inputs, workers=2, **OPTIONS)
    assert len(single.shards) > 8
    assert index_content(pooled) == index_content(single)
    for name in ("index.json", "index.bin"):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()


def test_parts_merged_equal_the_whole_build(tmp_path: Path, npy_inputs) -> None:
    whole = pipeline.write_shards(tmp_path / "whole", npy_inputs, **OPTIONS)
    for i in range(3):
        part = pipeline.write_shards(tmp_path / "parts", npy_inputs, part=Part(i, 3), **OPTIONS)
        assert part.part is not None and part.part.total_shards == len(whole.shards)
    merged, path = pipeline.merge_index_files([tmp_path / "parts"])
    assert path == str(tmp_path / "parts" / "index.json")
    assert index_content(merged) == index_content(whole)
    for name in ("index.json", "index.bin"):
        assert (tmp_path / "parts" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert pipeline.verify(tmp_path / "parts") == []


def test_parts_in_separate_folders_merge_with_relative_urls(tmp_path: Path, npy_inputs) -> None:
    for i in range(2):
        pipeline.write_shards(tmp_path / f"machine{i}", npy_inputs, part=Part(i, 2), **OPTIONS)
    merged, _ = pipeline.merge_index_files([tmp_path / "machine0", tmp_path / "machine1"],
                                           output=tmp_path / "index.json")
    assert merged.shards[0].url.startswith("machine0/") and merged.shards[-1].url.startswith("machine1/")
    assert pipeline.verify(tmp_path / "index.json") == []


def test_merging_with_a_part_missing_is_an_error(tmp_path: Path, npy_inputs) -> None:
    for i in (0, 2):
        pipeline.write_shards(tmp_path / "p", npy_inputs, part=Part(i, 3), **OPTIONS)
    with pytest.raises(IndexFormatError, match=r"missing parts \[1\]"):
        pipeline.merge_index_files([tmp_path / "p"])
    assert not (tmp_path / "p" / "index.json").exists()
    # the folder read as a set was told to index its shards in place, which made a set of the parts there
    with pytest.raises(IndexFormatError, match=re.escape(
            f"{tmp_path / 'p'} holds the partial indexes of a build in parts (index.part-00000-of-00003.json, ...): "
            f"join them with 'pipeline merge-index {tmp_path / 'p'}', which checks that every part is there")):
        pipeline.load_index(tmp_path / "p")
    with pytest.raises(OutputExistsError, match=re.escape("holds the partial indexes of a build in parts; join them "
                                                          "with 'pipeline merge-index'")):
        pipeline.index_shards(tmp_path / "p", quiet=True)


def test_parts_of_different_builds_are_not_merged(tmp_path: Path, npy_inputs) -> None:
    for i in (0, 1):
        pipeline.write_shards(tmp_path / "p", npy_inputs, part=Part(i, 3), **OPTIONS)
    pipeline.write_shards(tmp_path / "p", npy_inputs, part=Part(2, 3), **dict(OPTIONS, shard_bytes=20 << 10))
    with pytest.raises(IndexFormatError, match=r"part 2 belongs to a build of \d+ shards, part 0 to one of \d+: "
                       r"parts of different builds; build the parts of the one you do not mean again as the others "
                       r"were, with --overwrite"):
        pipeline.merge_index_files([tmp_path / "p"])


@pytest.mark.parametrize("other", [{"seed": 3}, {"shard_samples": 375}])
def test_parts_that_planned_other_rows_are_not_merged(tmp_path: Path, npy_inputs, other: dict) -> None:
    """A part built with another seed (or a shard size giving as many shards) merged:
    the set passed verify, with rows twice in it and others never."""
    options = dict(OPTIONS, validation=0.1, seed=1, shard_samples=400, shard_bytes=None, pack=25)
    for i in (0, 2):
        pipeline.write_shards(tmp_path / "p", npy_inputs, part=Part(i, 3), **options)
    pipeline.write_shards(tmp_path / "p", npy_inputs, part=Part(1, 3), **dict(options, **other))
    with pytest.raises(IndexFormatError, match=re.escape(
            "part 1 was built from other inputs or with other options than part 0 (another --seed or --validation, "
            "--shard-samples, --shard-bytes or --prefix, or inputs that changed between them; a table's files count "
            "by their sizes and modification times, which a copy keeps with cp -p or rsync -t): its rows would come "
            "twice, others never; build it again as the other parts were, with --overwrite")):
        pipeline.merge_index_files([tmp_path / "p" / "train"])
    pipeline.write_shards(tmp_path / "p", npy_inputs, part=Part(1, 3), overwrite=True, **options)
    pipeline.write_shards(tmp_path / "whole", npy_inputs, **options)
    for split in ("train", "validation"):
        pipeline.merge_index_files([tmp_path / "p" / split])
        assert (tmp_path / "p" / split / "index.json").read_bytes() == \
            (tmp_path / "whole" / split / "index.json").read_bytes()


def test_merging_a_split_build_in_parts_points_at_its_splits(tmp_path: Path, npy_inputs) -> None:
    for i in range(2):
        pipeline.write_shards(tmp_path / "out", npy_inputs, part=Part(i, 2), validation=0.1, **OPTIONS)
    with pytest.raises(IndexFormatError, match=re.escape(
            f"no partial indexes (index.part-*-of-*.json) in {tmp_path / 'out'}; the splits' are in "
            f"{tmp_path / 'out' / 'train'}, {tmp_path / 'out' / 'validation'}: merge each (pipeline merge-index "
            f"{tmp_path / 'out' / 'train'})")):
        pipeline.merge_index_files([tmp_path / "out"])
    merged = [pipeline.merge_index_files([tmp_path / "out" / split])[0] for split in ("train", "validation")]
    assert [index.samples for index in merged] == [4500, 500]
    with pytest.raises(ValueError, match=re.escape(f"no shards (.tar files) in {tmp_path}")):
        pipeline.index_shards(tmp_path)


def test_cli_part_builds_and_merge_index(tmp_path: Path, npy_inputs) -> None:
    for i in range(2):
        subprocess.run([sys.executable, "-m", "pipeline", "build", "arrays", str(tmp_path / "out"),
                        "--array", f"x={npy_inputs['x']}", "--array", f"y={npy_inputs['y']}",
                        "--pack", "32", "--shard-bytes", "40KiB", "--part", f"{i}/2", "--workers", "2",
                        "--quiet"], check=True)
    result = subprocess.run([sys.executable, "-m", "pipeline", "merge-index", str(tmp_path / "out")],
                            check=True, capture_output=True, text=True)
    assert "5000 samples" in result.stdout
    whole = pipeline.write_shards(tmp_path / "whole", npy_inputs, **OPTIONS)
    assert index_content(pipeline.load_index(tmp_path / "out")) == index_content(whole)


def test_a_failing_task_in_a_pool_fails_the_build_without_an_index(tmp_path: Path) -> None:
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((4000, 100), np.float32))
    with open(x, "r+b") as f:  # cut the file after its header: later rows are missing
        f.truncate(200_000)
    source = pipeline.ArraySource({"x": x})
    with pytest.raises(pipeline.SampleError, match=r"x\.npy: file ends at byte \d+, the array needs bytes up to \d+"):
        pipeline.build_shards(source, tmp_path / "out", shard_bytes=64 << 10, workers=2, quiet=True)
    assert not (tmp_path / "out" / "index.json").exists()
    assert not list((tmp_path / "out").glob(".*tmp*"))


class _CountingExecutor(ThreadPoolExecutor):
    """A user's executor that counts the tasks a build gives it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.tasks = 0

    def submit(self, *args, **kwargs):
        self.tasks += 1
        return super().submit(*args, **kwargs)


def test_a_large_build_is_cut_into_tasks_of_bounded_bytes_so_progress_moves_every_few_shards(
        tmp_path: Path, monkeypatch) -> None:
    """Four tasks per worker would move a 100 GB build's progress in a handful of jumps (and
    leave one worker finishing the last big task alone)."""
    x = np.arange(4096 * 256, dtype=np.float32).reshape(4096, 256)  # 4 MiB in 1 KiB samples
    monkeypatch.setattr("pipeline.write.run.TASK_BYTES", 512 << 10)
    with _CountingExecutor() as executor:
        index = pipeline.write_shards(tmp_path / "out", {"x": x}, shard_bytes=128 << 10, pack=1, workers=1,
                                      executor=executor, quiet=True)
    assert len(index.shards) == 66  # 62 samples a shard, each after its tar and msgpack headers
    assert executor.tasks == 8  # 4 MiB of samples in tasks of 512 KiB (not 4 tasks for 1 worker)
    loaded = np.concatenate([batch["x"].numpy() for batch in pipeline.make_loader(tmp_path / "out", batch_size=512, shuffle=False)])
    assert np.array_equal(loaded, x)


def test_a_script_that_builds_with_workers_outside_a_main_guard_is_told_to_add_one(tmp_path: Path) -> None:
    """Each worker imports the script and so starts the build again, which Python refuses: the
    build failed with BrokenProcessPool and nothing to say why."""
    script = tmp_path / "build.py"
    script.write_text("import numpy as np\nimport pipeline\n"
                      "pipeline.write_shards('out', {'x': np.zeros((5000, 64), np.float32)}, shard_bytes=64 << 10, "
                      "workers=2, quiet=True)\n")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    ours = "RuntimeError: a build worker process died (its output, if any, is above): in a script, build under `if"
    assert result.returncode == 1 and any(line.startswith(ours) for line in result.stderr.splitlines()), \
        result.stderr[-2000:]  # (a worker's own traceback may be printed after it)
    assert not (tmp_path / "out" / "index.json").exists()


NOTEBOOK_SOURCE = """
import numpy as np
import pipeline
class Squares(pipeline.Source):  # (a notebook's cell, as python -c: a __main__ the workers cannot import)
    fixed_shape = True
    def __len__(self):
        return 10_000
    def read(self, start, stop):
        i = np.arange(start, stop)
        return pipeline.RowBlock({"i": i, "square": i * i})
pipeline.build_shards(Squares(), "out", workers=2, quiet=True)
"""


def test_a_source_class_of_a_notebook_built_with_workers_is_told_to_go_in_a_module(tmp_path: Path) -> None:
    """The error said to add a __main__ guard, or blamed memory, and the unpickling error went to
    standard error, which a notebook's user does not see."""
    result = subprocess.run([sys.executable, "-c", NOTEBOOK_SOURCE], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and "a Source class of a notebook's or python -c's __main__ cannot be imported by " \
        "the workers: define it in a module, or build with workers=1" in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize(("part", "told"), [
    ((-1, 3), "part -1/3: parts count from 0, so the parts of 3 are 0/3 to 2/3"),  # wrote an empty part named -0001
    ((3, 3), "part 3/3: parts count from 0, so the parts of 3 are 0/3 to 2/3"),  # an IndexError
    ((0, 0), "part 0/0: N is the number of parts, at least 1"),  # a ZeroDivisionError
])
def test_a_part_out_of_range_is_refused_when_made(part: tuple[int, int], told: str) -> None:
    with pytest.raises(ValueError, match=re.escape(told)):
        Part(*part)


def test_a_part_given_as_a_tuple_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=re.escape("part takes pipeline.Part(I, N), part I of N counting from 0, "
                                                  "e.g. Part(0, 4); got (0, 2)")):
        pipeline.write_shards(tmp_path / "p", {"x": np.arange(10)}, part=(0, 2), quiet=True)
    assert not (tmp_path / "p").exists()


def test_merging_one_part_twice_names_both_files(tmp_path: Path, npy_inputs) -> None:
    for i in range(2):
        pipeline.write_shards(tmp_path / "out", npy_inputs, part=Part(i, 2), validation=0.1, **OPTIONS)
    train, validation = (tmp_path / "out" / split / "index.part-00000-of-00002.json" for split in ("train", "validation"))
    with pytest.raises(IndexFormatError, match=re.escape(
            f"{train} and {validation} are both part 0 of 2: give each part once, and each split's folder "
            f"(train, validation) to a merge of its own")):
        pipeline.merge_index_files([tmp_path / "out" / "train", tmp_path / "out" / "validation"])


def test_merging_parts_of_builds_cut_in_different_counts_names_them(tmp_path: Path, npy_inputs) -> None:
    pipeline.write_shards(tmp_path / "a", npy_inputs, part=Part(0, 2), **OPTIONS)
    pipeline.write_shards(tmp_path / "b", npy_inputs, part=Part(1, 3), **OPTIONS)
    with pytest.raises(IndexFormatError, match=re.escape(
            f"{tmp_path / 'b' / 'index.part-00001-of-00003.json'} is part 1 of 3, "
            f"{tmp_path / 'a' / 'index.part-00000-of-00002.json'} a part of 2: give the parts of one build")):
        pipeline.merge_index_files([tmp_path / "a", tmp_path / "b"], output=tmp_path / "index.json")


class _Miscounted(pipeline.Source):
    """90 rows where its length says 100 (a database that lost some), or one too many at the end."""

    def __init__(self, extra: int) -> None:
        self.extra = extra

    def __len__(self) -> int:
        return 100

    def read(self, start: int, stop: int) -> pipeline.RowBlock:
        end = min(stop, 90) if self.extra < 0 else stop + (self.extra if stop == 100 else 0)
        return pipeline.RowBlock({"i": np.arange(start, end)})


@pytest.mark.parametrize("extra, gave", [(-1, 0), (1, 11)])
def test_a_source_whose_read_gives_other_than_the_rows_asked_is_refused(tmp_path: Path, extra: int, gave: int) -> None:
    with pytest.raises(SampleError, match=re.escape(
            f"source: asked for 10 rows (samples 90 to 99, for shard shard-000009.tar), read() gave {gave}: a "
            f"Source's read(start, stop) returns stop - start rows, and __len__ counts every row it can read")):
        pipeline.build_shards(_Miscounted(extra), tmp_path / "out", shard_samples=10, workers=2, quiet=True)
    assert not (tmp_path / "out" / "index.json").exists()


class _EmptyFirstRead(pipeline.Source):
    def __len__(self) -> int:
        return 10

    def read(self, start: int, stop: int) -> pipeline.RowBlock:
        return pipeline.RowBlock({"i": np.arange(start, stop - 1)})


def test_a_short_first_read_which_sizes_the_shards_is_refused_as_any_other(tmp_path: Path) -> None:
    """It raised a bare StopIteration, which a map() or a generator around the build took for
    its end: no error reached the caller."""
    with pytest.raises(SampleError, match=re.escape(
            "source: asked for 1 rows (samples 0 to 0, read first, to size the shards), read() gave 0")):
        list(map(lambda source: pipeline.build_shards(source, tmp_path / "out", quiet=True), [_EmptyFirstRead()]))


class _RepeatedKeys(pipeline.Source):
    """Keys that come round again after ``cycle`` samples."""

    def __init__(self, cycle: int) -> None:
        self.cycle = cycle

    def __len__(self) -> int:
        return 40

    def read(self, start: int, stop: int) -> pipeline.RowBlock:
        return pipeline.RowBlock({"i": np.arange(start, stop)}, keys=[f"k{i % self.cycle}" for i in range(start, stop)])


def test_a_source_that_gives_a_key_twice_is_refused_naming_where(tmp_path: Path) -> None:
    """Across shards the build, verify and the loader took it (two samples of one __key__); within
    one, the build wrote an index of a set that every reader refused."""
    with pytest.raises(SampleError, match=re.escape(
            "source shard shard-000000.tar: sample key 'k0' is given twice, samples 0 and 7: a source's keys must be "
            "unique (give each sample its own)")):
        pipeline.build_shards(_RepeatedKeys(7), tmp_path / "within", shard_samples=10, quiet=True)
    with pytest.raises(SampleError, match=re.escape(
            "source: 20 sample key(s) are given twice, in different shards (one is in both shard-000000.tar and "
            "shard-000002.tar): a source's keys must be unique (give each sample its own); no index was written")):
        pipeline.build_shards(_RepeatedKeys(20), tmp_path / "across", shard_samples=10, workers=2, quiet=True)
    assert not (tmp_path / "within" / "index.json").exists() and not (tmp_path / "across" / "index.json").exists()
    pipeline.build_shards(_RepeatedKeys(40), tmp_path / "unique", shard_samples=10, workers=2, quiet=True)
    assert sorted(key for key, _ in pipeline.iter_samples(tmp_path / "unique")) == sorted(f"k{i}" for i in range(40))
