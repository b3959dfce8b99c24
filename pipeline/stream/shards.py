"""What a dataset reads: an indexed shard set, or a list of foreign shards without an index.

``resolve_shards`` accepts an index (file or folder, local or a URL; an ``s3://bucket/prefix``
or a URL of fsspec's (``gs://``, ``hf://``) that names no shard (``.tar``, ``.tar.gz``), or an
``http(s)`` URL whose last name has no suffix, finds the ``index.json`` under it), a
brace pattern (``shards/train/train-{000000..000031}.tar``, local or URLs) or a list of shard
URLs. A pattern or list whose
shards are all named by the ``index.json`` beside them is read through that index, in its
order (exact epochs); otherwise the shards are *foreign* and stream without one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
from urllib.parse import urlsplit

from braceexpand import braceexpand

from ..caller_warning import warn_caller
from ..format.index import DatasetIndex
from ..storage import SourceError, is_remote, parent, redact, scheme
from ..storage.indexes import (
    IndexedShards,
    NoIndexError,
    UnansweredIndexError,
    http_forbidden,
    index_url,
    no_shard_either,
    open_index,
    strays,
)
from ..storage.location_hints import SHARD_SUFFIXES, location_hint
from ..storage.opener import local_path
from ..storage.retry import RetryPolicy, RetrySink


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
#: What ``resolve_shards`` takes: an index or its folder (or URL), a brace pattern, or a list of shards.
Location = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def _index_beside(urls: list[str], policy: RetryPolicy | None, stats: RetrySink | None) -> IndexedShards | None:
    """The index in the one folder that holds all of ``urls``, if there is one."""
    if any(scheme(u) == "pipe" for u in urls):
        return None  # a command's output has no folder to hold an index
    folders = {parent(u) for u in urls}
    if len(folders) != 1:
        return None
    folder = folders.pop()
    if not is_remote(folder) and not os.path.isfile(index_url(folder)):
        return None  # no index there: foreign shards
    try:
        return open_index(folder, policy, stats, hint=False)
    except (NoIndexError, UnansweredIndexError):
        return None  # no index there to use: foreign shards (a broken index is an error)


def _from_here(text: str) -> str:
    """A relative local path made absolute, as it names a file now: a dataset reads it later,
    after the script may have changed its current folder (into a run's folder, say), where the
    same name read another set's shards under this one's index."""
    return text if is_remote(text) or os.path.isabs(local_path(text)) else os.path.join(os.getcwd(), text)


def _shard_key(url: str) -> str:
    """``url`` in the form shared by every way of naming it (``file:///a/x.tar`` and ``/a/./x.tar``
    name the same shard), to find it among an index's shards."""
    return os.path.normpath(local_path(url))


def _is_index_location(text: str) -> bool:
    if text.endswith(".json") or text.endswith("/"):
        return True
    if is_remote(text):
        if "{" in text:
            return False
        if scheme(text) in ("http", "https"):  # a folder or an index.json (a query may follow), or a
            # name without a suffix, which may be either (a shard's when no index is there)
            return _http_set_path(text) or "." not in urlsplit(text).path.rsplit("/", 1)[-1]
        # s3:// and fsspec's: a prefix or folder, unless a shard (.tar.gz too)
        return scheme(text) != "pipe" and not text.endswith(SHARD_SUFFIXES)
    return Path(local_path(text)).is_dir()  # a file:// URL names a local path too


def _http_set_path(text: str) -> bool:
    """Whether the HTTP(S) URL ``text``'s path names a folder or an index (a query may follow it)."""
    return scheme(text) in ("http", "https") and urlsplit(text).path.endswith(("/", ".json"))


def _refuse_sets_in_a_list(urls: list[str]) -> None:
    """A list is of shards: a shard set in it (its folder or its index) would be read as a shard,
    or looked for as one, so it is an error saying how to pass sets."""
    for url in urls:
        if url.endswith((".json", "/")) or (not is_remote(url) and os.path.isdir(local_path(url))):
            raise ValueError(f"{url} is a shard set (a folder or an index), in a list of shards: pass one set alone "
                             f"(make_loader({url!r})), or mix sets as a mapping {{name: set}}, e.g. {{'a': 'A/', "
                             f"'b': 'B/'}} (with weights= if you like)")


#: The suffixes of the files shards are built from, and of an index's table: given to a loader as a
#: shard, each failed at its first read, "truncated header: expected 512 bytes".
_NOT_SHARDS = (".npy", ".npz", ".pt", ".pth", ".job", ".joblib", ".pkl", ".pickle", ".parquet", ".arrow", ".csv")


def _refuse_inputs(url: str) -> None:
    """Raise for a file given as a shard that is a build's input, or an index's table (not for a
    ``pipe:`` command, which may well take an input and write a shard)."""
    if scheme(url) == "pipe":
        return
    name = url.rsplit("/", 1)[-1].lower()
    if name == "index.bin" or (name.endswith(".bin") and not is_remote(url) and os.path.isfile(url[:-4] + ".json")):
        raise ValueError(f"{url} is the shard table of an index: pass the index's folder, or its .json file")
    if name.endswith(_NOT_SHARDS):
        raise ValueError(f"{url} is a {name.rsplit('.', 1)[-1]} file, not a shard: build shards from it first "
                         f"(pipeline build ...: see Building shards in the README), and pass their folder")


def _warn_of_strays(indexed: IndexedShards) -> None:
    """Shards in a local set's folder that its index does not name are not read: a warning, as
    such shards are most often added after the build, and meant to be read."""
    found = strays(indexed.base, indexed.index)
    if found:
        warn_caller(f"{indexed.base} holds {len(found)} shard(s) its index does not name (e.g. {found[0]}): they are "
                    f"not read; build them into the set, or index the folder's shards anew (pipeline index "
                    f"{indexed.base}), or move them out")


def _maybe_a_shard(text: str, exc: Exception) -> bool:
    """Whether a location read as a folder, where ``exc`` says no index can be read, may be a
    shard itself: an HTTP(S) URL whose last name has no suffix (``https://host/data/shard-000001``)
    when the server says nothing is there, or that it is forbidden (as a bucket that may not be
    listed says); a URL of fsspec's (``gs://bucket/shard-000001``) whatever its file system says
    of a path under a file (``NotADirectoryError``, ``FileExistsError``...). Not a local folder,
    nor an S3 prefix, nor a folder of splits (``gs://bucket/out`` holding ``train``): no index
    there is the error, saying what to pass (and which splits are there)."""
    if scheme(text) in ("file", "s3", "pipe") or text.endswith(("/", ".json")) or _http_set_path(text) or \
            getattr(exc, "splits_beside", False):
        return False
    return scheme(text) not in ("http", "https") or isinstance(exc, NoIndexError) or http_forbidden(exc)


def resolve_shards(source: Location, policy: RetryPolicy | None = None,
                   stats: RetrySink | None = None) -> ShardSource:
    """Interpret what the user passed to the dataset (see the module docstring); remote reads
    of an index follow ``policy`` and report their retries to ``stats``."""
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if _is_index_location(text):
            try:
                indexed = open_index(_from_here(text), policy, stats, patterns=True)
            except (NoIndexError, UnansweredIndexError) as exc:
                if not _maybe_a_shard(text, exc):
                    raise
                neither = no_shard_either(exc, text, policy, stats) if scheme(text) in ("http", "https") else None
                if neither is not None:
                    raise neither from None  # (a folder's URL misspelt, whose error says what to pass)
            else:
                _warn_of_strays(indexed)
                return indexed
        urls = [_from_here(url) for url in braceexpand(text)]
    else:
        given = [os.fspath(u) for u in source]  # (any iterable: read once)
        _refuse_sets_in_a_list(given)  # (named as given)
        urls = [_from_here(url) for url in given]
    if not urls:
        raise ValueError("no shards given")
    indexed = _index_beside(urls, policy, stats)
    if indexed is not None:
        position = {_shard_key(indexed.url(i)): i for i in range(len(indexed.shards))}
        wanted = [position.get(_shard_key(u)) for u in urls]
        if all(i is not None for i in wanted):
            # in the index's order: the plan is the same whatever order the list came in (nodes that each
            # glob their own copy list it in their file system's order, and their ranks' samples overlapped)
            chosen = sorted(i for i in wanted if i is not None)
            subset = DatasetIndex(indexed.index.fields, indexed.shards.take(chosen), indexed.index.pack,
                                  metadata=indexed.index.metadata)  # type: ignore[arg-type]
            return IndexedShards(subset, indexed.base, indexed.index_url)
    for url in urls:
        if not is_remote(url) and not Path(local_path(url)).is_file():
            hint = "" if url.endswith(".tar") else location_hint(local_path(url), patterns=True)  # a split, misspelt?
            raise SourceError(url, None, f"no such shard or folder{hint}")  # as a missing remote shard is
        _refuse_inputs(url)
    if indexed is not None:
        unknown = [u for u, i in zip(urls, wanted) if i is None]
        warn_caller(f"{len(unknown)} of the {len(urls)} shards given are not in the index beside them "
                      f"({redact(index_url(indexed.base))}), e.g. {redact(unknown[0])}: all {len(urls)} stream without "
                      f"it (no len(), no checksums, no exact resume); index them with the others (pipeline index), "
                      f"or leave them out")
    return ForeignShards(tuple(urls))
