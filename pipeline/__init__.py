"""Build WebDataset tar shards of msgpack samples, with an index, from the layouts people have.

The public API, documented in README.md:

- encoding: :func:`encode_sample`, :func:`decode_record`
- writing: :class:`ShardWriter`, :func:`write_shards`, :func:`build_shards` and the converters
  :func:`build_npz`, :func:`build_joblib`, :func:`build_sample_files`, :func:`build_folder`,
  :func:`build_imagefolder`, :func:`build_parquet`, :func:`build_arrow`
- distributed builds: :class:`Part`, :func:`merge_index_files`
- indexing shards written by other tools in place: :func:`index_shards`
- reading and checking: :func:`load_index`, :func:`iter_records`, :func:`verify`, :func:`describe`
- streaming into PyTorch: :class:`ShardDataset`, :func:`make_loader`, :class:`ShardLoader`,
  :class:`DevicePrefetcher`, and :class:`Images` to decode image fields in the workers
- choosing a loader's settings on the machine at hand: :func:`tune`
"""

from typing import TYPE_CHECKING

from .check.describe import describe, iter_samples
from .check.verify import verify
from .format.codec import decode_record, encode_sample
from .format.errors import FormatError, IndexFormatError, SampleError, ShardError
from .format.index import DatasetIndex, FieldSpec, ShardInfo
from .format.packing import sample_keys, unpack_rows
from .format.records import decode_fields, iter_records
from .format.verify import Problem
from .storage.errors import ServerSetupError, SourceError
from .storage.indexes import load_index
from .write.api import (
    build_arrow,
    build_folder,
    build_imagefolder,
    build_joblib,
    build_npz,
    build_parquet,
    build_sample_files,
    write_shards,
)
from .write.indexing import index_shards
from .write.merge import merge_index_files
from .write.output import OutputExistsError
from .write.part import Part
from .write.rows import RowBlock
from .write.run import build_shards
from .write.source import Source
from .write.sources.arrays import ArraySource, open_npy, open_npz
from .write.sources.folder import FolderSource
from .write.sources.image_folder import ImageFolderSource
from .write.sources.joblib_batches import JoblibBatchSource
from .write.sources.sample_files import SampleFileSource, partition_sources
from .write.splits import validation_rows
from .write.writer import ShardWriter

__version__ = "0.1.0"

_LAZY = {"ShardDataset": "stream.dataset", "DevicePrefetcher": "stream.prefetch", "ShardLoader": "stream.loader",
         "make_loader": "stream.loader_defaults", "WorkerError": "stream.worker_deaths", "tune": "measure.tune",
         "Images": "stream.images"}

if TYPE_CHECKING:  # (a type checker sees the names _LAZY imports on first use: tests/test_package.py keeps them alike)
    from .measure.tune import tune
    from .stream.dataset import ShardDataset
    from .stream.images import Images
    from .stream.loader import ShardLoader
    from .stream.loader_defaults import make_loader
    from .stream.prefetch import DevicePrefetcher
    from .stream.worker_deaths import WorkerError
else:
    def __getattr__(name: str) -> object:
        """Import the torch-based reader on first use, so that building shards (and the CLI) does
        not pay for importing torch."""
        if name in _LAZY:
            from importlib import import_module

            return getattr(import_module(f".{_LAZY[name]}", __name__), name)
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")

__all__ = [
    "ArraySource", "DatasetIndex", "DevicePrefetcher", "ShardDataset", "ShardLoader", "SourceError",
    "make_loader", "FieldSpec", "FolderSource", "ImageFolderSource", "Images", "FormatError", "IndexFormatError",
    "JoblibBatchSource", "OutputExistsError", "Part", "Problem", "RowBlock", "SampleError", "SampleFileSource", "Source",
    "ServerSetupError", "ShardError", "ShardInfo", "ShardWriter", "WorkerError", "build_arrow", "build_folder", "build_imagefolder", "build_joblib",
    "build_npz", "build_parquet",
    "build_sample_files", "build_shards", "decode_fields", "decode_record", "describe",
    "encode_sample", "index_shards", "iter_records", "iter_samples", "load_index", "merge_index_files", "open_npy",
    "open_npz", "partition_sources", "sample_keys", "tune", "unpack_rows", "validation_rows", "verify",
    "write_shards",
]
