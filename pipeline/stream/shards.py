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
from ..format.index import INDEX_NAME, DatasetIndex, TableFile, parse_index
from ..format.index import load_index as load_local_index
from ..format.shard_names import ShardNames
from ..format.shard_table import ShardTable, read_table
from ..storage import SourceError, is_remote, join, parent, read_bytes, read_range, redact, scheme

#: Offsets are fetched remotely 256 KiB (64k records) a request.
REMOTE_BLOCK_BYTES = 1 << 18


@dataclass(frozen=True)
class UrlRange:
    """Ranged reads of one URL (picklable, for DataLoader workers started with spawn)."""

    url: str

    def __call__(self, start: int, stop: int) -> bytes:
        return bytes(read_range(self.url, start, stop))


@dataclass(frozen=True)
class IndexedShards:
    """Shards with an index; their URLs resolve against the index's folder ``base``."""

    index: DatasetIndex
    base: str

    @property
    def shards(self) -> ShardTable:
        return self.index.shards

    def url(self, i: int) -> str:
        return join(self.base, self.index.shards.names[i])

    @property
    def remote(self) -> bool:
        return is_remote(self.base)


@dataclass(frozen=True)
class ForeignShards:
    """Shards without an index: no sample counts, so no exact plan and no ``len()``."""

    urls: tuple[str, ...]

    def url(self, i: int) -> str:
        return self.urls[i]

    @property
    def remote(self) -> bool:
        return any(is_remote(u) for u in self.urls)


ShardSource = IndexedShards | ForeignShards


def _from_index(location: str) -> IndexedShards:
    """The index at a local path or folder, or at a URL (an ``index.json``, or a folder or bucket
    prefix holding one); shard URLs resolve against the index's folder."""
    if not is_remote(location):
        path = Path(location)
        index = load_local_index(path)
        return IndexedShards(index, str(path.parent if path.name.endswith(".json") else path))
    url = location if location.endswith(".json") else join(location, INDEX_NAME)
    return _from_remote_index(url, read_bytes(url))


def _from_remote_index(url: str, data: bytes) -> IndexedShards:
    """The index whose JSON, read from ``url``, is ``data``; its shard table is read by range."""
    base = parent(url)

    def open_table(table: TableFile, names: ShardNames) -> ShardTable:
        table_url = join(base, table.name)
        return read_table(UrlRange(table_url), table.bytes, redact(table_url), names, REMOTE_BLOCK_BYTES)
    return IndexedShards(parse_index(data, redact(url), open_table), base)


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
    url = join(folder, INDEX_NAME)
    try:
        data = read_bytes(url)
    except SourceError:
        return None  # no index there: foreign shards (a broken index, below, is an error)
    return _from_remote_index(url, data)


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
        position = {os.path.normpath(indexed.url(i)): i for i in range(len(indexed.shards))}
        wanted = [position.get(os.path.normpath(u)) for u in urls]
        if all(i is not None for i in wanted):
            subset = DatasetIndex(indexed.index.fields, indexed.shards.take(wanted), indexed.index.pack)  # type: ignore[arg-type]
            return IndexedShards(subset, indexed.base)
    for url in urls:
        if not is_remote(url) and not Path(url).is_file():
            raise IndexFormatError(f"{url}: no such shard")
    return ForeignShards(tuple(urls))
