"""Join the partial indexes of a build split into parts (``--part i/N``) into one index."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..format.errors import IndexFormatError
from ..format.index import INDEX_NAME, DatasetIndex, load_index, merge_indexes, save_index

PART_GLOB = "index.part-*-of-*.json"


def find_part_indexes(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Partial index files: given directly, or every one found in the given folders."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found.extend(sorted(path.glob(PART_GLOB)))
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such partial index or folder")
    if not found:
        raise IndexFormatError(f"no partial indexes ({PART_GLOB}) in {[str(p) for p in paths]}")
    return found


def merge_index_files(paths: Sequence[str | os.PathLike[str]],
                      output: str | os.PathLike[str] | None = None,
                      overwrite: bool = False) -> tuple[DatasetIndex, Path]:
    """Merge partial indexes into ``output`` (default: ``index.json`` beside the first part).

    Shard URLs are rewritten relative to the output's folder, so parts built into different
    folders (one per machine, on a shared file system) merge into one index.
    """
    files = find_part_indexes(paths)
    out = Path(output) if output is not None else files[0].parent / INDEX_NAME
    if out.is_dir():
        out = out / INDEX_NAME
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=True (--overwrite) to replace it")
    parts = []
    for file in files:
        part = load_index(file)
        for shard in part.shards:
            shard.url = os.path.relpath(file.parent / shard.url, out.parent)
        parts.append(part)
    index = merge_indexes(parts)
    return index, save_index(index, out)
