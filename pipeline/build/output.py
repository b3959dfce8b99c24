"""The output of a build: refuse to clobber an index, clean up what a rebuild replaced."""

from __future__ import annotations

import re

from ..format.errors import IndexFormatError
from ..format.index import INDEX_NAME, DatasetIndex, parse_index
from ..storage.destination import Destination


class OutputExistsError(FileExistsError):
    """The output already holds an index and ``overwrite`` was not given."""


_BAD_PREFIX = re.compile(r"[/\\\x00-\x1f\x7f]")


def check_prefix(prefix: str) -> str:
    """Refuse a shard name prefix that is not a plain file name, so that no shard can land
    outside the output folder (``../x``, ``/tmp/x``) or be hidden among temporary files."""
    if not prefix or prefix.startswith(".") or _BAD_PREFIX.search(prefix) or len(prefix.encode()) > 200:
        raise ValueError(f"shard name prefix {prefix!r} is not a plain file name: it must be 1 to 200 bytes "
                         f"without '/', '\\' or control characters, and not start with '.'")
    return prefix


def shard_name(prefix: str, number: int) -> str:
    """Deterministic shard file name: ``<prefix>-000042.tar``."""
    return f"{check_prefix(prefix)}-{number:06d}.tar"


def prepare_output(destination: Destination, overwrite: bool, index_name: str = INDEX_NAME) -> list[str]:
    """Make the destination ready; refuse an existing index unless ``overwrite``.

    With ``overwrite`` the old index is removed first (so that, if this build fails, no index
    names a mix of old and new shards) and the old shard names are returned, for
    :func:`remove_stale_shards` to delete once the new index is written.
    """
    destination.prepare()
    if not destination.exists(index_name):
        return []
    if not overwrite:
        raise OutputExistsError(f"{destination.url(index_name)} already exists; "
                                f"pass overwrite=True (--overwrite) to replace it")
    try:
        old = [s.url for s in parse_index(destination.read(index_name), destination.url(index_name)).shards]
    except IndexFormatError:
        old = []
    destination.delete(index_name)
    return old


def remove_stale_shards(destination: Destination, old_shards: list[str], index: DatasetIndex) -> None:
    """Delete shards of a replaced build that the new index does not name."""
    keep = {s.url for s in index.shards}
    for name in old_shards:
        if name not in keep and "/" not in name and not name.startswith(".."):
            destination.delete(name)


def save_index(destination: Destination, index: DatasetIndex, name: str = INDEX_NAME) -> str:
    """Write the index (last, after every shard it names is published); return its URL."""
    destination.write_json(name, index.to_json())
    return destination.url(name)
