"""Keys given by a source are unique across the whole build, as ``write_shards(keys=)`` and
``ShardWriter`` make them: two samples of one key would both come out of the loader under one
``__key__``, and two of them in one shard make a record a reader refuses (its members would not
be next to each other).

A shard's task sees only its own rows, so each task checks its shards' keys (naming a key given
twice within one) and sends back a 16-byte hash of each key (too long for two keys of a set of
billions to share one by chance); the build joins them and names the two shards where one
repeats. (Shards a resume keeps are not read
again: their keys go unchecked.)
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import numpy as np

from ..format.errors import SampleError


class ShardKeys:
    """The keys of one shard being written: each checked against those before it."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._rows: dict[str, int] = {}

    def add(self, keys: Sequence[str] | None, first: int) -> None:
        """Take the keys of samples ``first...`` (``None``: generated keys, unique by making)."""
        if keys is None:
            return
        for row, key in enumerate(keys, first):
            earlier = self._rows.setdefault(key, row)
            if earlier != row:
                raise SampleError(f"{self.where}: sample key {key!r} is given twice, samples {earlier} and {row}: "
                                  f"a source's keys must be unique (give each sample its own)")

    def hashes(self) -> np.ndarray | None:
        """The keys' hashes, for :func:`refuse_repeated_keys`; ``None`` without given keys."""
        if not self._rows:
            return None
        return np.frombuffer(b"".join(hashlib.blake2b(key.encode(), digest_size=16).digest() for key in self._rows),
                             dtype="V16")


def refuse_repeated_keys(shards: Iterable[tuple[str, np.ndarray | None]], source: str) -> None:
    """Raise, naming two shards, where a key's hash is in more than one of ``shards`` (``(name,
    hashes)``, each shard's hashes unique already)."""
    hashed = [(name, hashes) for name, hashes in shards if hashes is not None]
    if len(hashed) < 2:
        return
    values, counts = np.unique(np.concatenate([hashes for _, hashes in hashed]), return_counts=True)
    repeated = values[counts > 1]
    if not len(repeated):
        return
    holders = [name for name, hashes in hashed if np.isin(repeated[0], hashes)]
    raise SampleError(f"{source}: {len(repeated)} sample key(s) are given twice, in different shards (one is in both "
                      f"{holders[0]} and {holders[1]}): a source's keys must be unique (give each sample its own); "
                      f"no index was written")
