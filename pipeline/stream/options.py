"""The checks of a dataset's and a loader's options, made when they are built: a wrong one is an
error naming it and the values it may take, there, rather than an exception of NumPy or PyTorch
at the first batch, in a worker."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..caller_warning import warn_caller
from ..format.numbers import is_whole
from ..format.packing import SAMPLE_KEY
from .stats import MAX_WORKERS

#: How the errors of damaged records say to skip them (a command with an option for it rewords it).
SKIP_HINT = "pass on_error='skip'"


def _names(option: str, names: Sequence[str] | None) -> None:
    if names is None:
        return
    if isinstance(names, str):
        raise ValueError(f"{option} is a list of field names, e.g. {option}=['x', 'y'], got the string {names!r}")
    if not list(names):
        raise ValueError(f"{option}=[] names no field: name at least one, or leave {option} out")


def check_dataset_options(batch_size: Any, on_error: str, remainder: str, read_ahead: int | None,
                          fields: Sequence[str] | None, as_tuple: Sequence[str] | None, transformed: bool,
                          seed: Any = 0, shuffle_buffer: Any = None, chunks_per_buffer: Any = None,
                          decoded: Sequence[str] = ()) -> None:
    """The options of a :class:`~pipeline.stream.dataset.ShardDataset` that need no shards to check
    (``transformed``: a transform runs, and may make fields of its own; ``decoded``: the fields
    images decode into, which batches hold too)."""
    if not is_whole(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if not is_whole(seed) or not 0 <= seed < 1 << 64:
        raise ValueError(f"seed must be an integer from 0 to 2**64 - 1 (it picks the shuffle's orders, from its 64 "
                         f"bits: a larger one would give another's), got {seed!r}")
    for name, value in (("shuffle_buffer", shuffle_buffer), ("chunks_per_buffer", chunks_per_buffer)):
        if value is not None and (not is_whole(value) or value < 1):
            raise ValueError(f"{name} must be an integer >= 1, or None for its default, got {value!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if remainder not in ("drop", "pad", "keep"):
        raise ValueError(f"remainder must be 'drop', 'pad' or 'keep', got {remainder!r}")
    if read_ahead is not None and (not is_whole(read_ahead) or read_ahead < 0):
        raise ValueError(f"read_ahead must be an integer >= 0 (units read ahead), or None for its default, got "
                         f"{read_ahead!r}")
    _names("fields", fields)
    _names("as_tuple", as_tuple)
    left_out = set(as_tuple or ()) - set(fields or ()) - set(decoded)
    if fields is not None and left_out and not transformed:
        raise ValueError(f"as_tuple names {sorted(left_out)}, which fields= leaves out")


def check_flags(**flags: Any) -> None:
    """Options that are True or False: a string (``"False"`` from a config file) is truthy, and
    would do the opposite of what it says."""
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)) and not (is_whole(value) and value in (0, 1)):
            raise TypeError(f"{name} must be True or False, got {value!r}")


def check_callables(**functions: Any) -> None:
    for name, function in functions.items():
        if function is not None and not callable(function):
            raise TypeError(f"{name} must be a function (or None), got {function!r}")


def check_fill(fill: Any) -> None:
    if fill is not None and not isinstance(fill, Mapping):
        raise TypeError(f"fill maps field names to the values of samples that lack them, e.g. fill={{'txt': ''}}; "
                        f"got {fill!r}")


def check_epoch(epoch: Any) -> int:
    """An epoch number: an integer >= 0 (``1.7`` would be played as epoch 1)."""
    if not is_whole(epoch) or epoch < 0:
        raise ValueError(f"an epoch is an integer >= 0, got {epoch!r}")
    return int(epoch)


def environment_count(name: str, default: int) -> int:
    """An integer from the environment (``RANK``, ``WORLD_SIZE``, as torchrun sets them)."""
    text = os.environ.get(name, "")
    if not text.strip():
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"the environment variable {name}={text!r} is not an integer: set it as torchrun does, or "
                         f"unset it") from None


#: Where a dataset learns its rank, when the process group starts after it is made.
RANKS_ADVICE = ("Make the loader once torch.distributed is initialised (under PyTorch Lightning, in the "
                "LightningDataModule's or LightningModule's train_dataloader() and val_dataloader(), not before "
                "trainer.fit), or pass rank= and world_size= (rank=0, world_size=1 for every sample in each process)")


def check_ranks_unchanged(rank: int, world_size: int) -> None:
    """Refuse to iterate a dataset that took its rank and world size from nowhere (0 of 1: no
    process group yet) where a process group now says otherwise: every rank would read the whole
    set, or one rank's share."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    now = torch.distributed.get_rank(), torch.distributed.get_world_size()
    if now != (rank, world_size):
        raise RuntimeError(f"this dataset was made as rank {rank} of {world_size}, before torch.distributed was "
                           f"initialised, and this process is rank {now[0]} of {now[1]}: it would read another "
                           f"share than its rank's. {RANKS_ADVICE}")


def rank_and_world(rank: Any, world_size: Any) -> tuple[int, int]:
    """This process's rank and the world size: those given, else torch.distributed's when it is
    initialised, else ``RANK``/``WORLD_SIZE`` (as torchrun sets them), else 0 of 1."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    # one given, the other from nowhere: every process would take the same part (world_size=2
    # alone is rank 0 in each), or a rank of a world of one
    for given, name, other, variable in ((world_size, "world_size", rank, "RANK"),
                                         (rank, "rank", world_size, "WORLD_SIZE")):
        if given is not None and other is None and not distributed and variable not in os.environ:
            missing = "rank" if name == "world_size" else "world_size"
            raise ValueError(f"{name}={given!r} is given without {missing}=: pass both (each process its own rank, "
                             f"0 to world_size - 1), or neither under torchrun or torch.distributed")
    if rank is None and world_size is None and not distributed and not os.environ.get("RANK", "").strip() \
            and environment_count("WORLD_SIZE", 1) > 1:  # (PyTorch Lightning's launcher sets no RANK)
        raise ValueError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} is set but RANK is not, and torch.distributed is not "
                         f"initialised: every process would read rank 0's share. {RANKS_ADVICE}; outside a "
                         f"distributed job, unset WORLD_SIZE")
    if rank is None:
        rank = torch.distributed.get_rank() if distributed else environment_count("RANK", 0)
    if world_size is None:
        world_size = torch.distributed.get_world_size() if distributed else environment_count("WORLD_SIZE", 1)
    if not is_whole(rank) or not is_whole(world_size):
        raise TypeError(f"rank and world_size must be integers, got {rank!r} and {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}: ranks are 0 to {world_size - 1}")
    return int(rank), int(world_size)


def check_read_fields(as_tuple: Sequence[str] | None, fill: Mapping[str, Any], fields: Any, transformed: bool,
                      where: str, decoded: Sequence[str] = ()) -> None:
    """``as_tuple``'s names (unless a transform runs: it may make others; ``decoded``, the fields
    images decode into, are batches' too) and ``fill``'s keys against the ``fields`` read, those
    of ``where``: a name that is not among them would fail at the first batch, or be ignored."""
    if SAMPLE_KEY in fill:
        raise ValueError(f"fill gives {SAMPLE_KEY!r} a value, but every sample has its key: leave it out of fill")
    if not fields:
        return  # an empty set: nothing to check against
    unknown = sorted(set(as_tuple or ()) - set(fields) - set(decoded))
    if unknown and not transformed:
        keys = f"; to read the samples' keys, name {SAMPLE_KEY!r} in fields= too" if SAMPLE_KEY in unknown else ""
        raise ValueError(f"as_tuple names {unknown}, which are not in {where} (it has {sorted(fields)}){keys}")
    unused = sorted(set(fill) - set(fields))
    if unused:
        raise ValueError(f"fill keys {unused} are not in {where} (it has {sorted(fields)})")


def check_loader_options(num_workers: Any, prefetch_factor: int | None) -> None:
    """The options of :func:`~pipeline.stream.loader_defaults.make_loader` that PyTorch checks late, or
    with an assertion."""
    if not is_whole(num_workers) or num_workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0 (0: read in the training process), got {num_workers!r}")
    if num_workers > MAX_WORKERS:
        raise ValueError(f"num_workers={num_workers} is more than the {MAX_WORKERS} workers a loader counts the reads "
                         f"of (stats()): give fewer")
    if num_workers and prefetch_factor is not None and prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be >= 1 (messages each worker keeps ready), got {prefetch_factor}")


#: Chunks (places in the shards) mixed in one shuffle window; fewer for remote shards, whose
#: chunks are then twice as large, to halve the requests of an epoch: each request costs a
#: client and a server several milliseconds of CPU (S3 here: 1.6x the samples a second), and
#: 32 places of class-sorted shards still give a batch of 256 9.4 of 10 classes (3.05 bits; the
#: test of shuffle quality asks for 9 and 3.0; 64 places give 9.97 and 3.20).
CHUNKS_PER_BUFFER, REMOTE_CHUNKS_PER_BUFFER = 64, 32

#: ``cache_bytes``' default: what a cache holds unless told.
DEFAULT_CACHE_BYTES = 64 << 30


def check_cache_options(cache_dir: Any, cache_bytes: Any, verify: Any) -> str | None:
    """The cache's folder (``~`` expanded, made absolute), once its options are checked: ``cache_bytes`` and
    ``verify`` given without a ``cache_dir`` would be ignored, and a folder that is a file would
    fail at the first read."""
    if not is_whole(cache_bytes) or cache_bytes < 1:
        raise ValueError(f"cache_bytes must be a number of bytes >= 1 (e.g. 100 << 30 for 100 GiB), got {cache_bytes!r}")
    if not isinstance(verify, bool):
        raise ValueError(f"verify must be True or False, got {verify!r}")
    if cache_dir is None:
        if verify or cache_bytes != DEFAULT_CACHE_BYTES:
            raise ValueError("cache_bytes and verify are options of the cache of remote shards: pass cache_dir= too")
        return None
    folder = os.path.expanduser(os.fspath(cache_dir))
    if not folder:
        raise ValueError("cache_dir='' names no folder: pass one (it is created), or leave cache_dir out")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"cache_dir {folder} is a file, not a folder: pass a folder (it is created)")
    return os.path.abspath(folder)  # (the folder named now: the script may change its folder later)


def warn_of_cache_use(folder: str | None, cache_bytes: int, sources: Any) -> None:
    """Warn when a cache in ``folder`` (given for remote shards) would not serve: ``sources`` (a
    :class:`~pipeline.stream.sources.SourceSet`) is ``None`` for shards without an index, which
    are streamed, not cached; or ``cache_bytes`` cannot hold their largest shard, and each read
    of it would download it again (24 times the data an epoch, measured)."""
    if folder is None:
        return
    if sources is None:
        warn_caller(f"cache_dir={folder!r} is not used: shards without an index are streamed through once an epoch, "
                    f"not cached; index them (pipeline index URL... --output DIR, then read DIR) to cache them")
        return
    largest = max((int(shards.shards.nbytes.max()) for shards in sources.shards if shards.remote and len(shards.shards)),
                  default=0)
    if largest > cache_bytes:
        warn_caller(f"cache_bytes={cache_bytes:,} holds less than the largest shard ({largest:,} bytes): shards are "
                    f"downloaded again and again; give a cache_bytes of several shards at least")
