"""The checks of a dataset's and a loader's options, made when they are built: a wrong one is an
error naming it and the values it may take, there, rather than an exception of NumPy or PyTorch
at the first batch, in a worker."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np


def _names(option: str, names: Sequence[str] | None) -> None:
    if names is None:
        return
    if isinstance(names, str):
        raise ValueError(f"{option} is a list of field names, e.g. {option}=['x', 'y'], got the string {names!r}")
    if not list(names):
        raise ValueError(f"{option}=[] names no field: name at least one, or leave {option} out")


def check_dataset_options(batch_size: Any, on_error: str, remainder: str, read_ahead: int | None,
                          fields: Sequence[str] | None, as_tuple: Sequence[str] | None) -> None:
    """The options of a :class:`~pipeline.stream.dataset.ShardDataset` that need no shards to check."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if remainder not in ("drop", "pad", "keep"):
        raise ValueError(f"remainder must be 'drop', 'pad' or 'keep', got {remainder!r}")
    if read_ahead is not None and read_ahead < 0:
        raise ValueError(f"read_ahead must be >= 0, got {read_ahead}")
    _names("fields", fields)
    _names("as_tuple", as_tuple)
    if fields is not None and as_tuple is not None and set(as_tuple) - set(fields):
        raise ValueError(f"as_tuple names {sorted(set(as_tuple) - set(fields))}, which fields= leaves out")


def check_tuple_fields(as_tuple: Sequence[str] | None, schema: Mapping[str, Any], transformed: bool) -> None:
    """``as_tuple``'s names against the fields in the index (a transform may make others)."""
    unknown = sorted(set(as_tuple or ()) - set(schema))
    if unknown and schema and not transformed:
        raise ValueError(f"as_tuple names {unknown}, which are not in the index (it has {sorted(schema)})")


def check_loader_options(num_workers: Any, prefetch_factor: int | None) -> None:
    """The options of :func:`~pipeline.stream.loader.make_loader` that PyTorch checks late, or
    with an assertion."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0 (0: read in the training process), got {num_workers!r}")
    if num_workers and prefetch_factor is not None and prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be >= 1 (messages each worker keeps ready), got {prefetch_factor}")
