"""A resume after a build that was replacing another, or after one split of a split build was
finished under other inputs or options: never the old build's shards passed off as the new's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.storage.destination import Destination
from pipeline.write import run as run_module
from tests.helpers import read_back
from tests.images import image_folder

OPTIONS = dict(pack=8, shard_samples=100, quiet=True)


def test_an_overwrite_stopped_while_it_deletes_the_old_shards_is_resumed_with_none_of_them(tmp_path: Path,
                                                                                           monkeypatch) -> None:
    """The old index goes first, then the old shards one by one: a build killed between the two
    left them with no plan, and the resume its error asks for kept every one as the new build's."""
    out = tmp_path / "out"
    pipeline.write_shards(out, {"x": np.zeros(600, np.float32)}, **OPTIONS)
    delete = Destination.delete

    def killed_at_the_first_shard(self, name: str) -> None:
        if name.endswith(".tar"):
            raise KeyboardInterrupt
        delete(self, name)
    monkeypatch.setattr(Destination, "delete", killed_at_the_first_shard)
    with pytest.raises(KeyboardInterrupt):
        pipeline.write_shards(out, {"x": np.ones(600, np.float32)}, overwrite=True, **OPTIONS)
    monkeypatch.setattr(Destination, "delete", delete)
    assert len(list(out.glob("*.tar"))) == 6 and not (out / "index.json").exists()
    pipeline.write_shards(out, {"x": np.ones(600, np.float32)}, resume=True, **OPTIONS)
    assert read_back(out)[1]["x"] == [1.0] * 600
    assert pipeline.verify(out) == []


def _split_rows(out: Path) -> dict[str, list[int]]:
    return {split: read_back(out / split)[1]["x"] for split in ("train", "validation")}


def test_a_finished_split_of_another_seed_is_written_again_by_the_resume(tmp_path: Path, capsys) -> None:
    """Killed after its training split's index, resumed under another seed: the training split
    was kept from the first seed, the validation split written from the second, and 85 of 1,000
    samples were in both and 85 in neither."""
    arrays = {"x": np.arange(1000)}
    pipeline.write_shards(tmp_path / "out", arrays, validation=0.1, seed=0, **OPTIONS)
    for path in (tmp_path / "out" / "validation").iterdir():  # as a kill after train/index.json leaves it
        path.unlink()
    pipeline.write_shards(tmp_path / "out", arrays, validation=0.1, seed=1, resume=True, **{**OPTIONS, "quiet": False})
    assert ("out/train/index.json: a split the stopped build finished, of other rows than this one plans (an "
            "input, or the seed or size of the split, changed since): writing it again") in capsys.readouterr().err
    pipeline.write_shards(tmp_path / "fresh", arrays, validation=0.1, seed=1, **OPTIONS)
    assert _split_rows(tmp_path / "out") == _split_rows(tmp_path / "fresh")
    pipeline.write_shards(tmp_path / "out", arrays, validation=0.1, seed=1, resume=True, **{**OPTIONS, "quiet": False})
    assert "is already complete (1 shards); nothing to resume" in capsys.readouterr().err


def test_a_resume_refuses_a_finished_set_of_other_rows(tmp_path: Path) -> None:
    """A file renamed after the build finished: the same shards and counts, other rows in them;
    the resume said "nothing to resume", leaving the set of the old names."""
    for number in range(30):
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f"{number:03d}.txt").write_text(str(number))
    pipeline.build_folder(tmp_path / "in", tmp_path / "out", shard_samples=10, quiet=True)
    (tmp_path / "in" / "005.txt").rename(tmp_path / "in" / "100.txt")
    with pytest.raises(pipeline.OutputExistsError, match=r"out/index.json is the index of a finished build of other "
                       r"rows than this one plans \(its input, or the seed or size of its split, changed since\); "
                       r"pass overwrite=True \(--overwrite\) to build it again"):
        pipeline.build_folder(tmp_path / "in", tmp_path / "out", shard_samples=10, resume=True, quiet=True)
    pipeline.build_folder(tmp_path / "in", tmp_path / "out", shard_samples=10, overwrite=True, quiet=True)
    assert read_back(tmp_path / "out")[0][-1] == "100"


def test_parts_merged_keep_the_plan_of_the_whole_build(tmp_path: Path) -> None:
    arrays = {"x": np.arange(1000)}
    whole = pipeline.write_shards(tmp_path / "whole", arrays, **OPTIONS)
    for i in range(3):
        pipeline.write_shards(tmp_path / "parts", arrays, part=pipeline.Part(i, 3), **OPTIONS)
    merged, _ = pipeline.merge_index_files([tmp_path / "parts"])
    assert merged.plan == whole.plan is not None
    assert pipeline.load_index(tmp_path / "parts").plan == whole.plan


def test_a_damaged_image_of_the_validation_split_removed_before_the_resume_moves_no_sample(tmp_path: Path) -> None:
    """The training split is finished when the build stops at a damaged image of the validation
    split; removing it, as the error asks, renumbers the rows, and so changes both splits."""
    written = image_folder(tmp_path / "root", {"a": 20, "b": 20, "c": 20}, size=(8, 8))
    held_out = pipeline.validation_rows(len(written), 0.2, seed=3)
    bad = tmp_path / "root" / next(name for row, name in enumerate(sorted(written))
                                   if row in held_out and name.endswith(".jpg"))
    bad.write_bytes(bad.read_bytes()[:40])
    options = dict(shard_samples=3, validation=0.2, seed=3, max_side=4, quiet=True)
    with pytest.raises(pipeline.SampleError, match=f"{bad.parent.name}/{bad.name}: cannot read the image"):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", **options)
    assert (tmp_path / "out" / "train" / "index.json").exists()
    bad.unlink()
    pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", resume=True, **options)
    pipeline.build_imagefolder(tmp_path / "root", tmp_path / "fresh", **options)
    keys = []
    for split in ("train", "validation"):
        assert read_back(tmp_path / "out" / split) == read_back(tmp_path / "fresh" / split)
        keys += read_back(tmp_path / "out" / split)[0]
    assert len(keys) == len(set(keys)) == 59


def test_a_finished_part_of_a_split_build_resumed_under_another_seed_is_refused(tmp_path: Path) -> None:
    """A part writes no <split>/index.json, so a part's resume was taken for one stopped in its
    other split, and written again with the new seed: merged with a part of the old seed, train and
    validation shared samples."""
    arrays = {"x": np.arange(1000)}
    pipeline.write_shards(tmp_path / "out", arrays, validation=0.2, seed=0, part=pipeline.Part(0, 2), **OPTIONS)
    with pytest.raises(pipeline.OutputExistsError, match=r"train/index.part-00000-of-00002.json is the index of a "
                       r"finished build of other rows than this one plans"):
        pipeline.write_shards(tmp_path / "out", arrays, validation=0.2, seed=1, part=pipeline.Part(0, 2), resume=True,
                              **OPTIONS)
    for path in (tmp_path / "out" / "validation").iterdir():  # stopped in its second split: written again
        path.unlink()
    pipeline.write_shards(tmp_path / "out", arrays, validation=0.2, seed=1, part=pipeline.Part(0, 2), resume=True,
                          **OPTIONS)
    pipeline.write_shards(tmp_path / "out", arrays, validation=0.2, seed=1, part=pipeline.Part(1, 2), **OPTIONS)
    rows = {}
    for split in ("train", "validation"):
        pipeline.merge_index_files([tmp_path / "out" / split])
        rows[split] = {int(sample["x"]) for _, sample in pipeline.iter_samples(tmp_path / "out" / split)}
    assert not rows["train"] & rows["validation"] and len(rows["train"] | rows["validation"]) == 1000


def _killed_at_shard(monkeypatch, out: Path, prefix: str, at: int) -> None:
    """A build of 600 samples in ``out`` under ``prefix``, killed while it writes shard ``at``
    (its temporary file left, as a SIGKILL leaves it)."""
    write_shard = run_module.write_shard

    def killed(run, i, on_rows=None):
        if run.first_number + i == at:
            (out / f".{prefix}-{at:06d}.tar.tmp-99999").write_bytes(b"half a shard")
            raise KeyboardInterrupt
        return write_shard(run, i, on_rows)
    monkeypatch.setattr(run_module, "write_shard", killed)
    with pytest.raises(KeyboardInterrupt):
        pipeline.write_shards(out, {"x": np.zeros(600, np.float32)}, prefix=prefix, **OPTIONS)
    monkeypatch.setattr(run_module, "write_shard", write_shard)


@pytest.mark.parametrize("how", ["overwrite", "resume"])
def test_a_killed_build_run_again_under_another_prefix_leaves_none_of_its_files(tmp_path: Path, monkeypatch,
                                                                               how: str) -> None:
    """The killed run's shards (week1-*.tar) and temporary file stayed beside the new ones, which a
    later pipeline index of the folder took for data; a file its plan did not name stays."""
    out = tmp_path / "out"
    _killed_at_shard(monkeypatch, out, "week1", at=3)
    (out / "notes-000000.tar").write_bytes(b"not the plan's")
    pipeline.write_shards(out, {"x": np.ones(600, np.float32)}, prefix="week2", **{how: True}, **OPTIONS)
    assert sorted(p.name for p in out.iterdir()) == ["index.bin", "index.json", "notes-000000.tar",
                                                      *(f"week2-{n:06d}.tar" for n in range(6))]


def test_a_split_build_replaced_with_overwrite_that_stops_in_one_split_leaves_no_old_split(tmp_path: Path) -> None:
    """A typo in a validation label stopped the overwrite once train was written: the old
    validation set stayed beside the new train (rows in both), and the resume kept it."""
    out, n = tmp_path / "out", 1000
    options = dict(validation=0.2, seed=0, dtypes={"y": "int64"}, **OPTIONS)
    pipeline.write_shards(out, {"x": np.arange(n), "y": np.zeros(n)}, **options)
    labels = np.ones(n)
    labels[pipeline.validation_rows(n, 0.2, seed=0).max()] = 1.5  # (its last row: found once train is written)
    with pytest.raises(pipeline.SampleError):
        pipeline.write_shards(out, {"x": np.arange(n), "y": labels}, overwrite=True, **options)
    assert not (out / "validation" / "index.json").exists()
    pipeline.write_shards(out, {"x": np.arange(n), "y": np.ones(n)}, resume=True, **options)
    assert {split: set(read_back(out / split)[1]["y"]) for split in ("train", "validation")} == \
        {"train": {1}, "validation": {1}}
    assert sorted(p.name for p in (out / "validation").iterdir()) == ["index.bin", "index.json", "validation-000000.tar",
                                                                     "validation-000001.tar"]


@pytest.mark.parametrize("bad", [{"dtypes": {"y": "notatype"}}, {"dtypes": {"yy": "int32"}}, {"engine": "nope"},
                                 {"workers": 0}])
def test_a_split_overwrite_refused_for_its_options_keeps_the_old_splits(tmp_path: Path, bad: dict) -> None:
    """The old splits were retired before the options were checked: a mistyped --dtype lost the
    set it was to replace (on S3, every shard of it)."""
    out, options = tmp_path / "out", dict(validation=0.2, seed=0, **OPTIONS)
    pipeline.write_shards(out, {"y": np.arange(500)}, **options)
    with pytest.raises((ValueError, TypeError)):
        pipeline.write_shards(out, {"y": np.arange(500)}, overwrite=True, **{**options, **bad})
    assert {split: len(read_back(out / split)[0]) for split in ("train", "validation")} == \
        {"train": 400, "validation": 100}


def test_a_stopped_plan_deletes_shards_only_and_a_parts_plan_beside_a_whole_index_is_stale(tmp_path: Path,
                                                                                           capsys) -> None:
    """A plan naming index.json (hand-edited, damaged) had the build delete its own new index;
    a killed part's plan beside the index of a whole build made of the folder a stopped build."""
    from pipeline.cli import main

    out = tmp_path / "out"
    pipeline.write_shards(out, {"y": np.arange(300)}, **OPTIONS)
    (out / ".index.plan.json").write_text('{"index.json": "", "index.bin": "", "shard-000002.tar": ""}')
    pipeline.write_shards(out, {"y": np.arange(200)}, overwrite=True, **OPTIONS)
    assert sorted(p.name for p in out.iterdir()) == ["index.bin", "index.json", "shard-000000.tar", "shard-000001.tar"]
    (out / ".index.part-00001-of-00002.plan.json").write_text("{}")
    assert main(["index", str(out), "--overwrite", "--quiet"]) == 0 and pipeline.load_index(out).samples == 200
