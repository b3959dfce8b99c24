"""``describe`` and ``iter_samples``: what a shard set holds, local or remote, for people to read."""

from __future__ import annotations

import os
from contextlib import closing
from itertools import islice
from typing import Any, Iterator

from ..format.errors import IndexSchemaError
from ..format.index import DatasetIndex, index_fix
from ..format.summary import describe_index, describe_samples, stream_samples
from ..storage import join, open_stream, parent, redact
from ..storage.indexes import index_url, open_index
from .set_locations import sets_named


def iter_samples(location: str | os.PathLike[str],
                 index: DatasetIndex | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(key, sample)`` in index order, packed records unpacked (for inspection), streaming
    each shard of the index at ``location`` (a path or URL, as for ``load_index``); pass the
    ``index`` already loaded from there to save reading it again. Each record is checked
    against the index (offset, checksum), as the loader checks it: a damaged one raises
    :class:`~pipeline.ShardError` rather than being shown as if it were sound."""
    url = index_url(location)
    if index is None:
        index = open_index(url).index
    base = parent(url)
    for info in index.shards:
        shard = join(base, info.url)
        with open_stream(shard, size=info.bytes) as stream:
            try:
                yield from stream_samples(stream, shard, info, index.fields or None)
            except IndexSchemaError as exc:
                raise IndexSchemaError(exc.url, exc.offset, f"{exc.reason}: {index_fix(redact(url), index.shards.names)}") from None


def describe_parts(location: str | os.PathLike[str], samples: int = 3) -> Iterator[str]:
    """:func:`describe`'s text in parts: of each set, the summary of its index, then its first
    ``samples`` samples (none when 0); of the output folder of a split build, each split's, after
    a ``== OUT/train`` line. A summary comes first, from the index alone, so that a caller can
    show it even when reading the samples fails (a shard missing or damaged)."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ValueError(f"samples is how many samples to show, a whole number >= 0, got {samples!r}")
    sets = sets_named(os.fspath(location))
    for each in sets:
        if len(sets) > 1:
            yield f"== {redact(each)}"
        url = index_url(each)
        index = open_index(url).index
        yield describe_index(index, redact(url))
        with closing(iter_samples(url, index)) as shown:  # closes the shard being read
            first = list(islice(shown, samples))
        if first:
            yield describe_samples(first)


def describe(location: str | os.PathLike[str], samples: int = 3) -> str:
    """The text ``python -m pipeline inspect`` prints: schema, counts, sizes and the first
    ``samples`` samples of the index at ``location`` (a path or URL, as for ``load_index``), or
    of each split of a build given its output folder (``OUT/train``, ``OUT/validation``)."""
    return "\n".join(describe_parts(location, samples))
