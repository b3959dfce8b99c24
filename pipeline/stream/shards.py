"""What a dataset reads: an indexed shard set, or a list of foreign shards without an index.

``resolve_shards`` accepts an index (file or folder, local or a URL; an ``s3://bucket/prefix``
finds the ``index.json`` under it), a brace pattern (``shards/train/train-{000000..000031}.tar``,
local or URLs) or a list of shard URLs. A pattern or list whose
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
from ..format.index import INDEX_NAME, DatasetIndex, ShardInfo, parse_index
from ..format.index import load_index as load_local_index
from ..storage import SourceError, is_remote, join, parent, read_bytes, redact, scheme


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


def _from_index(location: str) -> IndexedShards:
    """The index at a local path or folder, or at a URL (an ``index.json``, or a folder or bucket
    prefix holding one); shard URLs resolve against the index's folder."""
    if not is_remote(location):
        path = Path(location)
        index = load_local_index(path)
        base = str(path.parent if path.name.endswith(".json") else path)
    else:
        url = location if location.endswith(".json") else join(location, INDEX_NAME)
        index = parse_index(read_bytes(url), redact(url))
        base = parent(url)
    return IndexedShards(index, tuple(join(base, s.url) for s in index.shards))


def load_index(location: str | os.PathLike[str]) -> DatasetIndex:
    """An index from a local file or folder, or from a URL (``http(s)://``, ``s3://``...) of an
    ``index.json`` or of a folder or bucket prefix holding one."""
    return _from_index(os.fspath(location)).index


def _index_beside(urls: list[str]) -> IndexedShards | None:
    """The index in the one folder that holds all of ``urls``, if there is one."""
    if any(scheme(u) == "pipe" for u in urls):
        return None  # a command's output has no folder to hold an index
    folders = {parent(u) for u in urls}
    if len(folders) != 1:
        return None
    folder = folders.pop()
    if not is_remote(folder):
        return _from_index(folder) if (Path(folder) / INDEX_NAME).is_file() else None
    try:
        return _from_index(join(folder, INDEX_NAME))
    except SourceError:
        return None


def _is_index_location(text: str) -> bool:
    if text.endswith(".json") or text.endswith("/"):
        return True
    if is_remote(text):
        return scheme(text) == "s3" and not text.endswith(".tar") and "{" not in text
    return Path(text).is_dir()


def resolve_shards(source: str | os.PathLike[str] | Sequence[str]) -> ShardSource:
    """Interpret what the user passed to the dataset (see the module docstring)."""
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if _is_index_location(text):
            return _from_index(text)
        urls = list(braceexpand(text))
    else:
        urls = [os.fspath(u) for u in source]
    if not urls:
        raise ValueError("no shards given")
    indexed = _index_beside(urls)
    if indexed is not None:
        position = {os.path.normpath(u): i for i, u in enumerate(indexed.urls)}
        wanted = [position.get(os.path.normpath(u)) for u in urls]
        if all(i is not None for i in wanted):
            chosen = [indexed.shards[i] for i in wanted]  # type: ignore[index]
            subset = DatasetIndex(indexed.index.fields, chosen, indexed.index.pack)
            return IndexedShards(subset, tuple(indexed.urls[i] for i in wanted))  # type: ignore[index]
    for url in urls:
        if not is_remote(url) and not Path(url).is_file():
            raise IndexFormatError(f"{url}: no such shard")
    return ForeignShards(tuple(urls))
