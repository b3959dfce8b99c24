"""``pack="auto"`` writes one sample a record where samples may differ in shape (files, lists of
any length); where they all turned out of one shape and are small, the build says which pack to
build with instead, once for all splits, and only then."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipeline
from pipeline import make_loader

ROWS = 4096


def _lists_table(path: Path, lengths: list[int]) -> None:
    """A ``list<float32>`` column (as pandas and ``datasets`` write arrays) and an int64 label."""
    values = [np.full(length, n, np.float32) for n, length in enumerate(lengths)]
    pq.write_table(pa.table({"x": pa.array(values, type=pa.list_(pa.float32())), "y": np.arange(len(lengths))}),
                   path)


def _advised_pack(err: str) -> list[int]:
    return [int(pack) for pack in re.findall(r"build again with --pack (\d+) --overwrite", err)]


def test_samples_of_one_shape_written_one_a_record_are_told_the_pack_once_for_both_splits(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _lists_table(tmp_path / "t.parquet", [8] * ROWS)
    one_each = pipeline.build_parquet(tmp_path / "t.parquet", tmp_path / "out", validation=0.25)
    err = capsys.readouterr().err
    # 40 bytes a sample would fill 1,638 a record; the larger split, 3,072 rows, keeps 512 records: 6
    assert _advised_pack(err) == [6]
    assert "note: each sample is a record of its own (pack=1)" in err and "(pack=6 in Python)" in err
    assert err.index("-> ") < err.index("note:")  # after both splits' lines
    packed = pipeline.build_parquet(tmp_path / "t.parquet", tmp_path / "out", validation=0.25, pack=6,
                                    overwrite=True)
    assert "note:" not in capsys.readouterr().err
    for split in ("train", "validation"):
        assert one_each[split].pack == 1 and packed[split].pack == 6
        assert packed[split].samples == one_each[split].samples
        assert packed[split].bytes < one_each[split].bytes / 3  # the tar header a sample is gone
    labels = [int(y) for batch in make_loader(tmp_path / "out" / "train", batch_size=512) for y in batch["y"]]
    assert len(labels) == 3072 and len(set(labels)) == 3072


def test_files_of_one_shape_are_told_the_pack(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The one-file-a-sample recipe: 1,100 files of 16 floats."""
    (tmp_path / "data").mkdir()
    ids = [f"id-{n}" for n in range(1100)]
    for sample in ids:
        np.save(tmp_path / "data" / f"{sample}.npy", np.zeros(16, np.float32))
    (tmp_path / "labels.json").write_text(json.dumps({sample: n % 3 for n, sample in enumerate(ids)}))
    (tmp_path / "partition.json").write_text(json.dumps({"train": ids[:1030], "validation": ids[1030:]}))
    pipeline.build_sample_files(tmp_path / "data", tmp_path / "labels.json", tmp_path / "partition.json",
                                tmp_path / "out")
    assert _advised_pack(capsys.readouterr().err) == [2]  # 1,030 rows keep 512 records at 2 a record


@pytest.mark.parametrize("case", ["varied", "quiet", "pack given", "too few"])
def test_nothing_is_advised_where_packing_would_not_do(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        case: str) -> None:
    lengths = [8 if n != 3000 else 9 for n in range(ROWS)] if case == "varied" else [8] * ROWS
    _lists_table(tmp_path / "t.parquet", lengths[:1000] if case == "too few" else lengths)
    options = {"quiet": case == "quiet", "pack": 1 if case == "pack given" else "auto"}
    index = pipeline.build_parquet(tmp_path / "t.parquet", tmp_path / "out", **options)
    err = capsys.readouterr().err
    assert "note:" not in err and index.pack == 1
    assert ("varies in shape" in err) == (case == "varied")


def test_fixed_shape_samples_are_packed_without_advice(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pq.write_table(pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(ROWS * 8, np.float32)), 8),
                             "y": np.arange(ROWS)}), tmp_path / "t.parquet")
    assert pipeline.build_parquet(tmp_path / "t.parquet", tmp_path / "out").pack == 8
    assert "note:" not in capsys.readouterr().err
