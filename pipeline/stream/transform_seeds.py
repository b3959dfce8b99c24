"""The random draws of transforms: each batch's from generators seeded for that batch.

A ``sample_transform`` or ``batch_transform`` that augments data draws from the global
generators: ``random``, NumPy's ``np.random`` and torch's CPU generator. Left as the process
seeded them, their draws depend on which worker finishes a batch (other draws on another
``num_workers``) and on when the workers started: a resumed run's new workers are seeded as the
first run's were, so the rest of the epoch got the draws of its first batches again, and ranks
that seed torch alike drew alike. So the transforms of each batch run with the three generators
seeded from the dataset's seed, the epoch and the place in the epoch of the batch's first sample
(as :class:`~.images.Images` seeds its crops): a batch gets the same draws on any number of
workers, under any start method and after a resume; other batches, ranks, epochs and seeds get
others. Each library gets a seed of its own: ``random``'s, NumPy's and torch's generators are
all Mersenne Twisters, and seeded alike they would draw the same numbers. In the training
process (no workers) the generators are put back after, so that it draws on (dropout, say) as
if no transform had drawn.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import get_worker_info

from .material import Draw, row_seeds

#: Where each library's seed comes from.
_DRAWS = (Draw.TRANSFORM_RANDOM, Draw.TRANSFORM_NUMPY, Draw.TRANSFORM_TORCH)
BatchSeed = tuple[int, int, int]


def batch_seeds(seed: int, epoch: int, places: np.ndarray, batch_size: int) -> list[BatchSeed]:
    """The seeds of each batch of a unit whose rows have these ``places`` in the epoch, each of
    its 64 bits mixed into the others: torch seeds its generator with the low 32 only, where the
    place of a row of a stream without an index keeps its consumer's number (every worker and
    rank drew alike)."""
    firsts = places[::batch_size]
    return list(zip(*(_mixed(row_seeds(seed, epoch, firsts, draw)).tolist() for draw in _DRAWS)))


def _mixed(words: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every bit of a word moves every bit of the result."""
    with np.errstate(over="ignore"):
        x = words.astype(np.uint64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


@contextmanager
def seeded_generators(seeds: BatchSeed) -> Iterator[None]:
    """Run the block with ``random``, ``np.random`` and torch's CPU generator seeded by
    ``seeds``; in the training process (no workers), put back as they were after. (A worker's
    generators serve its transforms only: 90 us a batch saved.)"""
    for_random, for_numpy, for_torch = seeds
    saved = None if get_worker_info() is not None else (
        random.getstate(), np.random.get_state(), torch.default_generator.get_state())
    random.seed(for_random)
    np.random.seed([for_numpy & 0xFFFFFFFF, for_numpy >> 32])
    torch.default_generator.manual_seed(for_torch)
    try:
        yield
    finally:
        if saved is not None:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.default_generator.set_state(saved[2])


def seeded_batches(batches: Iterable[Any], seeds: list[BatchSeed] | None, finish: Callable[[Any], Any],
                   timing: Callable[[], ContextManager[None]]) -> Iterator[Any]:
    """``finish`` of each batch, with the generators seeded by the batch's seeds (``None``: no
    transform draws, nothing seeded), the transforms' seeding and run inside ``timing()``."""
    for number, batch in enumerate(batches):
        if seeds is None:
            yield finish(batch)
            continue
        with timing(), seeded_generators(seeds[number]):
            finished = finish(batch)
        yield finished
