"""``make_loader``: a :class:`~.loader.ShardLoader` with the defaults a training loop wants."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from ..unknown_options import refuse_unknown
from .dataset import ShardDataset
from .loader import COLLATE_FN_NOT_TAKEN, ShardLoader
from .options import check_loader_options

#: DataLoader's options that make_loader does not take, and why (a loop written for a DataLoader
#: may pass them on).
_NOT_TAKEN = {
    "collate_fn": COLLATE_FN_NOT_TAKEN,
    "sampler": "a DataLoader's option: the dataset draws each epoch's order from shuffle= and seed=, and shares it "
               "between ranks by rank= and world_size=",
    "generator": "a DataLoader's option: the order is drawn from seed= and the epoch, the same on any number of "
                 "workers",
}
_NOT_TAKEN["batch_sampler"] = _NOT_TAKEN["sampler"]
#: DataLoader's options passed on as given (``in_order=False`` the loader refuses; newer PyTorch
#: versions ignore ``pin_memory_device``, pinning for the current accelerator, and say so).
_PASSED_ON = ("in_order", "pin_memory_device")


def make_loader(
    dataset: ShardDataset | Any,
    num_workers: int = 2,
    *,
    prefetch_factor: int | None = 2,
    persistent_workers: bool | None = None,
    pin_memory: bool | None = None,
    multiprocessing_context: Any = None,
    timeout: float = 0,
    worker_init_fn: Callable[[int], None] | None = None,
    **dataset_options: Any,
) -> ShardLoader:
    """A :class:`ShardLoader` with sensible defaults: persistent workers, prefetching, and pinned
    memory when CUDA is present. ``dataset`` is a ShardDataset or what ShardDataset takes as
    source (then ``dataset_options`` are its options). The DataLoader options that make sense
    over batches that come collated from the workers are passed on. (Transforms draw from
    generators seeded for each batch: see :mod:`.transform_seeds`.)"""
    refuse_unknown("make_loader", dataset_options, _ACCEPTED, _NOT_TAKEN)
    check_loader_options(num_workers, prefetch_factor)
    loader_options = {name: dataset_options.pop(name) for name in _PASSED_ON if name in dataset_options}
    if not isinstance(dataset, ShardDataset):
        dataset = ShardDataset(dataset, **dataset_options)
    elif dataset_options:
        raise TypeError(f"options {sorted(dataset_options)} apply only when a source is given")
    workers = num_workers > 0
    return ShardLoader(
        dataset,
        **loader_options,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor if workers else None,
        persistent_workers=workers if persistent_workers is None else persistent_workers and workers,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        multiprocessing_context=multiprocessing_context if workers else None,
        timeout=timeout,
        worker_init_fn=worker_init_fn if workers else None,
    )


#: The names make_loader takes: its own, ShardDataset's options, and DataLoader's passed on as given.
_ACCEPTED = [name for function in (make_loader, ShardDataset.__init__)
             for name, parameter in inspect.signature(function).parameters.items()
             if parameter.kind is not inspect.Parameter.VAR_KEYWORD and name not in ("dataset", "self", "source")] + \
    list(_PASSED_ON)
