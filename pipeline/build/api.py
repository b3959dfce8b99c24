"""One call per input layout: what the ``build`` CLI commands run, for use from Python."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from ..format.index import DatasetIndex
from ..storage import join
from .run import build_shards
from .sources.arrays import ArraySource, open_npz
from .sources.folder import FolderSource
from .sources.joblib_batches import JoblibBatchSource
from .sources.sample_files import partition_sources


def write_shards(out_dir: str | os.PathLike[str], arrays: Mapping[str, Any], prefix: str = "shard",
                 keys: Sequence[str] | None = None, **options: Any) -> DatasetIndex:
    """Write equally long arrays (one per field: ndarrays, memmaps, torch tensors or ``.npy``
    paths) as shards. ``options`` are those of :func:`build_shards` (``shard_bytes``,
    ``shard_samples``, ``pack``, ``workers``, ``part``, ``overwrite``, ``resume``, ``engine``,
    ``scheduler``, ``executor``, ``quiet``)."""
    return build_shards(ArraySource(arrays, None if keys is None else list(keys)), out_dir, prefix, **options)


def build_npz(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = "shard",
              **options: Any) -> DatasetIndex:
    """Every array of an ``.npz`` becomes a field."""
    return build_shards(ArraySource(open_npz(path), description=str(path)), out_dir, prefix, **options)


def build_joblib(folder: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = "shard",
                 fields: tuple[str, str] = ("x", "y"), **options: Any) -> DatasetIndex:
    """Convert ``x_<B>.job``/``y_<B>.job`` batch files (trusted input only: they are pickles)."""
    return build_shards(JoblibBatchSource(folder, fields), out_dir, prefix, **options)


def build_sample_files(root: str | os.PathLike[str], labels: Any, partition: Any,
                       out_dir: str | os.PathLike[str], **options: Any) -> dict[str, DatasetIndex]:
    """One shard set per split, in ``out_dir/<split>/`` with shards ``<split>-000000.tar``.

    ``labels`` (``{ID: label}``) and ``partition`` (``{split: [IDs]}``) are mappings or paths
    of JSON files. Every split is checked before the first shard is written.
    """
    sources = partition_sources(root, labels, partition)
    return {split: build_shards(source, join(os.fspath(out_dir), split), split, **options)
            for split, source in sources.items()}


def build_folder(folder: str | os.PathLike[str], out_dir: str | os.PathLike[str], prefix: str = "shard",
                 recursive: bool = False, **options: Any) -> DatasetIndex:
    """Files grouped by stem (``0001.jpg`` + ``0001.json``), bytes kept as they are."""
    return build_shards(FolderSource(folder, recursive), out_dir, prefix, **options)
