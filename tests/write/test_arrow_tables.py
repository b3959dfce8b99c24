"""Builds from Arrow IPC files and streams and ``datasets`` folders: the rows a Parquet file of the
same table builds, nulls found from the batch headers, and damaged or empty inputs named."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import pipeline
from pipeline import SampleError
from pipeline.write.sources.table_arrow import ArrowSource
from tests.helpers import read_back
from tests.write.test_tables import DIM, check_mixed, embeddings, mixed_table


def test_arrow_ipc_files_and_streams_build_the_shards_a_parquet_file_builds(tmp_path: Path) -> None:
    table = mixed_table(500)
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=100)
    feather.write_feather(table, tmp_path / "t.feather", chunksize=120)  # the file format, lz4-compressed
    with pa.ipc.new_file(tmp_path / "t.arrow", table.schema) as writer:
        writer.write_table(table, max_chunksize=90)
    with pa.ipc.new_stream(tmp_path / "t.arrows", table.schema) as writer:
        writer.write_table(table, max_chunksize=70)
    options = dict(shard_bytes=16 << 10, quiet=True)
    pipeline.build_parquet(tmp_path / "t.parquet", tmp_path / "parquet", **options)
    expected = [s.sha256 for s in pipeline.load_index(tmp_path / "parquet").shards]
    for name in ("t.feather", "t.arrow", "t.arrows"):
        pipeline.build_arrow(tmp_path / name, tmp_path / name.replace(".", "-"), **options)
        assert [s.sha256 for s in pipeline.load_index(tmp_path / name.replace(".", "-")).shards] == expected, name
    check_mixed(tmp_path / "t-arrows", table)
    with pytest.raises(SampleError, match=r"t\.parquet: a file in Parquet format, not Arrow IPC: build it with "
                                          r"'pipeline build parquet'"):
        ArrowSource(tmp_path / "t.parquet")
    encoded = pa.table({"y": [1, 2], "c": pa.array(["a", "b"]).dictionary_encode()})
    with pa.ipc.new_stream(tmp_path / "d.arrows", encoded.schema) as writer:
        writer.write_table(encoded)
    with pytest.raises(SampleError, match=r"d\.arrows: an IPC stream with dictionary-encoded columns \(c\) cannot be "
                                          r"read a batch at a time; write it as an IPC file"):
        ArrowSource(tmp_path / "d.arrows", columns=["y"])


def test_arrow_nulls_are_found_from_batch_headers_when_the_source_opens(tmp_path: Path) -> None:
    table = pa.table({"y": pa.array([0, 1, 2, None, 4, None])})
    with pa.ipc.new_stream(tmp_path / "n.arrows", table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    with pytest.raises(SampleError, match=r"n\.arrows: column 'y' has 2 nulls, at rows 3, \.\.\. \(counting from 0 in "
                                          r"the file\)"):
        ArrowSource(tmp_path / "n.arrows")
    assert ArrowSource(tmp_path / "n.arrows", fill={"y": 9}).read(1, 6).columns["y"].tolist() == [1, 2, 9, 4, 9]
    # a null inside a list: the headers count whole values only ("0 null, at row 1" before)
    inside = pa.table({"fx": pa.array([[1.0, 1.0], [2.0, None]], pa.list_(pa.float32(), 2))})
    with pa.ipc.new_file(tmp_path / "inside.arrow", inside.schema) as writer:
        writer.write_table(inside)
    with pytest.raises(SampleError, match=r"inside\.arrow: column 'fx' has nulls, the first at row 1 \(counting"):
        ArrowSource(tmp_path / "inside.arrow")


def test_a_damaged_arrow_file_or_stream_is_an_error_naming_it(tmp_path: Path) -> None:
    table = pa.table({"y": list(range(1000)), "s": [f"row {i}" for i in range(1000)]})
    with pa.ipc.new_stream(tmp_path / "cut.arrows", table.schema) as stream:
        for batch in table.to_batches(max_chunksize=100):
            stream.write_batch(batch)
    whole = (tmp_path / "cut.arrows").read_bytes()
    (tmp_path / "cut.arrows").write_bytes(whole[:len(whole) // 2])
    feather.write_feather(table, tmp_path / "flipped.feather", compression="lz4", chunksize=100)
    data = bytearray((tmp_path / "flipped.feather").read_bytes())
    data[3000:3400] = bytes(b ^ 0xFF for b in data[3000:3400])
    (tmp_path / "flipped.feather").write_bytes(bytes(data))
    for name in ("cut.arrows", "flipped.feather"):
        with pytest.raises(SampleError, match=rf"^{re.escape(str(tmp_path / name))}: not a readable Arrow IPC file "
                                              r"\(.+\): replace it with a whole copy, or leave it out of the inputs$"):
            pipeline.build_arrow(tmp_path / name, tmp_path / f"out-{name}", quiet=True)


def test_an_empty_saved_dataset_says_it_holds_no_rows(tmp_path: Path) -> None:
    import datasets  # in the test extra; optional for users

    datasets.Dataset.from_dict({"y": []}, features=datasets.Features({"y": datasets.Value("int64")})).save_to_disk(
        str(tmp_path / "empty"))
    with pytest.raises(SampleError, match=re.escape(f"{tmp_path / 'empty'}: the saved dataset holds no rows (its "
                                                    f"state.json lists no data files): nothing to build")):
        pipeline.build_arrow(tmp_path / "empty", tmp_path / "out", quiet=True)


def test_a_datasets_save_to_disk_folder_is_read_in_the_order_of_its_state_file(tmp_path: Path) -> None:
    import datasets  # in the test extra; optional for users
    x, y = embeddings(300)
    features = datasets.Features({"x": datasets.Sequence(datasets.Value("float32"), length=DIM),
                                  "y": datasets.ClassLabel(num_classes=10), "text": datasets.Value("string")})
    data = datasets.Dataset.from_dict({"x": x, "y": y, "text": [f"t{i}" for i in range(300)]}, features=features)
    data.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    state = json.loads((tmp_path / "saved" / "state.json").read_text())
    assert len(state["_data_files"]) == 3
    pipeline.build_arrow(tmp_path / "saved", tmp_path / "out", quiet=True)
    _, fields = read_back(tmp_path / "out")
    assert np.stack(fields["x"]).tobytes() == x.tobytes()
    assert [int(v) for v in fields["y"]] == y.tolist() and fields["text"][299] == "t299"
    datasets.DatasetDict({"train": data, "test": data}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(SampleError, match=r"dict holds a DatasetDict \(splits test, train\): give one split's folder"):
        ArrowSource(tmp_path / "dict")


def test_a_folder_of_files_builds_whatever_its_subfolders_hold(tmp_path: Path) -> None:
    """A saved DatasetDict left in a subfolder is no file of the folder's, nor a reason to stop."""
    (tmp_path / "data" / "old").mkdir(parents=True)
    feather.write_feather(pa.table({"y": [0, 1, 0]}), tmp_path / "data" / "a.arrow")
    (tmp_path / "data" / "old" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipeline.build_arrow(tmp_path / "data", tmp_path / "out", quiet=True)
    assert read_back(tmp_path / "out")[1] == {"y": [0, 1, 0]}


def test_bytes_pyarrow_reads_as_a_bad_continuation_token_are_named_as_not_arrow(tmp_path: Path) -> None:
    """pyarrow raises an OSError, not an ArrowInvalid, for a stream whose first word is negative:
    it went out bare, without the file's name."""
    (tmp_path / "neg.arrow").write_bytes(b"\x00\x00\x00\x80garbage")
    with pytest.raises(SampleError, match=rf"^{re.escape(str(tmp_path / 'neg.arrow'))}: not in Arrow IPC format "
                                          r"\(it starts with b'\\x00\\x00\\x00\\x80garb'\): convert it first"):
        pipeline.build_arrow(tmp_path / "neg.arrow", tmp_path / "out", quiet=True)


def test_a_file_that_is_not_arrow_is_closed_when_refused(tmp_path: Path) -> None:
    """The refusal's traceback held the open map of it: errors kept (a notebook keeps the last
    one) kept a file open each."""
    (tmp_path / "bad.arrow").write_bytes(b"not arrow at all" * 100)
    opened = len(os.listdir("/proc/self/fd"))
    kept = []
    for _ in range(20):
        with pytest.raises(SampleError, match=r"bad\.arrow: not in Arrow IPC format") as raised:
            ArrowSource(tmp_path / "bad.arrow")
        kept.append(raised.value)
    assert len(os.listdir("/proc/self/fd")) == opened


def test_a_feather_file_of_version_1_is_told_how_to_write_it_again(tmp_path: Path) -> None:
    (tmp_path / "old.feather").write_bytes(b"FEA1" + bytes(56) + b"FEA1")  # its magic, first and last (pyarrow
    # deprecates writing version 1)
    with pytest.raises(SampleError, match=re.escape(f"{tmp_path / 'old.feather'}: a Feather file of version 1, which "
                                                    f"is not Arrow IPC: write it again as version 2")):
        pipeline.build_arrow(tmp_path / "old.feather", tmp_path / "out", quiet=True)


def test_classlabel_names_are_kept_as_an_image_folders_classes_and_checked_in_a_mix(tmp_path: Path) -> None:
    """Before, a ClassLabel column's names were lost: labels of two datasets numbered otherwise mixed unseen."""
    import datasets  # in the test extra; optional for users

    def saved(name: str, classes: list[str], **more: datasets.ClassLabel) -> Path:
        features = datasets.Features({"x": datasets.Value("float32"), "y": datasets.ClassLabel(names=classes), **more})
        rows = {"x": [0.5, 1.5, 2.5], "y": [0, 1, 1], **{column: [1, 0, 0] for column in more}}
        data = datasets.Dataset.from_dict(rows, features=features)
        data.save_to_disk(str(tmp_path / name))
        data.to_parquet(str(tmp_path / f"{name}.parquet"))
        return tmp_path / name

    pipeline.build_arrow(saved("pets", ["cat", "dog"]), tmp_path / "out-pets", quiet=True)
    assert pipeline.load_index(tmp_path / "out-pets").metadata == {"classes": ["cat", "dog"]}
    pipeline.build_parquet(tmp_path / "pets.parquet", tmp_path / "out-parquet", quiet=True)
    assert pipeline.load_index(tmp_path / "out-parquet").metadata == {"classes": ["cat", "dog"]}
    pipeline.build_parquet(tmp_path / "pets.parquet", tmp_path / "out-x", columns=["x"], quiet=True)
    assert pipeline.load_index(tmp_path / "out-x").metadata == {}
    pipeline.build_arrow(saved("two", ["cat", "dog"], z=datasets.ClassLabel(names=["no", "yes"])), tmp_path / "out-two",
                         quiet=True)
    assert pipeline.load_index(tmp_path / "out-two").metadata == {"classes": {"y": ["cat", "dog"], "z": ["no", "yes"]}}
    pipeline.build_arrow(saved("swapped", ["dog", "cat"]), tmp_path / "out-swapped", quiet=True)
    with pytest.raises(ValueError, match=re.escape(
            "sources 'pets' and 'swapped' number their classes differently: label 0 is 'cat' in 'pets' and 'dog' in "
            "'swapped'")) as refused:
        pipeline.make_loader({"pets": tmp_path / "out-pets", "swapped": tmp_path / "out-swapped"}, num_workers=0)
    assert "Dataset.align_labels_with_mapping" in str(refused.value)
    pipeline.build_arrow(saved("two-swapped", ["cat", "dog"], z=datasets.ClassLabel(names=["yes", "no"])),
                         tmp_path / "out-two-swapped", quiet=True)
    with pytest.raises(ValueError, match=re.escape("sources 'two' and 'swapped' number their classes differently: "
                                                   "field 'z': label 0 is 'no' in 'two' and 'yes' in 'swapped'")):
        pipeline.make_loader({"two": tmp_path / "out-two", "swapped": tmp_path / "out-two-swapped"}, num_workers=0)


def test_classlabel_names_are_found_beside_features_written_as_lists(tmp_path: Path) -> None:
    """Older ``datasets`` wrote a Sequence feature as a list, where a dict was looked for."""
    features = {"z": [{"dtype": "float32", "_type": "Value"}], "y": {"names": ["no", "yes"], "_type": "ClassLabel"}}
    table = pa.table({"z": pa.array([[1.0], [2.0]], pa.list_(pa.float32())), "y": [1, 0]})
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, tmp_path / "old.parquet")
    pipeline.build_parquet(tmp_path / "old.parquet", tmp_path / "out", quiet=True)
    assert pipeline.load_index(tmp_path / "out").metadata == {"classes": ["no", "yes"]}


def test_the_names_of_lists_of_classlabels_are_kept_beside_the_labels(tmp_path: Path) -> None:
    """Sequence(ClassLabel(...)), as datasets stores tags and ner_tags: its names were dropped, and
    the one ClassLabel beside it took the form of the only one."""
    import datasets  # in the test extra; optional for users

    features = datasets.Features({"y": datasets.ClassLabel(names=["b", "a"]),
                                  "tags": datasets.Sequence(datasets.ClassLabel(names=["t1", "t0"]))})
    datasets.Dataset.from_dict({"y": [0, 1], "tags": [[1], [0, 1]]}, features=features).save_to_disk(
        str(tmp_path / "tagged"))
    pipeline.build_arrow(tmp_path / "tagged", tmp_path / "out", quiet=True)
    assert pipeline.load_index(tmp_path / "out").metadata == {"classes": {"y": ["b", "a"], "tags": ["t1", "t0"]}}
    assert [tags.tolist() for tags in read_back(tmp_path / "out")[1]["tags"]] == [[1], [0, 1]]


def test_a_compressed_batch_is_decompressed_once_for_all_its_reads(tmp_path: Path) -> None:
    """Each read of a few MB of rows decompressed the whole lz4 batch again: a build's time grew
    with the square of the batch (one of 1.2M rows: 44 s where 6 s did)."""
    rows = 100_000
    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(rows * 10, dtype=np.float32)), 10)})
    with pa.ipc.new_file(tmp_path / "one.arrow", table.schema,
                         options=pa.ipc.IpcWriteOptions(compression="lz4")) as writer:
        writer.write_table(table)  # one batch of 4 MB
    source = ArrowSource(tmp_path / "one.arrow")
    pool = pa.default_memory_pool()
    before = pool.total_bytes_allocated()
    parts = [source.read(start, start + 1000).columns["x"] for start in range(0, rows, 1000)]
    assert pool.total_bytes_allocated() - before < 3 * rows * 40  # (100 reads: 100 decompressions were 400 MB)
    np.testing.assert_array_equal(np.concatenate(parts).ravel(), np.arange(rows * 10, dtype=np.float32))


def test_a_files_count_of_nulls_below_those_seen_is_not_told() -> None:
    """pyarrow 14 read a batch header's count of a list column's nulls as 0, and the error said
    "has 0 null, at rows 1": a count below the nulls a batch shows is not the file's."""
    from pipeline.write.sources.table_nulls import FileNulls

    nulls = FileNulls(Path("t.arrow"), ["y"], {})
    nulls.add(0, pa.RecordBatch.from_pydict({"y": [0, None, None]}), in_file=lambda name: 0)
    with pytest.raises(SampleError, match=re.escape("t.arrow: column 'y' has nulls, the first at rows 1, 2 (counting")):
        nulls.refuse()
