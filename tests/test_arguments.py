"""Arguments of the wrong type or out of range: an error naming the argument and what it takes,
where they reached Python's or NumPy's internals (an AttributeError, "not enough values to
unpack"), or were taken without a word (a str of keys read as one key a letter)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import joblib
import numpy as np
import pytest

import pipeline


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("arguments") / "set"
    pipeline.write_shards(out, {"x": np.arange(10)}, quiet=True)
    return out


def _joblib_folder(folder: Path) -> Path:
    folder.mkdir()
    joblib.dump([np.zeros((4, 3))] * 2, folder / "x_4.job")
    joblib.dump([np.arange(4)] * 2, folder / "y_4.job")
    return folder


CASES: dict[str, tuple[Callable[[Path, Path], Any], type, str]] = {
    "keys as a str": (lambda out, built: pipeline.write_shards(out, {"x": np.arange(10)}, keys="abcdefghij"),
                      TypeError, "keys= takes one key a sample, a list of str, got the str 'abcdefghij'"),
    "dtypes as a str": (lambda out, built: pipeline.write_shards(out, {"x": np.arange(10.0)}, dtypes="float16"),
                        TypeError, "dtypes maps field names to the dtypes to store them as, e.g. {'x': 'float32'}, "
                                   "got 'float16'"),
    "a column of one value": (lambda out, built: pipeline.ShardWriter(out).write_columns({"x": 5}), TypeError,
                              "write_columns field 'x': a column holds one value a sample (an array, a list), got "
                              "int 5; write one sample with write({'x': ...})"),
    "samples below 0": (lambda out, built: pipeline.describe(built, samples=-1), ValueError,
                        "samples is how many samples to show, a whole number >= 0, got -1"),
    "a path to iter_records": (lambda out, built: next(pipeline.iter_records(str(built / "shard-000000.tar"), "u")),
                               TypeError, "iter_records reads a shard's bytes or an open file, got the path"),
    "a partition as a list": (lambda out, built: pipeline.build_sample_files(out, {"a": 1}, ["a"], out), TypeError,
                              "the partition is a mapping {split: [IDs]}, or the path of a JSON file of one, got "
                              "list ['a']"),
    "no index workers": (lambda out, built: pipeline.index_shards(built, output=out, workers=0), ValueError,
                         "workers must be a whole number >= 1 (1 writes in this process), got 0"),
    "images as a str": (lambda out, built: pipeline.verify(built, images="yes"), TypeError,
                        "images is True (decode every image too) or False, got 'yes'"),
    "one joblib field": (lambda out, built: pipeline.build_joblib(_joblib_folder(out.parent / "j1"), out,
                                                                  fields=("x",)),
                         ValueError, "fields names the two fields of a pair, its features' and its labels', two "
                                     "different names, e.g. ('x', 'y'), got ('x',)"),
    "a joblib batch size as a str": (lambda out, built: pipeline.build_joblib(_joblib_folder(out.parent / "j2"), out,
                                                                              batch_size="4"),
                                     ValueError, "batch_size is the B of the x_<B>.job files to read, a whole number "
                                                 ">= 1, got '4'"),
    # a misspelt option or one another converter takes was build_shards()'s error, named by no function called
    "an option misspelt": (lambda out, built: pipeline.write_shards(out, {"x": np.arange(10)}, shard_sample=5),
                           TypeError, "write_shards() got an unexpected keyword argument 'shard_sample' (did you mean "
                                      "shard_samples=?); it takes out_dir, arrays, prefix, keys, validation, seed, "
                                      "shard_samples, shard_bytes, pack, dtypes, workers, part, overwrite, resume, "
                                      "quiet, executor, engine, scheduler"),
    "a seed for sample files": (lambda out, built: pipeline.build_sample_files(out, {"a": 1}, {"train": ["a"]}, out,
                                                                               seed=3),
                                TypeError, "build_sample_files() got an unexpected keyword argument 'seed'; it takes "
                                           "root, labels, partition, out_dir, classes, shard_samples,"),
    # a misspelt make_loader option was ShardDataset.__init__()'s error, which suggested nothing
    "a loader option misspelt": (lambda out, built: pipeline.make_loader(built, num_workers=0, batchsize=32),
                                 TypeError, "make_loader() got an unexpected keyword argument 'batchsize' (did you "
                                            "mean batch_size=?); it takes num_workers, prefetch_factor, "
                                            "persistent_workers, pin_memory, multiprocessing_context, timeout, "
                                            "worker_init_fn, batch_size, shuffle, seed,"),
    "a DataLoader's collate_fn": (lambda out, built: pipeline.make_loader(built, collate_fn=None), TypeError,
                                  "make_loader() got an unexpected keyword argument 'collate_fn' (a DataLoader's "
                                  "option: batches come collated from the workers; batch_transform= changes each "
                                  "batch); it takes num_workers,"),
    # taken, and given a worker's unit of batches as one batch (a TypeError naming an internal type)
    "a DataLoader's collate_fn to a ShardLoader": (lambda out, built: pipeline.ShardLoader(
        pipeline.ShardDataset(built), num_workers=2, collate_fn=lambda batch: batch), TypeError,
        "ShardLoader() got an unexpected keyword argument 'collate_fn' (a DataLoader's option: batches come collated "
        "from the workers; batch_transform= changes each batch)"),
    "a DataLoader's sampler, beside a dataset": (lambda out, built: pipeline.make_loader(pipeline.ShardDataset(built),
                                                                                         sampler=None), TypeError,
                                                 "make_loader() got an unexpected keyword argument 'sampler' (a "
                                                 "DataLoader's option: the dataset draws each epoch's order from "
                                                 "shuffle= and seed=, and shares it between ranks by rank= and "
                                                 "world_size=); it takes"),
}


@pytest.mark.parametrize("case", CASES)
def test_an_argument_of_the_wrong_kind_is_refused_naming_it(tmp_path: Path, built: Path, case: str) -> None:
    call, error, message = CASES[case]
    with pytest.raises(error, match="^" + re.escape(message)):
        call(tmp_path / "out", built)
    assert not (tmp_path / "out" / "index.json").exists()
