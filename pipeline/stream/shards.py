"""What a dataset reads: an indexed shard set, or a list of foreign shards without an index.

``resolve_shards`` accepts an index (file or folder), a brace pattern
(``shards/train/train-{000000..000031}.tar``) or a list of shard URLs. A pattern or list whose
shards are all named by the ``index.json`` beside them is read through that index (exact
epochs); otherwise the shards are *foreign* and stream without one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from braceexpand import braceexpand

from ..format.errors import IndexFormatError
from ..format.index import INDEX_NAME, DatasetIndex, ShardInfo, load_index


@dataclass(frozen=True)
class IndexedShards:
    """Shards with an index: URLs resolved against the index's folder."""

    index: DatasetIndex
    urls: tuple[str, ...]

    @property
    def shards(self) -> list[ShardInfo]:
        return self.index.shards


@dataclass(frozen=True)
class ForeignShards:
    """Shards without an index: no sample counts, so no exact plan and no ``len()``."""

    urls: tuple[str, ...]


ShardSource = IndexedShards | ForeignShards


def _from_index(path: Path) -> IndexedShards:
    index = load_index(path)
    base = path.parent if path.name.endswith(".json") else path
    return IndexedShards(index, tuple(str(base / s.url) for s in index.shards))


def resolve_shards(source: str | os.PathLike[str] | Sequence[str]) -> ShardSource:
    """Interpret what the user passed to the dataset (see the module docstring)."""
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        path = Path(text)
        if text.endswith(".json") or path.is_dir():
            return _from_index(path)
        urls = list(braceexpand(text))
    else:
        urls = [os.fspath(u) for u in source]
    if not urls:
        raise ValueError("no shards given")
    folders = {str(Path(u).parent) for u in urls}
    if len(folders) == 1:
        index_path = Path(folders.pop()) / INDEX_NAME
        if index_path.is_file():
            indexed = _from_index(index_path)
            position = {os.path.normpath(u): i for i, u in enumerate(indexed.urls)}
            wanted = [position.get(os.path.normpath(u)) for u in urls]
            if all(i is not None for i in wanted):
                chosen = [indexed.shards[i] for i in wanted]  # type: ignore[index]
                subset = DatasetIndex(indexed.index.fields, chosen, indexed.index.pack)
                return IndexedShards(subset, tuple(indexed.urls[i] for i in wanted))  # type: ignore[index]
    for url in urls:
        if "://" not in url and not Path(url).is_file():
            raise IndexFormatError(f"{url}: no such shard")
    return ForeignShards(tuple(urls))
