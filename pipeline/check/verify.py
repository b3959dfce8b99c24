"""``verify``: every shard of a set, local or remote, against its index.

Each shard is streamed once (never whole in memory) through
:func:`~pipeline.format.verify.verify_stream`, which checks its size, sha256, record count,
offsets, checksums and decoding; the shard table is checked against its own sha256 first. A
shard that cannot be read (missing on the server, say) is a problem of that shard, not the end
of the check.

Files are named as the user can open them: a local one by its path from the current folder (the
index's folder as given, joined with the name the index holds, ``../b/x.tar`` resolved), a
remote one by its URL. A shard table whose sha256 differs is damaged: everything a shard is
checked against comes from it, so a shard that disagrees with it is reported as doubtful, not
as damaged (it may well be intact; re-indexing the shards settles it). One that cannot be read
whole is an end of the check: no shard is checked against a table nobody has checked.

``index.json``'s own fields are checked against its table when it is opened (its totals, shard
count, and a pack that gives another number of records: an index that fails is refused, as the
loader refuses it). A pack that gives as many records as the table holds is seen only in the
records' rows: intact shards whose records follow another pack are reported once per pack, as a
problem of ``index.json``, not of the shards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import partial
from typing import BinaryIO, Callable, Iterator

from ..format.index import DatasetIndex, index_fix
from ..format.verify import IndexProblem, PackProblem, Problem, ValueProblem, verify_stream, verify_table_stream
from ..storage import SourceError, is_remote, join, open_stream, redact
from ..storage.indexes import index_url, open_index, strays
from .images import image_check
from .set_locations import sets_named

#: The word ``pipeline verify`` prints before each file: sound, failed, or in doubt (it disagrees
#: with a damaged shard table); and before a ``.tar`` beside the shards that the index does not name.
OK, FAILED, DOUBTFUL, NOTE = "ok", "FAIL", "?", "note"

#: ``on_file(status, shown, problem)``: told of each shard once checked, and first of the shard
#: table when it is damaged.
FileReport = Callable[[str, str, Problem | None], None]


def _shown(url: str) -> str:
    """A file as the user can open it: its redacted URL, or its local path, normalised."""
    return redact(url) if is_remote(url) else os.path.normpath(url)


def _check_file(url: str, check: Callable[[BinaryIO, str], Problem | None],
                size: int | None = None) -> tuple[Problem | None, bool]:
    """``check(stream, shown)`` of the file at ``url`` (of ``size`` bytes, the index says), and
    whether the file could be read: one that cannot be is a problem of that file, whatever the
    index says of it."""
    shown = _shown(url)
    try:
        with open_stream(url, size=size) as stream:
            return check(stream, shown), True
    except SourceError as exc:
        reason = exc.reason or str(exc)
        if not exc.offset:
            return Problem(shown, f"missing file or unreadable: {reason}"), False
        return Problem(shown, f"read failed: {reason}", offset=exc.offset), False


def _index_problem(index: DatasetIndex, shown: str, found: IndexProblem) -> Problem:
    """The problem of the index file ``shown``, which misdescribes the intact shard ``found``
    names: its pack, or its schema."""
    if isinstance(found, PackProblem):
        wrong = (f"says pack={index.pack}, but the records of {found.shard} hold {found.pack} rows each "
                 f"(pack={found.pack})")
    else:
        wrong = f"its schema does not describe the records of {found.shard} ({found.reason})"
    return Problem(shown, f"{wrong}, which the loader refuses: {index_fix(shown, index.shards.names)}")


@dataclass
class Outcome:
    """What checking a set found: the problems (the table's first), the number of shards
    checked, of those that failed, and of those in doubt (they disagree with a damaged table);
    ``index_wrong``: ``index.json`` misdescribes intact shards (its pack or schema is not theirs)."""

    location: str
    problems: list[Problem] = field(default_factory=list)
    shards: int = 0
    failed: int = 0
    as_built: int = 0  # of the failed: intact shards whose images do not decode (they were so when built)
    doubtful: int = 0
    table_damaged: bool = False
    table_unread: bool = False
    index_wrong: bool = False

    def __str__(self) -> str:
        """The result line ``pipeline verify`` ends with."""
        if not self.problems:
            return f"verified {self.location}: every shard matches its index"
        if self.table_unread:
            return (f"not verified {self.location}: its shard table cannot be read, so none of its {self.shards} "
                    f"shards was checked")
        if self.table_damaged:
            return (f"not verified {self.location}: its shard table is damaged ({self.doubtful} of {self.shards} "
                    f"shards disagree with it, {self.failed} failed)")
        if self.index_wrong:
            failed = f", and {self.failed} of {self.shards} shards failed" if self.failed else ""
            return f"not verified {self.location}: its index.json disagrees with its shards{failed}"
        failed = f"not verified {self.location}: {self.failed} of {self.shards} shards failed"
        copy = "copy them again from where they came from, or build the set again (--overwrite)"
        if not self.as_built:
            return f"{failed}: {copy}"
        damaged = self.failed - self.as_built
        return (f"{failed}: {self.as_built} hold images that do not decode, as they were when built (the shards are "
                f"intact): replace those images and build again (shards indexed in place: write them again, then "
                f"pipeline index), or train past them with on_error='skip'"
                + (f"; the other {damaged} are damaged: {copy}" if damaged else ""))


def check_set(location: str | os.PathLike[str], on_file: FileReport | None = None, images: bool = False) -> Outcome:
    """Check every shard named by the index at ``location`` (as for :func:`verify`), telling
    ``on_file`` of each file once checked; the :class:`Outcome` counts what was found."""
    found = open_index(location)
    record_check = image_check() if images else None
    index, base = found.index, found.base
    outcome = Outcome(redact(os.fspath(location)))
    index_file = index_url(location)
    told: set[object] = set()  # what index.json was blamed for (see IndexProblem.told)

    def report(status: str, url: str, problem: Problem | None) -> None:
        if problem is not None:
            outcome.problems.append(problem)
        if on_file is not None:
            on_file(status, _shown(url), problem)

    if index.table is not None:
        url = join(base, index.table.name)
        problem, read = _check_file(url, partial(verify_table_stream, table=index.table))
        if problem is not None:
            if read:  # read whole, and not what index.json says: damaged
                outcome.table_damaged = True
                problem = replace(problem, reason=f"{problem.reason}: the shard table is damaged, so the shards "
                                                  f"cannot be checked against it; {found.table_fix()}")
            report(FAILED, url, problem)
            if not read:  # what the shards would be checked against is unknown
                outcome.table_unread = True
                outcome.shards = len(index.shards)
                return outcome
    for info in index.shards:
        outcome.shards += 1
        try:
            url = join(base, info.url)  # refuses a name that is a pipe: command: it must never run
        except SourceError as exc:  # a name that is no file: that shard fails, the others are checked
            outcome.failed += 1
            report(FAILED, info.url, Problem(info.url, f"not a file's name: {exc.reason or exc}"))
            continue
        problem, read = _check_file(url, partial(verify_stream, info=info, index=index, check=record_check),
                                    info.bytes)
        if problem is None:
            report(OK, url, None)
        elif outcome.table_damaged and read:  # what it was checked against is what is damaged
            outcome.doubtful += 1
            report(DOUBTFUL, url, replace(problem, reason=f"disagrees with the damaged shard table: {problem.reason}"))
        elif isinstance(problem, IndexProblem):  # an intact shard: index.json is what is wrong
            outcome.index_wrong = True
            if problem.told not in told:
                told.add(problem.told)
                report(FAILED, index_file, _index_problem(index, _shown(index_file), problem))
            report(OK, url, None)
        else:
            outcome.failed += 1
            outcome.as_built += isinstance(problem, ValueProblem)
            report(FAILED, url, problem)
    for name in strays(base, index):
        if on_file is not None:
            on_file(NOTE, f"{_shown(join(base, name))}: beside the shards, not in the index (pipeline index would take "
                          f"it for one of them)", None)
    return outcome


def check_sets(location: str | os.PathLike[str], on_file: FileReport | None = None, images: bool = False,
               on_set: Callable[[str], None] | None = None) -> Iterator[Outcome]:
    """:func:`check_set` of each set ``location`` names, one by one: itself, or each split of a
    build given its output folder (see :func:`~.set_locations.sets_named`), ``on_set`` told of
    each split (as shown: a URL redacted) as its check begins."""
    sets = sets_named(os.fspath(location))
    for each in sets:
        if on_set is not None and len(sets) > 1:
            on_set(redact(each))
        yield check_set(each, on_file, images)


def verify(location: str | os.PathLike[str], on_file: FileReport | None = None, images: bool = False) -> list[Problem]:
    """The problems of the shards named by the index at ``location`` (an index file, its
    folder, or a URL of either: ``https://...``, ``s3://bucket/prefix``), and of its shard table;
    ``[]`` when every one matches. The output folder of a split build (``OUT/train``,
    ``OUT/validation``) has each split checked in turn: the problems of them all, each naming its
    file. ``on_file(status, shown, problem)`` is told of each file once checked. ``images``: also
    decode every image (see :mod:`.images`). An index that cannot be opened (a split's too, once
    the splits before it are checked) raises :class:`~pipeline.IndexFormatError` (there is nothing
    to check the shards against)."""
    if not isinstance(images, bool):
        raise TypeError(f"images is True (decode every image too) or False, got {images!r}")
    return [problem for outcome in check_sets(location, on_file, images) for problem in outcome.problems]
