"""Join the partial indexes of a build split into parts (``--part i/N``) into one index."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Sequence

from ..caller_warning import warn_caller
from ..format.errors import IndexFormatError
from ..format.index import INDEX_NAME, PART_INDEX_NAME, DatasetIndex, merge_indexes, table_name_for
from ..storage import join, scheme
from ..storage.destination import Destination, destination
from ..storage.indexes import open_index
from .indexing import relative_name
from .output import OutputExistsError, part_index_names, save_index


def find_part_indexes(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[Destination, str]]:
    """Partial indexes: files given directly, or every one in the given folders or S3 prefixes."""
    found: list[tuple[Destination, str]] = []
    for location in map(os.fspath, paths):
        if location.endswith(".json"):
            folder, _, name = location.rpartition("/")
            found.append((destination(folder or "."), name))
            continue
        place = destination(location)
        if scheme(location) == "file" and not place.folder.is_dir():
            raise FileNotFoundError(f"{location}: no such partial index or folder")
        found.extend((place, name) for name in part_index_names(place))
    if not found:
        places = ", ".join(map(os.fspath, paths))
        raise IndexFormatError(f"no partial indexes (index.part-*-of-*.json) in {places}{_merged_hint(paths)}"
                               f"{_splits_hint(paths)}")
    return found


def _merged_hint(paths: Sequence[str | os.PathLike[str]]) -> str:
    """Why a folder merged before holds no partial indexes now: merging removed them."""
    merged = [Path(location) / INDEX_NAME for location in map(os.fspath, paths)
              if scheme(location) == "file" and (Path(location) / INDEX_NAME).is_file()]
    return f"; {merged[0]} is there: merge-index removes the partial indexes it joins" if merged else ""


def _splits_hint(paths: Sequence[str | os.PathLike[str]]) -> str:
    """Where the partial indexes of a split build in parts are (one set of them per split)."""
    splits = sorted(str(folder) for location in paths if Path(location).is_dir()
                    for folder in Path(location).iterdir()
                    if folder.is_dir() and any(PART_INDEX_NAME.match(p.name) for p in folder.iterdir()))
    if not splits:
        return ""
    return f"; the splits' are in {', '.join(splits)}: merge each (pipeline merge-index {shlex.quote(splits[0])})"


def _refuse_other_builds(parts: dict[str, DatasetIndex]) -> None:
    """Refuse, naming their files, partial indexes that are not the parts of one build: one
    part found twice (each split's folder of a split build given at once, a part built again
    into another folder) or parts of builds cut into different numbers of parts."""
    seen: dict[int, str] = {}
    first_url, counts = next(iter(parts)), None
    for url, part in parts.items():
        if part.part is None:
            raise IndexFormatError(f"{url} is a complete index, not a partial one (it has no 'part')")
        index, count = part.part.index, part.part.count
        if counts is not None and count != counts:
            raise IndexFormatError(f"{url} is part {index} of {count}, {first_url} a part of {counts}: "
                                   f"give the parts of one build")
        if index in seen:
            raise IndexFormatError(f"{seen[index]} and {url} are both part {index} of {count}: give each part "
                                   f"once, and each split's folder (train, validation) to a merge of its own")
        seen[index], counts = url, count


def merge_index_files(paths: Sequence[str | os.PathLike[str]],
                      output: str | os.PathLike[str] | None = None,
                      overwrite: bool = False) -> tuple[DatasetIndex, str]:
    """Merge partial indexes into ``output`` (default: ``index.json`` beside the first part), a
    local path or an S3 URL. Shard URLs are rewritten relative to the output's folder, so parts
    built in different folders (one per machine) merge into one index."""
    parts_found = find_part_indexes(paths)
    if output is None:
        target, name = parts_found[0][0], INDEX_NAME
    else:
        text = os.fspath(output)
        folder, name = (text.rpartition("/")[0] or ".", text.rpartition("/")[2]) if text.endswith(".json") \
            else (text, INDEX_NAME)
        target = destination(folder)
    if PART_INDEX_NAME.match(name):  # (the parts merged are removed after: this one would go with them)
        raise ValueError(f"{name}: the merged index cannot be named as a partial one; name it index.json, or "
                         f"another name")
    if target.exists(name) and not overwrite:
        raise OutputExistsError(f"{target.url(name)} already exists; pass overwrite=True (--overwrite) to replace it")
    out_folder = str(target).rstrip("/")
    held = _hold_part_folders(parts_found)
    try:
        parts: dict[str, DatasetIndex] = {}
        merged = {place.url(part_name): _part_bytes(place, part_name) for place, part_name in parts_found}
        for place, part_name in parts_found:
            part = open_index(place.url(part_name)).index
            part.shards = part.shards.renamed(
                lambda folder, place=place: relative_name(join(str(place), folder), out_folder))
            parts[place.url(part_name)] = part
        _refuse_other_builds(parts)
        index = merge_indexes(parts.values())
        target.prepare()
        saved = save_index(target, index, name)
        _retire_parts(parts_found, merged)
        return index, saved
    finally:
        target.close()  # an S3 prefix's staging folder: the table passed through it
        for place in held:
            place.close()


def _hold_part_folders(parts: list[tuple[Destination, str]]) -> list[Destination]:
    """Lock each local folder of ``parts`` against builds until the merge ends: a part being built
    again could save its index after the merge read its old one, and the merge would then join the
    old one and remove the new one with those it joined. Returns the folders held."""
    held: dict[str, Destination] = {}
    for place, _ in parts:
        key = os.path.realpath(place.folder) if scheme(str(place)) == "file" else str(place)
        if key in held:
            continue
        if not place.hold():
            for other in held.values():
                other.close()
            raise OutputExistsError(f"{place} is being written by a build now (a part still running?): merge its "
                                    f"parts once they have all ended")
        held[key] = place
    return list(held.values())


def _part_bytes(place: Destination, name: str) -> tuple[bytes, bytes]:
    """A partial index as the merge read it: its file's and its shard table's bytes (a part built
    again writes its table first, its index last; an index of an older version has no table)."""
    try:
        table = place.read(table_name_for(name))
    except OSError:
        table = b""
    return place.read(name), table


def _retire_parts(parts: list[tuple[Destination, str]], merged: dict[str, tuple[bytes, bytes]]) -> None:
    """Delete the partial indexes (and their shard tables) merged into the index just saved, which
    holds all they held: left, a later build in parts whose part did not run (a failed job) would
    be merged with this build's part, of older data, where the part must be reported missing. A
    part that is no longer the one merged (built again meanwhile, where its folder's lock is not
    seen: NFS, S3) is left, and so is one that cannot be deleted (a folder read-only to you): the
    merge is done, and a warning says so."""
    for url, (place, name) in {place.url(name): (place, name) for place, name in parts}.items():  # (each once)
        try:
            if _part_bytes(place, name) != merged[url]:
                warn_caller(f"{url} changed during the merge (a part built again?): it is left, and the merged "
                            f"index holds the part as it was; merge again with --overwrite once every part has ended")
                continue
            place.delete(name)
            place.delete(table_name_for(name))
        except OSError as exc:
            warn_caller(f"the merged index is saved, but the partial index {url} it joined could not be removed "
                        f"({exc}): remove it, or a later merge there may take it for a part of that build")
