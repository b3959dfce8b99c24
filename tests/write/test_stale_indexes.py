"""A build never leaves behind another build's index naming the shards it wrote over: a
complete build and the parts of a build split into parts (``--part``) write the same shard
names, so the one's index would describe the other's bytes (a loader reading them then calls
sound shards corrupt, and ``merge-index`` joins stale parts with exit status 0)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import IndexFormatError, OutputExistsError, Part
from tests.helpers import read_back

OPTIONS = dict(prefix="shard", pack=4, quiet=True)


@pytest.fixture
def arrays() -> dict[str, np.ndarray]:
    return {"i": np.arange(2000), "x": np.random.default_rng(3).random((2000, 8), dtype=np.float32)}


def _ids(folder: Path) -> list[int]:
    return sorted(int(i) for i in read_back(folder)[1]["i"])


def test_a_complete_build_over_parts_removes_their_indexes(arrays, tmp_path: Path) -> None:
    out = tmp_path / "out"
    for i in range(2):
        pipeline.write_shards(out, arrays, part=Part(i, 2), shard_samples=250, **OPTIONS)  # 8 shards
    with pytest.raises(OutputExistsError, match=re.escape(
            f"{out / 'index.part-00000-of-00002.json'} already exists: the index of another build of the set in this "
            f"folder (one cut into parts), which this build replaces; pass overwrite=True (--overwrite) to replace it, "
            f"or write elsewhere")):
        pipeline.write_shards(out, arrays, shard_samples=1000, **OPTIONS)
    pipeline.write_shards(out, arrays, shard_samples=1000, overwrite=True, **OPTIONS)  # 2 shards
    assert sorted(p.name for p in out.iterdir()) == ["index.bin", "index.json", "shard-000000.tar", "shard-000001.tar"]
    with pytest.raises(IndexFormatError, match="no partial indexes"):
        pipeline.merge_index_files([out], overwrite=True)
    assert _ids(out) == list(range(2000))


def test_a_part_built_over_a_complete_set_names_its_index_and_replaces_it(arrays, tmp_path: Path) -> None:
    out = tmp_path / "out"
    pipeline.write_shards(out, arrays, shard_samples=250, **OPTIONS)
    with pytest.raises(OutputExistsError, match=re.escape(
            f"{out / 'index.json'} already exists: the index of another build of the set in this folder (a complete "
            f"one), which this build replaces; pass overwrite=True (--overwrite) to replace it, or write elsewhere")):
        pipeline.write_shards(out, arrays, part=Part(0, 2), shard_samples=500, **OPTIONS)
    with pytest.raises(OutputExistsError, match=re.escape(
            "which this build replaces; pass overwrite=True (--overwrite) in place of resume=True (--resume) to "
            "replace it")):
        pipeline.write_shards(out, arrays, part=Part(0, 2), shard_samples=500, resume=True, **OPTIONS)
    pipeline.write_shards(out, arrays, part=Part(0, 2), shard_samples=500, overwrite=True, **OPTIONS)
    assert not (out / "index.json").exists() and not (out / "index.bin").exists()
    pipeline.write_shards(out, arrays, part=Part(1, 2), shard_samples=500, overwrite=True, **OPTIONS)
    pipeline.merge_index_files([out])
    assert _ids(out) == list(range(2000))
    assert sorted(p.name for p in out.glob("*.tar")) == [f"shard-00000{n}.tar" for n in range(4)]  # not 8


def test_parts_of_another_count_are_another_build_and_parts_of_this_one_are_kept(arrays, tmp_path: Path) -> None:
    out = tmp_path / "out"
    for i in range(4):
        pipeline.write_shards(out, arrays, part=Part(i, 4), shard_samples=250, **OPTIONS)  # 8 shards
    with pytest.raises(OutputExistsError, match="index.part-00000-of-00004.json already exists: the index of another "
                                                "build of the set in this folder"):
        pipeline.write_shards(out, arrays, part=Part(0, 2), shard_samples=500, **OPTIONS)
    for i in range(2):  # the second part keeps the first's index: both are this build's
        pipeline.write_shards(out, arrays, part=Part(i, 2), shard_samples=500, overwrite=True, **OPTIONS)
    assert sorted(p.name for p in out.glob("index.part-*.json")) == [
        "index.part-00000-of-00002.json", "index.part-00001-of-00002.json"]
    pipeline.merge_index_files([out])
    assert _ids(out) == list(range(2000))
    assert sorted(p.name for p in out.glob("*.tar")) == [f"shard-00000{n}.tar" for n in range(4)]


def test_a_shard_writer_over_parts_removes_their_indexes_and_shards(arrays, tmp_path: Path) -> None:
    out = tmp_path / "out"
    for i in range(2):
        pipeline.write_shards(out, arrays, part=Part(i, 2), shard_samples=250, **OPTIONS)
    with pipeline.ShardWriter(out, prefix="w", overwrite=True) as writer:
        writer.write_columns(arrays)
    assert sorted(p.name for p in out.iterdir()) == ["index.bin", "index.json", "w-000000.tar"]
    assert _ids(out) == list(range(2000))


def test_an_index_another_part_took_away_meanwhile_is_no_error(tmp_path: Path) -> None:
    """Parts of one build started at once over a complete set on S3: one sees index.json, another
    deletes it, and the first's read of it is S3's NoSuchKey (a local read's FileNotFoundError)."""
    from pipeline.format.index import part_index_name
    from pipeline.storage.destination import Destination
    from pipeline.write.output import clear_other_indexes

    class GoneWhenRead(Destination):
        def read(self, name: str) -> bytes:
            raise pipeline.SourceError(self.url(name), 0, "S3 NoSuchKey: no such key")

    (tmp_path / "index.json").write_text("{}")
    assert clear_other_indexes(GoneWhenRead(tmp_path), part_index_name(0, 2), overwrite=True) == []
    assert not (tmp_path / "index.json").exists()


def test_merge_index_removes_the_parts_it_joined_so_a_part_not_built_again_is_missing(tmp_path: Path) -> None:
    """A set built in 4 parts and merged every week: this week part 2's job failed, and
    merge-index joined last week's part 2 (old labels) with the other parts, exit status 0."""
    out = tmp_path / "out"

    def week(label: int, parts: tuple[int, ...], overwrite: bool) -> None:
        arrays = {"x": np.arange(400), "y": np.full(400, label)}
        for i in parts:
            pipeline.write_shards(out, arrays, part=Part(i, 4), shard_samples=50, overwrite=overwrite, **OPTIONS)

    week(0, (0, 1, 2, 3), overwrite=False)
    pipeline.merge_index_files([out])
    assert not list(out.glob("index.part-*")) and pipeline.load_index(out).samples == 400
    with pytest.raises(IndexFormatError, match=re.escape(
            f"no partial indexes (index.part-*-of-*.json) in {out}; {out / 'index.json'} is there: merge-index "
            f"removes the partial indexes it joins")):
        pipeline.merge_index_files([out], overwrite=True)
    week(1, (0, 1, 3), overwrite=True)
    with pytest.raises(IndexFormatError, match=re.escape("missing parts [2], found [0, 1, 3]")):
        pipeline.merge_index_files([out])
    week(1, (2,), overwrite=True)  # (last week's part 2 shards are there, named by no index)
    pipeline.merge_index_files([out])
    assert {int(y) for y in read_back(out)[1]["y"]} == {1}


def test_merge_index_is_refused_while_a_part_is_being_built(arrays, tmp_path: Path) -> None:
    """A part still writing could save its index after merge-index read the folder: merging then
    would join it half-built, and removing the merged parts could take away its fresh index."""
    from pipeline.storage.folder_lock import take_folder_lock

    out = tmp_path / "out"
    for i in range(2):
        pipeline.write_shards(out, arrays, part=Part(i, 2), shard_samples=500, **OPTIONS)
    lock = take_folder_lock(out, shared=True)  # (a part build's lock)
    with pytest.raises(OutputExistsError, match=re.escape(
            f"{out} is being written by a build now (a part still running?): merge its parts once they have all "
            f"ended")):
        pipeline.merge_index_files([out])
    lock.release()
    assert len(list(out.glob("index.part-*.json"))) == 2 and not (out / "index.json").exists()
    pipeline.merge_index_files([out])


def test_a_merge_leaves_a_part_built_again_meanwhile_one_it_cannot_delete_and_never_its_own_output(
        tmp_path: Path, monkeypatch) -> None:
    """Where a folder's lock is not seen (NFS, S3), a part built again during the merge had its
    fresh index deleted with the parts joined; parts in a folder read-only to the user failed the
    merge after its index was saved; an output named as a part was deleted with them."""
    import pipeline.write.merge as merge

    out = tmp_path / "out"
    for i in (0, 1):
        pipeline.write_shards(out, {"y": np.arange(200)}, part=Part(i, 2), shard_samples=50, **OPTIONS)
    fresh = out / "index.part-00001-of-00002.json"
    joined = merge.merge_indexes

    def built_again_meanwhile(parts):
        index = joined(parts)
        fresh.write_text(fresh.read_text() + " ")
        return index

    monkeypatch.setattr(merge, "merge_indexes", built_again_meanwhile)
    with pytest.warns(UserWarning, match=re.escape(f"{fresh} changed during the merge (a part built again?): it is "
                                                   f"left")):
        pipeline.merge_index_files([out])
    assert sorted(p.name for p in out.glob("index.part-*")) == ["index.part-00001-of-00002.bin", fresh.name]
    monkeypatch.undo()
    pipeline.write_shards(out, {"y": np.arange(200)}, part=Part(0, 2), shard_samples=50, overwrite=True, **OPTIONS)
    with warnings.catch_warnings():  # (a part given twice is removed once, without a word)
        warnings.simplefilter("error")
        pipeline.merge_index_files([out, out])
    pipeline.write_shards(out, {"y": np.arange(200)}, part=Part(0, 2), shard_samples=50, overwrite=True, **OPTIONS)
    pipeline.write_shards(out, {"y": np.arange(200)}, part=Part(1, 2), shard_samples=50, overwrite=True, **OPTIONS)
    monkeypatch.setattr(merge.Destination, "delete", lambda self, name: (_ for _ in ()).throw(PermissionError(13, "no")))
    with pytest.warns(UserWarning, match="the merged index is saved, but the partial index .* could not be removed"):
        pipeline.merge_index_files([out], overwrite=True)
    assert pipeline.load_index(out).samples == 200
    with pytest.raises(ValueError, match="the merged index cannot be named as a partial one"):
        pipeline.merge_index_files([out], tmp_path / "index.part-00000-of-00002.json")
