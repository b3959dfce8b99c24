"""The output folder of a build: refuse to clobber an index, clean up what a rebuild replaced."""

from __future__ import annotations

from pathlib import Path

from ..format.errors import IndexFormatError
from ..format.index import INDEX_NAME, DatasetIndex, load_index


class OutputExistsError(FileExistsError):
    """The output folder already holds an index and ``overwrite`` was not given."""


def shard_name(prefix: str, number: int) -> str:
    """Deterministic shard file name: ``<prefix>-000042.tar``."""
    return f"{prefix}-{number:06d}.tar"


def prepare_output(out_dir: Path, overwrite: bool, index_name: str = INDEX_NAME) -> list[Path]:
    """Make ``out_dir``; refuse an existing index unless ``overwrite``.

    With ``overwrite`` the old index is removed first (so that, if this build fails, no index
    names a mix of old and new shards) and the old shard paths are returned, for
    :func:`remove_stale_shards` to delete once the new index is written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    index_path = out_dir / index_name
    if not index_path.exists():
        return []
    if not overwrite:
        raise OutputExistsError(f"{index_path} already exists; pass overwrite=True (--overwrite) to replace it")
    try:
        old = [out_dir / s.url for s in load_index(index_path).shards]
    except IndexFormatError:
        old = []
    index_path.unlink()
    return old


def remove_stale_shards(out_dir: Path, old_shards: list[Path], index: DatasetIndex) -> None:
    """Delete shards of a replaced build that the new index does not name."""
    keep = {(out_dir / s.url).resolve() for s in index.shards}
    for path in old_shards:
        if path.resolve() not in keep:
            path.unlink(missing_ok=True)
