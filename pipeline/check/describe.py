"""``describe`` and ``iter_samples``: what a shard set holds, local or remote, for people to read."""

from __future__ import annotations

import os
from contextlib import closing
from itertools import islice
from typing import Any, Iterator

from ..format.index import DatasetIndex
from ..format.summary import describe_index, stream_samples
from ..storage import join, open_stream, parent, redact
from ..storage.indexes import index_url, open_index


def iter_samples(location: str | os.PathLike[str],
                 index: DatasetIndex | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(key, sample)`` in index order, packed records unpacked (for inspection), streaming
    each shard of the index at ``location`` (a path or URL, as for ``load_index``); pass the
    ``index`` already loaded from there to save reading it again."""
    url = index_url(location)
    if index is None:
        index = open_index(url).index
    base = parent(url)
    for name in index.shards.names:
        shard = join(base, name)
        with open_stream(shard) as stream:
            yield from stream_samples(stream, shard)


def describe(location: str | os.PathLike[str], samples: int = 3) -> str:
    """The text ``python -m pipeline inspect`` prints: schema, counts, sizes and the first
    ``samples`` samples of the index at ``location`` (a path or URL, as for ``load_index``)."""
    url = index_url(location)
    index = open_index(url).index
    with closing(iter_samples(url, index)) as each:  # closes the shard being read
        first = list(islice(each, samples))
    return describe_index(index, redact(url), first)
