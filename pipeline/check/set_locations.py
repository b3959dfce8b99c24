"""Which shard sets ``inspect`` and ``verify`` check for a location: the set itself, or each
split of a build given its output folder (``OUT/train``, ``OUT/validation``), locally or
under a URL."""

from __future__ import annotations

import os
from dataclasses import replace
from urllib.parse import urlsplit

from ..format.index import INDEX_NAME
from ..storage import is_remote, join
from ..storage.indexes import nothing_there
from ..storage.location_hints import SPLIT_NAMES, remote_splits, shard_sets_in
from ..storage.retry import RetryPolicy


def sets_named(location: str) -> list[str]:
    """The shard sets ``location`` names: itself, or, for a local folder without an index that
    holds the splits of a build (OUT/train, OUT/validation), each of them, a split's folder whose
    index is missing among them (so that it is reported, not passed over); other sets side by
    side are no splits of one build, and are left to the error that names them. A URL's splits
    are found as :func:`~pipeline.storage.location_hints.remote_splits` finds them."""
    if is_remote(location):
        return _remote_sets(location)
    if not os.path.isdir(location) or os.path.isfile(os.path.join(location, INDEX_NAME)):
        return [location]
    splits = {entry.name for entry in os.scandir(location) if entry.is_dir() and entry.name in SPLIT_NAMES}
    sets = set(shard_sets_in(location))
    if not splits & sets:
        return [location]
    return [os.path.join(location, name) for name in sorted(splits | sets)]


def _remote_sets(location: str) -> list[str]:
    """:func:`sets_named` of a URL: the splits of a build under it when it is a folder (an S3
    prefix, an HTTP folder) with no index of its own; else itself, whose error is then told."""
    if location.endswith(".json") or urlsplit(location).query or \
            not nothing_there(join(location, INDEX_NAME), replace(RetryPolicy.from_env(), attempts=1)):
        return [location]
    return [join(location, name) for name in remote_splits(location)] or [location]
