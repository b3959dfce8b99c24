"""One call per input layout: what the ``build`` CLI commands run, for use from Python.

Every converter takes the options of :func:`~pipeline.write.run.build_shards` (``shard_bytes``,
``shard_samples``, ``pack``, ``dtypes``, ``workers``, ``part``, ``overwrite``, ``resume``,
``engine``, ``scheduler``, ``executor``, ``quiet``). Those of one dataset also take
``validation`` (a fraction, or a number of samples) and ``seed``: then they write
``out_dir/train`` and ``out_dir/validation`` and return both indexes by split name.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union, overload

from ..caller_warning import warn_caller
from ..format.index import DatasetIndex
from ..format.numbers import SplitSize, WholeNumber
from ..unknown_options import refuse_unknown
from .run import build_shards
from .source import Source, advise_pack
from .sources.arrays import ArraySource, open_npz
from .sources.class_list import given_classes
from .sources.folder import FolderSource
from .sources.image_folder import ImageFolderSource, split_folders
from .sources.joblib_batches import JoblibBatchSource
from .sources.pandas_values import pandas_columns
from .sources.sample_files import partition_sources
from .sources.table_files import Inputs
from .splits import build_split_sets

#: One index, or one per split (``{"train": ..., "validation": ...}``) when a split was asked for:
#: the converters' overloads tell a type checker which, by whether ``validation`` is given.
BuildResult = Union[DatasetIndex, dict[str, DatasetIndex]]

#: The options of a split, which :func:`build_sample_files` (split by its partition) does not take.
SPLIT_OPTIONS = ("validation", "seed")

#: The options every converter passes on to :func:`build_shards`.
BUILD_OPTIONS = tuple(name for name, parameter in inspect.signature(build_shards).parameters.items()
                      if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in SPLIT_OPTIONS)


def refuse_unknown_options(function: Callable[..., Any], options: Mapping[str, Any], splits: bool = True) -> None:
    """Refuse, naming ``function`` (the converter called) and what it takes, an option none of
    the functions it passes ``options`` on to takes: Python's own error named the internal
    ``build_shards()``, and came only once the inputs were read. ``splits``: ``options`` reach
    :func:`build_dataset`, which takes ``validation`` and ``seed``."""
    own = [name for name, parameter in inspect.signature(function).parameters.items()
           if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    accepted = own + [name for name in SPLIT_OPTIONS if splits and name not in own] + list(BUILD_OPTIONS)
    refuse_unknown(function.__name__, options, accepted)


def build_dataset(source: Source, out_dir: str | os.PathLike[str], prefix: str = "shard",
                  validation: SplitSize | None = None, seed: WholeNumber = 0, **options: Any) -> BuildResult:
    """``source`` as one shard set in ``out_dir``, or split into ``out_dir/train`` and
    ``out_dir/validation`` when ``validation`` is given (rows chosen at random by ``seed``);
    then the note on ``pack`` that a converter's input may call for (a split build's is its own)."""
    built = build_shards(source, out_dir, prefix, validation=validation, seed=seed, **options)
    if isinstance(built, DatasetIndex):
        advise_pack(options, [(source, built)])
    return built


@overload
def write_shards(out_dir: str | os.PathLike[str], arrays: Mapping[str, Any], prefix: str = ...,
                 keys: Sequence[str] | None = ..., *, validation: None = ..., seed: WholeNumber = ...,
                 **options: Any) -> DatasetIndex: ...
@overload
def write_shards(out_dir: str | os.PathLike[str], arrays: Mapping[str, Any], prefix: str = ...,
                 keys: Sequence[str] | None = ..., *, validation: SplitSize, seed: WholeNumber = ...,
                 **options: Any) -> dict[str, DatasetIndex]: ...
def write_shards(out_dir: str | os.PathLike[str], arrays: Mapping[str, Any], prefix: str = "shard",
                 keys: Sequence[str] | None = None, *, validation: SplitSize | None = None, seed: WholeNumber = 0,
                 **options: Any) -> BuildResult:
    """Write equally long arrays (one per field: ndarrays, memmaps, torch tensors or ``.npy``
    paths) as shards."""
    if isinstance(out_dir, Mapping) or not hasattr(arrays, "items"):  # (a pandas DataFrame is columns too)
        given = f"({type(out_dir).__name__}, {type(arrays).__name__})"
        raise TypeError(f"write_shards takes the output folder, then a mapping of field names to arrays: "
                        f"write_shards('shards', {{'x': features, 'y': labels}}), got {given}")
    if isinstance(keys, (str, bytes)):  # (a str is a sequence, of its letters)
        raise TypeError(f"keys= takes one key a sample, a list of str, got the str {keys[:40]!r}")
    refuse_unknown_options(write_shards, options)
    columns = pandas_columns(arrays, "write_shards")
    return build_dataset(ArraySource(columns, None if keys is None else list(keys)), out_dir, prefix, validation, seed,
                         **options)


@overload
def build_npz(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = ..., *,
              validation: None = ..., seed: WholeNumber = ..., **options: Any) -> DatasetIndex: ...
@overload
def build_npz(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = ..., *,
              validation: SplitSize, seed: WholeNumber = ..., **options: Any) -> dict[str, DatasetIndex]: ...
def build_npz(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = "shard", *,
              validation: SplitSize | None = None, seed: WholeNumber = 0, **options: Any) -> BuildResult:
    """Every array of an ``.npz`` becomes a field."""
    refuse_unknown_options(build_npz, options)
    return build_dataset(ArraySource(open_npz(path), description=str(path)), out_dir, prefix, validation, seed,
                         **options)


@overload
def build_joblib(folder: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = ...,
                 fields: tuple[str, str] = ..., batch_size: int | None = ..., lists: str | None = ...,
                 classes: Sequence[str] | None = ..., *, validation: None = ..., seed: WholeNumber = ...,
                 **options: Any) -> DatasetIndex: ...
@overload
def build_joblib(folder: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = ...,
                 fields: tuple[str, str] = ..., batch_size: int | None = ..., lists: str | None = ...,
                 classes: Sequence[str] | None = ..., *, validation: SplitSize, seed: WholeNumber = ...,
                 **options: Any) -> dict[str, DatasetIndex]: ...
def build_joblib(folder: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = "shard",
                 fields: tuple[str, str] = ("x", "y"), batch_size: int | None = None, lists: str | None = None,
                 classes: Sequence[str] | None = None, *, validation: SplitSize | None = None, seed: WholeNumber = 0,
                 **options: Any) -> BuildResult:
    """Convert ``x_<B>.job``/``y_<B>.job`` files (trusted input only: they are pickles);
    ``batch_size=B`` picks the pair of one run of the batch recipe; ``lists="batches"`` or
    ``"samples"`` reads lists of arrays that are no batches of ``B`` (see
    :class:`~pipeline.write.sources.joblib_batches.JoblibBatchSource`); ``classes`` numbers
    labels that are class names by that list, not the names found sorted."""
    refuse_unknown_options(build_joblib, options)
    return build_dataset(JoblibBatchSource(folder, fields, batch_size, lists, classes), out_dir, prefix, validation,
                         seed, **options)


def build_sample_files(root: str | os.PathLike[str], labels: Any, partition: Any,
                       out_dir: str | os.PathLike[str], classes: Sequence[str] | None = None,
                       **options: Any) -> dict[str, DatasetIndex]:
    """One shard set per split, in ``out_dir/<split>/`` with shards ``<split>-000000.tar``.

    ``labels`` (``{ID: label}``) and ``partition`` (``{split: [IDs]}``) are mappings or paths
    of JSON files. Every split is checked before the first shard is written. Labels that are
    class names are stored as their positions in the sorted names, or in ``classes`` where it is
    given (a later week's set, with a new class, numbered as the first week's), kept in each
    index's ``metadata["classes"]``.
    """
    if "validation" in options:
        raise TypeError("build_sample_files takes its splits from the partition: there is no validation=; "
                        "list the validation IDs under a split of the partition")
    refuse_unknown_options(build_sample_files, options, splits=False)
    return build_split_sets(partition_sources(root, labels, partition, classes), out_dir, **options)


@overload
def build_folder(folder: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = ...,
                 recursive: bool = ..., *, validation: None = ..., seed: WholeNumber = ...,
                 **options: Any) -> DatasetIndex: ...
@overload
def build_folder(folder: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = ...,
                 recursive: bool = ..., *, validation: SplitSize, seed: WholeNumber = ...,
                 **options: Any) -> dict[str, DatasetIndex]: ...
def build_folder(folder: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = "shard",
                 recursive: bool = False, *, validation: SplitSize | None = None, seed: WholeNumber = 0,
                 **options: Any) -> BuildResult:
    """Files grouped by stem (``0001.jpg`` + ``0001.json``), bytes kept as they are."""
    refuse_unknown_options(build_folder, options)
    return build_dataset(FolderSource(folder, recursive), out_dir, prefix, validation, seed, **options)


def build_imagefolder(root: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = "shard",
                      max_side: int | None = None, quality: int | None = None, validation: SplitSize | None = None,
                      seed: WholeNumber = 0, classes: Sequence[str] | None = None, **options: Any) -> BuildResult:
    """``ROOT/<class>/<image>`` as ``{"image": bytes, "label": int}`` samples, the class names in
    the index's metadata. A ROOT holding ``train/`` and ``val/`` (or ``validation/``) class
    folders makes two sets, ``out_dir/train`` and ``out_dir/validation``, labelled by the
    training set's classes; else ``validation`` splits one folder. ``max_side`` shrinks larger
    photos (JPEG of ``quality``, 90 by default), in the build's workers. ``classes`` numbers the
    labels by that list rather than by the folders found: a test folder that lacks a class, or
    a set to mix with another, labelled as the training set is."""
    refuse_unknown_options(build_imagefolder, options)
    root = os.fspath(root)
    classes = given_classes(classes)  # (once: a generator of names would be spent by the first split)
    folders = split_folders(Path(root))
    if folders is None:
        return build_dataset(ImageFolderSource(root, classes, max_side, quality), out_dir, prefix, validation, seed,
                             **options)
    if validation is not None:
        raise ValueError(f"{root} already holds train/ and val/ folders: the split is theirs; "
                         f"leave out --validation (validation=)")
    if seed != 0:
        warn_caller(f"{root} already holds train/ and val/ folders: the split is theirs, and seed={seed!r}, which "
                    f"would draw one, is not used")
    if prefix != "shard":
        raise ValueError("train/ and val/ folders make two sets named after each split (train-000000.tar); "
                         "a prefix does not apply")
    train = ImageFolderSource(folders["train"], classes, max_side, quality)
    validation_set = ImageFolderSource(folders["validation"], train.classes, max_side, quality)
    return build_split_sets({"train": train, "validation": validation_set}, out_dir, **options)


@overload
def build_parquet(inputs: Inputs, out_dir: str | os.PathLike[str], prefix: str = ...,
                  columns: Sequence[str] | None = ..., fill: Mapping[str, Any] | None = ..., *, validation: None = ...,
                  seed: WholeNumber = ..., **options: Any) -> DatasetIndex: ...
@overload
def build_parquet(inputs: Inputs, out_dir: str | os.PathLike[str], prefix: str = ...,
                  columns: Sequence[str] | None = ..., fill: Mapping[str, Any] | None = ..., *, validation: SplitSize,
                  seed: WholeNumber = ..., **options: Any) -> dict[str, DatasetIndex]: ...
def build_parquet(inputs: Inputs, out_dir: str | os.PathLike[str], prefix: str = "shard",
                  columns: Sequence[str] | None = None, fill: Mapping[str, Any] | None = None, *,
                  validation: SplitSize | None = None, seed: WholeNumber = 0, **options: Any) -> BuildResult:
    """Rows of Parquet files (or folders of ``*.parquet``), a column a field: ``columns`` picks
    them (all by default), ``fill`` (``{"col": value}``) replaces nulls, which are otherwise an
    error. Needs pyarrow (``pip install 'pipeline[parquet]'``), imported on the first call so
    that the rest of the package works without it."""
    refuse_unknown_options(build_parquet, options)
    from .sources.tables import ParquetSource

    return build_dataset(ParquetSource(inputs, columns, fill), out_dir, prefix, validation, seed, **options)


@overload
def build_arrow(inputs: Inputs, out_dir: str | os.PathLike[str], prefix: str = ...,
                columns: Sequence[str] | None = ..., fill: Mapping[str, Any] | None = ..., *, validation: None = ...,
                seed: WholeNumber = ..., **options: Any) -> DatasetIndex: ...
@overload
def build_arrow(inputs: Inputs, out_dir: str | os.PathLike[str], prefix: str = ...,
                columns: Sequence[str] | None = ..., fill: Mapping[str, Any] | None = ..., *, validation: SplitSize,
                seed: WholeNumber = ..., **options: Any) -> dict[str, DatasetIndex]: ...
def build_arrow(inputs: Inputs, out_dir: str | os.PathLike[str], prefix: str = "shard",
                columns: Sequence[str] | None = None, fill: Mapping[str, Any] | None = None, *,
                validation: SplitSize | None = None, seed: WholeNumber = 0, **options: Any) -> BuildResult:
    """Rows of Arrow IPC files or streams, or of a ``datasets`` ``save_to_disk`` folder; options
    as :func:`build_parquet`."""
    refuse_unknown_options(build_arrow, options)
    from .sources.table_arrow import ArrowSource

    return build_dataset(ArrowSource(inputs, columns, fill), out_dir, prefix, validation, seed, **options)
