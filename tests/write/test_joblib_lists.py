"""How the lists in joblib batch files are read: as batches only where their lengths say so
(batches of the ``B`` in the file's name), else as the user says; a reading that would make one
sample of each batch, or a sample of each row of each label, must never be taken silently."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import joblib
import numpy as np
import pytest

import pipeline
from pipeline import SampleError
from tests.helpers import read_back


def dump(folder: Path, b: int, x: object, y: object) -> Path:
    folder.mkdir(exist_ok=True)
    joblib.dump(x, folder / f"x_{b}.job")
    joblib.dump(y, folder / f"y_{b}.job")
    return folder


def built(folder: Path, out: Path, **options) -> dict[str, list]:
    pipeline.build_joblib(folder, out, quiet=True, **options)
    return read_back(out)[1]


@pytest.mark.parametrize("samples", [96, 100])  # 100: a short last batch
def test_labels_dumped_as_python_lists_per_batch_are_batches(tmp_path: Path, samples: int) -> None:
    x = np.arange(samples * 4, dtype=np.float64).reshape(samples, 4)
    y = np.arange(samples) % 7
    folder = dump(tmp_path / "out", 16, [x[i:i + 16] for i in range(0, samples, 16)],
                  [y[i:i + 16].tolist() for i in range(0, samples, 16)])
    fields = built(folder, tmp_path / "shards")
    assert np.array_equal(np.stack(fields["x"]), x) and [int(v) for v in fields["y"]] == y.tolist()


def test_pickles_named_otherwise_are_left_out_with_a_warning_naming_them(tmp_path: Path) -> None:
    x, y = np.arange(64, dtype=np.float32).reshape(16, 4), np.arange(16)
    folder = dump(tmp_path / "out", 16, [x], [y])
    joblib.dump([x * 2], folder / "x_train.job")
    joblib.dump([y], folder / "y_train.job")
    (folder / "notes.txt").write_text("not a pickle: not named")
    with pytest.warns(UserWarning, match=re.escape(
            f"{folder}: x_train.job, y_train.job are not named x_<B>.job / y_<B>.job, and are not read; to convert "
            f"them, move them to a folder of their own")):
        fields = built(folder, tmp_path / "shards")
    assert np.array_equal(np.stack(fields["x"]), x)


def test_a_file_holding_one_dataframe_or_series_is_its_array(tmp_path: Path) -> None:
    """A list of DataFrames was read; one DataFrame (or a Series of labels) a file was refused."""
    pd = pytest.importorskip("pandas")
    x = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0, 6.0]})
    fields = built(dump(tmp_path / "out", 3, x, pd.Series([0, 1, 0])), tmp_path / "shards")
    assert np.array_equal(np.stack(fields["x"]), x.to_numpy()) and [int(v) for v in fields["y"]] == [0, 1, 0]


def test_a_list_of_samples_whose_labels_are_arrays_is_read_as_told(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((50, 10, 3)), rng.integers(0, 5, (50, 10))  # a sequence's tags
    folder = dump(tmp_path / "out", 16, list(x), list(y))
    with pytest.raises(SampleError, match=re.escape(
            f"{folder / 'y_16.job'}: a list of 50 arrays whose lengths are not batches of 16 (the number in its "
            f"name, if it is their batch size), so they may be batches or samples: say which with --lists batches "
            f"(lists='batches': 500 samples, each array a batch of them) or --lists samples (lists='samples': 50 "
            f"samples, labels of shape (10,))")):
        pipeline.build_joblib(folder, tmp_path / "shards", quiet=True)
    assert not (tmp_path / "shards").exists()
    cli = subprocess.run([sys.executable, "-m", "pipeline", "build", "joblib", str(folder), str(tmp_path / "shards"),
                          "--lists", "samples"], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    _, fields = read_back(tmp_path / "shards")
    assert np.array_equal(np.stack(fields["x"]), x) and np.array_equal(np.stack(fields["y"]), y)
    assert pipeline.load_index(tmp_path / "shards").fields["y"].shape == (10,)


def test_samples_of_several_shapes_are_sent_to_the_shard_writer(tmp_path: Path) -> None:
    folder = dump(tmp_path / "out", 16, [np.ones((n, 3)) for n in (4, 9, 2)], [np.ones(n) for n in (4, 9, 2)])
    with pytest.raises(SampleError, match=re.escape(
            "if they are batches, say so with --lists batches (lists='batches': 15 samples, each array a batch of "
            "them); if each is one sample's labels, of several shapes (a sequence each), write them with "
            "pipeline.ShardWriter")):
        pipeline.build_joblib(folder, tmp_path / "shards", quiet=True)
    assert len(built(folder, tmp_path / "shards", lists="batches")["y"]) == 15


def test_two_runs_that_dumped_the_whole_dataset_as_one_array_are_refused(tmp_path: Path) -> None:
    x, y = np.arange(96 * 4, dtype=np.float32).reshape(96, 4), np.arange(96) % 3
    folder = dump(tmp_path / "out", 16, x, y)
    dump(folder, 32, x, y)
    with pytest.raises(SampleError, match=re.escape(
            f"x_16.job/y_16.job and x_32.job/y_32.job in {folder} hold the same 96 samples: runs of the joblib batch "
            f"recipe with batch sizes 16 and 32? Converting both would give every sample twice: choose one with "
            f"--batch-size 16")):
        pipeline.build_joblib(folder, tmp_path / "shards", quiet=True)
    assert len(built(folder, tmp_path / "shards", batch_size=32)["y"]) == 96
    # numbered batches whose labels are the same (class-sorted data) but not their features are batches
    sorted_classes = tmp_path / "sorted"
    for n in range(3):
        dump(sorted_classes, n, x[:8] + n, np.zeros(8, np.int64))
    assert np.array_equal(np.stack(built(sorted_classes, tmp_path / "sorted-shards")["x"]),
                          np.concatenate([x[:8] + n for n in range(3)]))


def test_an_empty_list_says_so(tmp_path: Path) -> None:
    folder = dump(tmp_path / "out", 16, [], [])
    with pytest.raises(SampleError, match=re.escape(f"{folder}/y_16.job: holds an empty list, so no samples")):
        pipeline.build_joblib(folder, tmp_path / "shards", quiet=True)


def test_features_of_one_row_each_follow_their_labels_or_the_lists_given(tmp_path: Path) -> None:
    """Arrays of one row each add up to the labels as batches do. Beside a list of labels one a
    sample they are one a sample too (per-sample images of shape (1, H, W) keep their channel
    axis); beside an array of labels, or in files named as batches of one, nothing tells, so the
    build asks, and ``lists`` settles it."""
    x, y = np.arange(12, dtype=np.float32).reshape(4, 1, 3), list(range(4))
    listed = dump(tmp_path / "listed", 4, list(x), y)
    as_listed = built(listed, tmp_path / "listed-shards")
    assert np.array_equal(np.stack(as_listed["x"]), x) and [int(v) for v in as_listed["y"]] == y
    assert pipeline.load_index(tmp_path / "listed-shards").fields["x"].shape == (1, 3)
    folder = dump(tmp_path / "out", 4, list(x), np.array(y))
    with pytest.raises(SampleError, match=re.escape(
            f"{folder / 'x_4.job'}: 4 arrays of one row each, beside an array of labels: each array may be a batch or "
            f"a sample, and guessing wrong would change every sample's shape; say which with --lists batches (lists='batches': "
            f"4 samples of shape [3]) or --lists samples (lists='samples': 4 samples of shape [1, 3])")):
        pipeline.build_joblib(folder, tmp_path / "asked", quiet=True)
    assert np.array_equal(np.stack(built(folder, tmp_path / "joined", lists="batches")["x"]), x[:, 0])
    as_samples = built(folder, tmp_path / "stacked", lists="samples")
    assert np.array_equal(np.stack(as_samples["x"]), x) and [int(v) for v in as_samples["y"]] == y
    ones = dump(tmp_path / "ones", 1, list(x), y)  # named as batches of one (labels taken with .item()): asked too
    with pytest.raises(SampleError, match=re.escape(
            f"{ones / 'x_1.job'}: 4 arrays of one row each, named as batches of one: each array may be a batch or a "
            f"sample")):
        pipeline.build_joblib(ones, tmp_path / "ones-asked", quiet=True)
    assert np.array_equal(np.stack(built(ones, tmp_path / "ones-joined", lists="batches")["x"]), x[:, 0])


def test_one_hot_samples_as_wide_as_the_number_in_the_name_are_not_taken_for_batches(tmp_path: Path) -> None:
    """One array a sample, features and one-hot labels both ``B`` wide (``B`` the number in the
    files' names), look like batches of ``B`` samples of one value each: the build asks rather
    than make ten times the samples, each a single value. Features of more axes than one, or a
    short last batch, are batches as before."""
    rng = np.random.default_rng(0)
    x, y = rng.random((40, 10)), np.eye(10, dtype=np.int64)[rng.integers(0, 10, 40)]
    folder = dump(tmp_path / "out", 10, list(x), list(y))
    with pytest.raises(SampleError, match=re.escape(
            f"{folder / 'x_10.job'}: 40 arrays of 10 values, beside as many label arrays of 10 values: each array may "
            f"be a batch or a sample, and guessing wrong would change every sample's shape; say which with --lists "
            f"batches (lists='batches': 400 samples of one value each) or --lists samples (lists='samples': 40 "
            f"samples of 10 values, whose labels are arrays (one-hot rows, tags))")):
        pipeline.build_joblib(folder, tmp_path / "asked", quiet=True)
    as_samples = built(folder, tmp_path / "samples", lists="samples")
    assert np.array_equal(np.stack(as_samples["x"]), x) and np.array_equal(np.stack(as_samples["y"]), y)
    assert len(built(folder, tmp_path / "batches", lists="batches")["y"]) == 400
    images = dump(tmp_path / "images", 10, [x[i:i + 10].reshape(10, 2, 5) for i in range(0, 40, 10)],
                  [y[i:i + 10, 0] for i in range(0, 40, 10)])
    assert np.array_equal(np.stack(built(images, tmp_path / "images-shards")["x"]), x.reshape(40, 2, 5))
    values, labels = x[:35, 0], y[:35, 0]  # a short last batch: batches
    tail = dump(tmp_path / "tail", 10, [values[i:i + 10] for i in range(0, 35, 10)],
                [labels[i:i + 10] for i in range(0, 35, 10)])
    assert np.array_equal(np.stack(built(tail, tmp_path / "tail-shards")["x"]), values)


NAMES = np.array(["dog", "cat", "bird", "cat", "dog", "emu"])


@pytest.mark.parametrize("kind", ["numpy", "object", "lists", "flat list"])
def test_labels_that_are_class_names_are_numbered_by_their_sorted_list_kept_in_the_index(tmp_path: Path,
                                                                                         kind: str) -> None:
    """As the one-file-per-sample layout numbers them (the order of torchvision's ImageFolder):
    NumPy strings, pandas' objects, a batch's names as a list, or a list of one name a sample."""
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = {"numpy": [NAMES[:4], NAMES[4:]], "object": [NAMES[:4].astype(object), NAMES[4:].astype(object)],
         "lists": [NAMES[:4].tolist(), NAMES[4:].tolist()]}
    if kind == "flat list":
        folder = dump(dump(tmp_path / "out", 1, x[:4], NAMES[:4].tolist()), 2, x[4:], NAMES[4:].tolist())
    else:
        folder = dump(tmp_path / "out", 4, [x[:4], x[4:]], y[kind])
    fields = built(folder, tmp_path / "shards")
    assert pipeline.load_index(tmp_path / "shards").metadata == {"classes": ["bird", "cat", "dog", "emu"]}
    assert [int(v) for v in fields["y"]] == [2, 1, 0, 1, 2, 3]
    assert np.array_equal(np.stack(fields["x"]), x)
    splits = pipeline.build_joblib(folder, tmp_path / "split", quiet=True, validation=2)
    assert [index.metadata for index in splits.values()] == [{"classes": ["bird", "cat", "dog", "emu"]}] * 2
    held = read_back(tmp_path / "split" / "train")[1], read_back(tmp_path / "split" / "validation")[1]
    assert sorted((tuple(f["x"][i].tolist()), int(f["y"][i])) for f in held for i in range(len(f["y"]))) == \
        [(tuple(row), label) for row, label in zip(x.tolist(), [2, 1, 0, 1, 2, 3])]


def test_labels_of_names_beside_numbers_or_not_one_a_sample_are_refused_naming_their_files(tmp_path: Path) -> None:
    folder = dump(dump(tmp_path / "mixed", 1, np.ones((4, 2)), NAMES[:4]), 2, np.ones((2, 2)), np.arange(2))
    with pytest.raises(SampleError, match=re.escape(f"{folder / 'y_1.job'} holds class names, {folder / 'y_2.job'} "
                                                    f"numbers: give every label file the same kind of labels")):
        pipeline.build_joblib(folder, tmp_path / "shards", quiet=True)
    folder = dump(tmp_path / "square", 4, np.ones((4, 2)), NAMES[:4].reshape(4, 1).repeat(2, axis=1))
    with pytest.raises(SampleError, match=re.escape(f"{folder / 'y_4.job'}: labels of shape [4, 2] are strings: give "
                                                    f"one class name a sample, or convert its values to numbers")):
        pipeline.build_joblib(folder, tmp_path / "shards", quiet=True)
    folder = dump(tmp_path / "objects", 4, np.ones((4, 2)), np.array(["a", 1, None, 2.5], dtype=object))
    with pytest.raises(SampleError, match=re.escape(f"{folder / 'y_4.job'}: ")):
        pipeline.build_joblib(folder, tmp_path / "shards", quiet=True)
    assert not (tmp_path / "shards").exists()


def test_a_resumed_build_whose_class_names_changed_numbers_every_shard_by_the_new_list(tmp_path: Path) -> None:
    """Shards an earlier run finished hold numbers of the names it knew: a name that sorts before
    them shifts every number, so none of those shards may be kept."""
    folder = tmp_path / "out"
    for b, names in ((1, ["cat", "dog", "cat", "dog"]), (2, ["dog", "cat", "dog", "cat"]), (3, ["dog", "dog", "cat", "cat"])):
        dump(folder, b, np.full((4, 2), b, np.float32), names)
    (folder / "x_3.job").write_bytes(b"")  # the first run stops at the third file
    options = {"shard_samples": 4, "pack": 1, "workers": 1, "quiet": True}
    with pytest.raises(SampleError, match=re.escape(str(folder / "x_3.job"))):
        pipeline.build_joblib(folder, tmp_path / "shards", **options)
    dump(folder, 3, np.full((4, 2), 3, np.float32), ["ant", "cat", "dog", "ant"])  # mended, with a new name
    assert len(list((tmp_path / "shards").glob("*.tar"))) == 2  # the shards of the first two files
    index = pipeline.build_joblib(folder, tmp_path / "shards", resume=True, **options)
    classes = index.metadata["classes"]
    assert classes == ["ant", "cat", "dog"]
    assert [classes[int(y)] for y in read_back(tmp_path / "shards")[1]["y"]] == \
        ["cat", "dog", "cat", "dog", "dog", "cat", "dog", "cat", "ant", "cat", "dog", "ant"]


def test_class_names_a_numpy_string_would_change_are_numbered_as_they_are(tmp_path: Path) -> None:
    folder = dump(tmp_path / "out", 3, np.ones((3, 2)), np.array(["a", "a\x00", "b"], dtype=object))
    assert [int(y) for y in built(folder, tmp_path / "shards")["y"]] == [0, 1, 2]
    assert pipeline.load_index(tmp_path / "shards").metadata == {"classes": ["a", "a\x00", "b"]}


def test_class_names_with_a_gap_are_refused_naming_the_label(tmp_path: Path) -> None:
    folder = dump(tmp_path / "out", 3, np.ones((3, 2)), np.array(["cat", np.nan, "dog"], dtype=object))
    with pytest.raises(SampleError, match=re.escape(f"{folder / 'y_3.job'}: label 1 is float nan among class names: "
                                                    f"give every sample a name")):
        pipeline.build_joblib(folder, tmp_path / "shards", quiet=True)


def test_a_folder_of_another_layout_is_told_what_it_holds_and_how_to_write_it(tmp_path: Path) -> None:
    folder = tmp_path / "batches"
    folder.mkdir()
    for b in range(2):
        joblib.dump((np.ones((4, 2)), np.arange(4)), folder / f"batch_{b}.pkl")
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"{folder}: no x_<B>.job / y_<B>.job files (it holds batch_0.pkl, batch_1.pkl); files of another layout "
            f"(one (X, y) tuple or dict per file, say): load them in Python and write their arrays with "
            f"pipeline.write_shards(out, {{'x': X, 'y': y}})")):
        pipeline.build_joblib(folder, tmp_path / "shards", quiet=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'empty'}: no x_<B>.job / y_<B>.job files "
                                                          f"(it is empty)")):
        pipeline.build_joblib(tmp_path / "empty", tmp_path / "shards", quiet=True)


def test_a_list_of_batches_of_different_shapes_names_them(tmp_path: Path) -> None:
    folder = dump(tmp_path / "out", 5, [np.ones((3, 2)), np.ones((3, 4))], [np.arange(3), np.arange(3)])
    with pytest.raises(SampleError, match=re.escape(f"{folder / 'x_5.job'}: its list holds batches (past their first "
                                                    f"axis) of different shapes: [[2], [4]]; every batch needs the "
                                                    f"same shape")):
        pipeline.build_joblib(folder, tmp_path / "shards", lists="batches", quiet=True)


def test_numbered_batches_with_one_missing_between_others_are_converted_with_a_warning(tmp_path: Path) -> None:
    """A pair missing from numbered batches (deleted, or a dump loop that failed once and went
    on) is named in a warning; numbers that follow no step, or the step they take, are not."""
    x, y = np.arange(50.0).reshape(25, 2), np.arange(25)
    for n in (0, 1, 3, 4):
        dump(tmp_path / "gap", n, x[n * 5:(n + 1) * 5], y[n * 5:(n + 1) * 5])
    with pytest.warns(UserWarning, match=re.escape(
            f"{tmp_path / 'gap'}: the pairs are numbered 0 to 4, but x_2.job/y_2.job is missing (1 of 5): a batch lost? "
            f"The build converts the 4 pairs it finds; put back the missing ones first if they exist")):
        fields = built(tmp_path / "gap", tmp_path / "gap-shards")
    assert np.array_equal(np.stack(fields["x"]), np.concatenate([x[:10], x[15:]]))
    for numbers in ((0, 1000, 2000, 3000), (3, 7, 100)):  # a step of 1000; no step at all
        for n in numbers:
            dump(tmp_path / f"{numbers}", n, x[:5] + n, y[:5])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(built(tmp_path / f"{numbers}", tmp_path / f"{numbers}-shards")["y"]) == 5 * len(numbers)


def test_a_batch_size_on_pairs_numbered_one_per_batch_or_one_name_for_both_fields_is_refused(tmp_path: Path) -> None:
    """--batch-size 4 on x_0.job ... x_9.job (batches of 4) converted x_4.job alone, 4 samples of
    40, without a word; --fields a,a wrote the labels over the features; --fields "x, y" named
    the labels ' y'."""
    x, y = np.arange(80.0).reshape(40, 2), np.arange(40)
    for first in (0, 1):  # (from 1: 1, 2, 3, ... are no batch sizes of runs)
        folder = tmp_path / f"numbered-{first}"
        for n in range(10):
            dump(folder, n + first, x[4 * n:4 * n + 4], y[4 * n:4 * n + 4])
        with pytest.raises(ValueError, match=re.escape(
                f"{folder}: its files are numbered one per batch (x_{first}.job to x_{first + 9}.job), and are "
                f"joined in numeric order: leave out --batch-size (batch_size=), which picks one run of the joblib "
                f"batch recipe (x_4.job alone: 9 pairs of 10 left out)")):
            pipeline.build_joblib(folder, tmp_path / "out", batch_size=4, quiet=True)
        assert np.array_equal(np.stack(built(folder, tmp_path / f"all-{first}")["x"]), x)
    for b in (1, 2, 3):  # runs of the recipe with batch sizes 1, 2 and 3: one is chosen
        dump(tmp_path / "runs", b, [x[i:i + b] for i in range(0, 12, b)], [y[i:i + b] for i in range(0, 12, b)])
    assert len(built(tmp_path / "runs", tmp_path / "run-2", batch_size=2)["y"]) == 12
    with pytest.raises(ValueError, match=r"two different names, e\.g\. \('x', 'y'\), got \('a', 'a'\)"):
        pipeline.build_joblib(tmp_path / "numbered-0", tmp_path / "same", fields=("a", "a"), quiet=True)
    cli = [sys.executable, "-m", "pipeline", "build", "joblib", str(tmp_path / "numbered-0")]
    same = subprocess.run([*cli, str(tmp_path / "cli-same"), "--fields", "a,a"], capture_output=True, text=True)
    assert same.returncode != 0 and "--fields takes two different names, e.g. x,y, got 'a,a'" in same.stderr
    spaced = subprocess.run([*cli, str(tmp_path / "cli-spaced"), "--fields", "features, label", "--quiet"])
    assert spaced.returncode == 0 and set(read_back(tmp_path / "cli-spaced")[1]) == {"features", "label"}


def test_batches_of_features_and_labels_that_do_not_pair_up_are_refused_naming_the_first(tmp_path: Path) -> None:
    """Batches of 32, 33, 32, 31, 32 features beside five of 32 labels add up alike, and were
    joined: 63 of 160 samples stored with another sample's label."""
    y = [np.arange(32) + 32 * k for k in range(5)]
    x = [batch.astype(np.float32)[:, None] for batch in y]
    x[1], x[3] = np.concatenate([x[1], x[1][-1:]]), x[3][:-1]
    folder = dump(tmp_path / "in", 32, x, y)
    with pytest.raises(SampleError, match=re.escape(
            f"{folder / 'x_32.job'}: batch 1 holds 33 rows, batch 1 of {folder / 'y_32.job'} 32 labels (counting from "
            f"0): the batches do not pair up, so samples would get other samples' labels; dump the two files from "
            f"the same batches (if both hold the same samples in order, only cut otherwise, dump each as one array: "
            f"np.concatenate(batches))")):
        pipeline.build_joblib(folder, tmp_path / "shards", quiet=True)
    dump(folder, 32, x, y[:2] + [np.concatenate(y[2:])])  # the same labels in 3 batches, as told: refused too
    with pytest.raises(SampleError, match=re.escape(f"{folder / 'x_32.job'} holds 5 batches, {folder / 'y_32.job'} "
                                                    f"3: each batch of features needs its batch of labels")):
        pipeline.build_joblib(folder, tmp_path / "shards", lists="batches", quiet=True)


def test_labels_one_array_would_change_are_refused_and_whole_numbers_beside_fractions_kept(tmp_path: Path) -> None:
    """NumPy joined uint64 IDs beside int64 ones, and 2**53 + 1 beside 0.5, as float64: the
    build stored other numbers without a word."""
    x = [np.zeros((2, 3), np.float32)] * 2
    cases = [([np.array([2**64 - 1, 7], np.uint64), np.array([2**62 + 1, 7])], "y_2.job: its list holds arrays of "
              "int64, uint64 whose values one array would change"),
             ([[2**53 + 1, 3], [0.5, 1]], "y_2.job: its list holds arrays of float64, int64 whose values"),
             ([[-1, 2**63 + 1], [1, 2]], "y_2.job: item 0 of its list: the integer 9223372036854775809 beside other "
              "numbers would be stored as the float 9.223372036854776e+18; save such numbers as an array of int64")]
    cases.append(([[float("nan"), 2**53 + 1], [0.5, 1]], "y_2.job: item 0 of its list: the integer 9007199254740993"))
    for n, (y, error) in enumerate(cases):  # (with a NaN among them, too)
        with pytest.raises(SampleError, match=re.escape(error)):
            pipeline.build_joblib(dump(tmp_path / f"in{n}", 2, x, y), tmp_path / f"out{n}", quiet=True)
    for n, y in enumerate([np.array([1, 2]), np.array([0.5, 2**62 + 1], np.float64)]):  # (2**62 + 1: a float's)
        dump(tmp_path / "files", n, x[0], y)
    assert [float(v) for v in built(tmp_path / "files", tmp_path / "kept")["y"]] == [1, 2, 0.5, 2.0**62]
    dump(tmp_path / "files", 2, x[0], np.array([2**62 + 1, 3]))
    with pytest.raises(SampleError, match=re.escape(
            f"{tmp_path / 'files'}: files y_0.job to y_2.job hold arrays of float64, int64 whose values one array "
            f"would change")):
        pipeline.build_joblib(tmp_path / "files", tmp_path / "changed", quiet=True)


def test_a_file_joblib_cannot_load_for_a_reason_other_than_damage_says_what_to_do(tmp_path: Path) -> None:
    """Both said 'if the file is truncated or damaged, save it again, then build again with
    --resume': a NumPy file under a joblib name (IndexError: pop from empty list), and a pickle of
    a module this Python lacks."""
    folder = dump(tmp_path / "npy", 2, None, [np.arange(2)])
    with open(folder / "x_2.job", "wb") as file:
        np.save(file, np.zeros((2, 3)))
    with pytest.raises(SampleError, match=re.escape(
            f"{folder / 'x_2.job'}: cannot load with joblib (IndexError: pop from empty list); it is a NumPy file "
            f"(np.save): load it with np.load and dump the array with joblib.dump, or build with pipeline build "
            f"arrays")):
        pipeline.build_joblib(folder, tmp_path / "out", quiet=True)
    folder = tmp_path / "module"
    script = (f"import sys, types, joblib, numpy as np\n"
              f"module = types.ModuleType('labs_own_module'); sys.modules['labs_own_module'] = module\n"
              f"exec('class Batch:\\n    pass', module.__dict__); module.Batch.__module__ = 'labs_own_module'\n"
              f"joblib.dump([module.Batch()], {str(folder / 'x_2.job')!r}); joblib.dump([np.arange(2)], "
              f"{str(folder / 'y_2.job')!r})\n")
    folder.mkdir()
    subprocess.run([sys.executable, "-c", script], check=True)
    with pytest.raises(SampleError, match=re.escape(
            "cannot load with joblib (ModuleNotFoundError: No module named 'labs_own_module'); it pickles objects of "
            "module 'labs_own_module', which this Python cannot import: install it here, or dump the data as NumPy "
            "arrays or torch tensors")):
        pipeline.build_joblib(folder, tmp_path / "out", quiet=True)
    folder = tmp_path / "main"
    folder.mkdir()
    script = (f"import joblib, numpy as np\n"
              f"class Batch:\n    pass\n"
              f"joblib.dump([Batch()], {str(folder / 'x_2.job')!r}); joblib.dump([np.arange(2)], "
              f"{str(folder / 'y_2.job')!r})\n")
    subprocess.run([sys.executable, "-c", script], check=True)
    with pytest.raises(SampleError, match=re.escape(
            "it pickles objects of a class this Python cannot find (one defined in the script that dumped them, "
            "say): load it where that class is defined, or dump the data as NumPy arrays or torch tensors")):
        pipeline.build_joblib(folder, tmp_path / "out", quiet=True)
