"""The output of a build: refuse to clobber an index, clean up what a rebuild replaced."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Callable, Collection, Iterable

from ..format.errors import IndexFormatError
from ..format.index import INDEX_NAME, PART_INDEX_NAME, DatasetIndex, TableFile, index_shard_names, table_name_for
from ..format.shard_table import write_table
from ..storage import SourceError, read_range
from ..storage.destination import Destination, destination


class OutputExistsError(FileExistsError):
    """The output already holds an index, or files under the shard names a build writes, and
    ``overwrite`` was not given."""


_BAD_PREFIX = re.compile(r"[/\\{}\x00-\x1f\x7f]")  # braces: the index writes names as brace ranges


def check_prefix(prefix: str) -> str:
    """Refuse a shard name prefix that is not a plain file name, so that no shard can land
    outside the output folder (``../x``, ``/tmp/x``) or be hidden among temporary files."""
    if not isinstance(prefix, str):  # a converter's option given by position lands here
        raise TypeError(f"prefix must be a str (the shards' name before -000000.tar), got {prefix!r}: give the "
                        f"options after it by name (columns=..., batch_size=...)")
    if not prefix or prefix.startswith(".") or _BAD_PREFIX.search(prefix) or len(prefix.encode()) > 200:
        raise ValueError(f"shard name prefix {prefix!r} is not a plain file name: it must be 1 to 200 bytes "
                         f"without '/', '\\', braces or control characters, and not start with '.'")
    return prefix


def shard_name(prefix: str, number: int) -> str:
    """Deterministic shard file name: ``<prefix>-000042.tar``."""
    return f"{check_prefix(prefix)}-{number:06d}.tar"


#: Any :func:`shard_name` (what a stopped build's plan may name for deletion: never an index, a
#: plan or another file a damaged or edited plan might hold).
ANY_SHARD_NAME = re.compile(r"[^/.][^/]*-\d{6}\.tar")


def _shard_names(prefix: str) -> re.Pattern[str]:
    """What every :func:`shard_name` of ``prefix`` matches."""
    return re.compile(rf"{re.escape(prefix)}-\d{{6}}\.tar")


def hold_output(target: Destination, part: bool = False) -> None:
    """Refuse to write where another build is writing now (a local folder's lock, held until the
    destination is closed; parts of one build, ``part``, write beside each other): the two would
    delete each other's files, and one's index name the other's shards."""
    if not target.hold(shared=part):
        others = "a build of the whole set" if part else "another build"
        raise OutputExistsError(f"{target} is being written by {others} now (or by a ShardWriter, or pipeline index; "
                                f"one never closed? close() it): wait for it to end, or write elsewhere")


def prepare_output(destination: Destination, overwrite: bool, index_name: str = INDEX_NAME,
                   resumable: bool = False) -> list[str]:
    """Make the destination ready; refuse an existing index unless ``overwrite`` (and say that
    ``resume`` finishes a stopped build, where the caller has one: ``resumable``).

    With ``overwrite`` the old index (and its shard table) is removed first (so that, if this build fails, no index
    names a mix of old and new shards) and the old shard names are returned, for
    :func:`remove_stale_shards` to delete once the new index is written.
    """
    destination.prepare()
    if not destination.exists(index_name):
        return []
    if not overwrite:
        resume = (", or, to finish a local build that stopped part way (one split of several, say), resume=True "
                  "(--resume) to keep what it wrote") if resumable else ""
        raise OutputExistsError(f"{destination.url(index_name)} already exists{_set_size(destination, index_name)}; "
                                f"pass overwrite=True (--overwrite) to replace it, which deletes the shards it names{resume}; "
                                f"to keep them, build into another folder and read both sets as one: "
                                f"make_loader({{'old': '{destination}', 'new': 'OTHER_FOLDER'}}) (README: Mixing "
                                f"shard sets)")
    return _remove_index(destination, index_name)


def _set_size(destination: Destination, name: str) -> str:
    """How many shards and samples the index ``name`` names, in words ("" where it cannot be
    read): what replacing it deletes."""
    try:
        data = destination.read(name)
        samples, shards = int(json.loads(data)["samples"]), index_shard_names(data, destination.url(name))
    except (IndexFormatError, OSError, ValueError, KeyError, TypeError):  # (unreadable, or of another version)
        return ""
    first = f": {shards[0]}, ..." if len(shards) else ""
    return f", the index of a set of {_shards(len(shards))} ({samples:,} samples{first})"


def indexed_shards(destination: Destination, name: str) -> list[str]:
    """The shards the index ``name`` names (none where there is none, where it is gone meanwhile,
    taken away by another part of a build started at once, or where it cannot be read)."""
    try:
        return list(index_shard_names(destination.read(name), destination.url(name)))
    except (IndexFormatError, FileNotFoundError, SourceError):
        return []


def _remove_index(destination: Destination, name: str) -> list[str]:
    """Delete the index ``name`` and its shard table (else a failed build would leave the table);
    return the shards it named."""
    named = indexed_shards(destination, name)
    destination.delete(name)
    destination.delete(table_name_for(name))
    return named


def clear_other_indexes(destination: Destination, index_name: str, overwrite: bool,
                        resuming: bool = False) -> list[str]:
    """Refuse, unless ``overwrite`` (then delete them), the indexes of another build of the set in
    ``destination`` than this one (``index_name``): for a part's build (``--part i/N``) a
    complete ``index.json`` and the parts of a build cut into another number of parts; for a
    complete build every part's. They name the shards the builds share the names of: left, a
    loader would read an old index against new bytes, and ``merge-index`` join stale parts.
    Returns the shards the deleted indexes named, for :func:`remove_stale_shards`."""
    parts = part_index_names(destination)
    ours = PART_INDEX_NAME.match(index_name)
    if ours is None:
        others = parts
    else:
        complete = [INDEX_NAME] if destination.exists(INDEX_NAME) else []
        others = complete + [name for name in parts if PART_INDEX_NAME.match(name)["count"] != ours["count"]]
    if others and not overwrite:
        what = "a complete one" if others[0] == INDEX_NAME else "one cut into parts"
        how = "overwrite=True (--overwrite) in place of resume=True (--resume)" if resuming else \
            "overwrite=True (--overwrite)"
        raise OutputExistsError(f"{destination.url(others[0])} already exists: the index of another build of the "
                                f"set in this folder ({what}), which this build replaces; pass {how} to replace "
                                f"it, or write elsewhere")
    return [shard for name in others for shard in _remove_index(destination, name)]


def remove_unplanned_shards(destination: Destination, prefix: str, planned: Iterable[str]) -> list[str]:
    """Delete the ``<prefix>-NNNNNN.tar`` files a resumed or overwriting build does not name: a killed run's under
    other options (more shards, smaller) that a later ``pipeline index`` of the folder would
    otherwise take for data. Returns their names."""
    pattern = _shard_names(prefix)
    keep = set(planned)
    stale = [name for name in destination.list(f"{prefix}-")
             if pattern.fullmatch(name) and name not in keep and _written_here(destination, name)]
    for name in stale:
        destination.delete(name)
    _remove_temporary(destination, lambda name: pattern.fullmatch(name) is not None and name not in keep)
    return stale


def _written_here(destination: Destination, name: str) -> bool:
    """Whether the shard ``name`` (a local file or an S3 object) is this library's (its first
    member a ``.msgpack`` record), not another tool's under a name of the same form, which is not
    ours to delete."""
    try:
        head = read_range(destination.url(name), 0, 100)
    except OSError:  # (a SourceError too: gone meanwhile, or shorter than a tar header)
        return False
    return head.split(b"\0", 1)[0].endswith(b".msgpack")


def foreign_shards(destination: Destination, names: Iterable[str]) -> list[str]:
    """Those of the files ``names`` (local) that hold something, but not this library's records:
    another tool's shards of the same names, which a resume must not take for a stopped build's."""
    return [name for name in names if (path := destination.staging / name).is_file() and path.stat().st_size
            and not _written_here(destination, name)]


def refuse_foreign_shards(destination: Destination, names: Iterable[str]) -> None:
    """Raise, for a resume, where files under the shard names it writes are not this library's:
    resuming would replace them, and only ``overwrite`` may."""
    foreign = foreign_shards(destination, names)
    if foreign:
        raise OutputExistsError(f"{destination.url(foreign[0])} is no shard of this library's ({len(foreign)} file(s) "
                                f"under the shard names this build writes hold no .msgpack records: another tool's?): "
                                f"a resume keeps or replaces a stopped build's own shards only; overwrite=True "
                                f"(--overwrite) replaces them; or write to another folder, or another prefix")


def part_index_names(place: Destination) -> list[str]:
    """The partial indexes in ``place``: those of a build in parts (see ``part_index_name``)."""
    return sorted(name for name in place.list("index.part-") if PART_INDEX_NAME.match(name))


def clear_split_parent(destination: Destination, splits: Iterable[str], overwrite: bool) -> None:
    """Refuse, unless ``overwrite`` (then delete it), a shard set whose index is in the folder that
    a split build writes its splits under: a loader given that folder would go on reading the
    old set beside the new splits."""
    if not destination.exists(INDEX_NAME):
        return
    where = ", ".join(destination.url(split) for split in splits)
    if not overwrite:
        raise OutputExistsError(f"{destination.url(INDEX_NAME)} already exists: that folder is a shard set, and the "
                                f"splits would go beside it ({where}) while a loader given the folder reads the old "
                                f"set; pass overwrite=True (--overwrite) to replace it, or write the splits elsewhere")
    _remove_set(destination)


def clear_child_sets(target: Destination, overwrite: bool, splits: Collection[str] = ()) -> None:
    """Refuse, unless ``overwrite`` (then delete them), the shard sets in subfolders of the
    folder a set is built in: an earlier split build's ``train/`` and ``validation/``, which would
    stay beside the new set for a script that reads the splits to train on (in local folders:
    see :meth:`Destination.subfolders`); for a split build, those of other names than its
    ``splits`` (a partition's ``val`` and ``test`` beside the new one's ``validation``). A split
    is a set whose shards are named after its folder, as a split build names them; other sets in
    subfolders are the user's to keep."""
    children = [name for name in target.subfolders() if name not in splits and _is_split(target, name)]
    if not children:
        return
    new = f"splits ({', '.join(splits)})" if splits else "set"
    if not overwrite:
        raise OutputExistsError(f"{target.url(children[0] + '/' + INDEX_NAME)} already exists: that folder holds the "
                                f"splits of an earlier build ({', '.join(children)}), which would stay beside the new "
                                f"{new} (a script that reads the splits would train or evaluate on them); pass "
                                f"overwrite=True (--overwrite) to remove them, or write the {new} elsewhere")
    for name in children:
        child = destination(target.url(name))
        try:
            _remove_set(child)
            with contextlib.suppress(OSError):  # a folder left empty goes too; one holding other files stays
                child.folder.rmdir()
        finally:
            child.close()


def _is_split(target: Destination, name: str) -> bool:
    index = f"{name}/{INDEX_NAME}"
    if not target.exists(index):
        return False
    try:
        shards = index_shard_names(target.read(index), target.url(index))
    except IndexFormatError:  # not ours to judge, nor to delete
        return False
    pattern = _shard_names(name)
    return all(pattern.fullmatch(shard) for shard in shards)


def _remove_set(target: Destination) -> None:
    """Delete the shard set in ``target``: its index, its shard table and the shards it names."""
    remove_stale_shards(target, prepare_output(target, overwrite=True), written=())


def remove_stale_shards(destination: Destination, old_shards: list[str], written: Iterable[str]) -> list[str]:
    """Delete shards of a replaced build that the new one did not write (``written``); return
    those that were there, for the build's summary to say."""
    keep = set(written)
    return [name for name in old_shards if name not in keep and in_folder(name) and destination.delete(name)]


def deleted_note(deleted: list[str]) -> str:
    """What a build's summary says of the shards of an earlier build (one it replaced, or a
    stopped run's) that it deleted."""
    return f"; deleted {_shards(len(deleted))} of an earlier build ({deleted[0]}, ...)" if deleted else ""


def _shards(count: int) -> str:
    return f"{count} shard{'' if count == 1 else 's'}"


def in_folder(name: str) -> bool:
    """Whether the shard an index names ``name`` lies in the index's folder (an index written
    with ``--output`` names shards elsewhere: not a build's to delete)."""
    return "/" not in name and not name.startswith("..")


def clear_planned_shards(destination: Destination, prefix: str, planned: Iterable[str] | None, overwrite: bool,
                         resumable: bool = False) -> None:
    """Refuse, unless ``overwrite``, the files already under the shard names a build is about to
    write from scratch (``planned``; ``None``: any ``<prefix>-NNNNNN.tar``, for a writer that does
    not know how many it will write, and has no resume). No index names them: they may be another
    tool's shards of the same names (``shard-000000.tar`` is webdataset's naming too), or a killed
    build's, which are deleted (with ``overwrite``) so as not to pass, to a later ``resume``, for
    shards of this one."""
    pattern = _shard_names(prefix)
    wanted = None if planned is None else set(planned)
    found = [name for name in destination.list(f"{prefix}-")
             if (pattern.fullmatch(name) if wanted is None else name in wanted)]
    if found and not overwrite:
        ours = resumable and not foreign_shards(destination, found)
        resume = "a build that stopped part way? resume=True (--resume) finishes it; " if ours else ""
        raise OutputExistsError(f"{destination.url(found[0])} already exists ({len(found)} file(s) under the shard "
                                f"names this build writes), and no index names it: {resume}overwrite=True "
                                f"(--overwrite) replaces them; or write to another folder, or another prefix")
    for name in found if wanted is not None else ():
        destination.delete(name)


_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-\d+$")


def remove_temporary_files(destination: Destination, shards: Iterable[str], index_name: str = INDEX_NAME) -> None:
    """Delete the temporary files (``.<name>.tmp-<pid>``) that writers killed mid-file left for
    the given shards and for the index (and the files saved beside it): a killed build's, or a
    task's that a cluster ran again after its worker died. Call it once the index is saved."""
    names = set(shards)
    index_files = Path(index_name).stem + "."
    _remove_temporary(destination, lambda name: name in names or name.startswith(index_files))


def _remove_temporary(destination: Destination, of: Callable[[str], bool]) -> None:
    """Delete the writers' temporary files (``.<name>.tmp-<pid>``) whose ``<name>`` passes ``of``."""
    with os.scandir(destination.staging) as entries:
        for entry in entries:
            match = _TEMPORARY.match(entry.name) if entry.name.startswith(".") else None
            if match and of(match["name"]):
                Path(entry.path).unlink(missing_ok=True)


def save_index(destination: Destination, index: DatasetIndex, name: str = INDEX_NAME) -> str:
    """Write the shard table, then the index (last, after every shard it names is published);
    return the index's URL."""
    table_name = table_name_for(name)
    size, sha256 = destination.write_file(table_name, lambda out: write_table(out, index.shards))
    try:
        destination.write_json(name, index.to_json(TableFile(table_name, size, sha256)))
    except BaseException:  # (a full disk): no table is left without its index, nor taken from one in place
        with contextlib.suppress(Exception):  # (a failure after the rename: of the folder's fsync, say)
            if not destination.exists(name):
                destination.delete(table_name)
        raise
    return destination.url(name)
