"""A train/validation split made at build time (``--validation 0.1``).

Layouts such as NumPy arrays or the joblib batch files hold one dataset, while training wants
``OUT/train`` and ``OUT/validation``. The split is a pure function of the number of rows, the
size asked for and a seed: the same command always puts the same rows in the same split. Rows
keep their source order within a split, so that reads stay sequential.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping

import numpy as np

from ..format.index import INDEX_NAME, DatasetIndex, part_index_name
from ..format.numbers import SplitSize, WholeNumber, is_whole
from ..storage import join
from ..storage.destination import destination
from ..storage.opener import scheme
from .build_options import check_build_options
from .casting import CastSource
from .output import clear_child_sets, clear_split_parent, hold_output, prepare_output
from .resume import FinishedOtherRows, leftover_files, record_plan
from .rows import RowBlock
from .run import build_shards
from .source import Source, advise_pack, greedy_bounds

TRAIN, VALIDATION = "train", "validation"


def check_seed(seed: WholeNumber) -> None:
    """Refuse a seed that is no whole number >= 0 (also where no split uses it: a typo is told)."""
    if not is_whole(seed) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0 (it picks the validation rows), got {seed!r}")


def validation_rows(rows: int, validation: SplitSize, seed: WholeNumber) -> np.ndarray:
    """The sorted row numbers of the validation split: ``validation`` is a fraction in (0, 1)
    (a float) or a number of rows (an int), chosen at random by ``seed``."""
    check_seed(seed)
    if isinstance(validation, (bool, np.bool_)) or not isinstance(validation, (int, float, np.integer, np.floating)):
        raise ValueError(f"validation must be a fraction in (0, 1) or a number of rows, got {validation!r}")
    if isinstance(validation, (float, np.floating)):
        if not 0 < validation < 1:
            raise ValueError(f"validation must be a fraction in (0, 1) or a number of rows, got {validation}")
        count = int(round(rows * float(validation)))
    else:
        count = int(validation)
    if not 0 < count < rows:
        raise ValueError(f"a validation split of {validation} puts {count} of {rows} rows in validation; "
                         f"both splits need at least one row")
    return np.sort(np.random.default_rng(seed).choice(rows, size=count, replace=False))


class RowSubset(Source):
    """The rows of another source that ``rows`` names (sorted row numbers), or with
    ``complement`` all the others, renumbered from 0. Both splits are made from the validation
    split's rows alone, so a split of a source too large for RAM stores no list of its
    training rows; a window sent to a worker carries only the rows it covers.

    A read fetches each run of consecutive wanted rows with one read of the source, and reads
    over a short gap (up to 64 KiB of unwanted rows) rather than making another call, but never
    over a gap of per-file rows (each would be a file opened for nothing), nor more than about
    32 MB at once: memory stays bounded however sparse the subset is."""

    def __init__(self, source: Source, rows: np.ndarray, name: str, complement: bool = False) -> None:
        self.source = source
        self.rows = np.asarray(rows, dtype=np.int64)
        self.complement = complement
        self.name = name
        self.description = f"{source.description} [{name}]"
        self.fixed_shape = source.fixed_shape
        self.fields = getattr(source, "fields", ())
        self.metadata = source.metadata
        row_bytes = max(source.approx_row_bytes(), 1)
        self._gap = 0 if getattr(source, "sizes", None) is not None else (64 << 10) // row_bytes
        self._span = max((32 << 20) // row_bytes, 1)
        # position p of the complement is source row p + (number of named rows r with r - i <= p)
        self._shifted = self.rows - np.arange(len(self.rows)) if complement else None

    def __len__(self) -> int:
        return len(self.source) - len(self.rows) if self.complement else len(self.rows)

    def source_rows(self, start: int, stop: int) -> np.ndarray:
        """The source's row numbers of this subset's rows ``[start, stop)``."""
        if self._shifted is None:
            return self.rows[start:stop]
        positions = np.arange(start, stop, dtype=np.int64)
        return positions + np.searchsorted(self._shifted, positions, side="right")

    def read(self, start: int, stop: int) -> RowBlock:
        wanted = self.source_rows(start, stop)
        if not len(wanted):
            return _take(self.source.read(0, 1), [])
        blocks = []
        for piece in _pieces(wanted, self._gap, self._span):
            first = int(piece[0])
            blocks.append(_take(self.source.read(first, int(piece[-1]) + 1), (piece - first).tolist()))
        return RowBlock.concat(blocks)

    def place(self, row: int) -> tuple[str, str] | None:
        return self.source.place(int(self.source_rows(row, row + 1)[0]))

    def window(self, start: int, stop: int) -> Source:
        if stop <= start:
            return RowSubset(self.source, self.rows[:0], self.name)
        lo = int(self.source_rows(start, start + 1)[0])
        hi = int(self.source_rows(stop - 1, stop)[0]) + 1
        named = self.rows[np.searchsorted(self.rows, lo):np.searchsorted(self.rows, hi)] if self.complement \
            else self.rows[start:stop]
        return RowSubset(self.source.window(lo, hi), named - lo, self.name, self.complement)

    def shard_bounds(self, shard_samples: int | None, shard_bytes: int | None, pack: int) -> list[int]:
        sizes = getattr(self.source, "sizes", None)
        if sizes is None:
            return super().shard_bounds(shard_samples, shard_bytes, pack)
        mine = np.asarray(sizes, dtype=np.int64)[self.source_rows(0, len(self))].tolist()
        return greedy_bounds(mine, len(self.fields), shard_samples, shard_bytes, pack)

    def approx_row_bytes(self) -> int:
        return self.source.approx_row_bytes()

    def identity(self, digest: Any, start: int, stop: int) -> None:
        """Which rows of the source these are (the split), and what names them there, a run of
        consecutive ones at a time (a million rows at most at once: bounded memory)."""
        names_rows = type(self.source).identity is not Source.identity  # else only where they lie
        for first in range(start, stop, 1 << 20):
            rows = self.source_rows(first, min(first + (1 << 20), stop))
            digest.update(rows.tobytes())
            for run in np.split(rows, np.flatnonzero(np.diff(rows) != 1) + 1) if names_rows else ():
                if len(run):
                    self.source.identity(digest, int(run[0]), int(run[-1]) + 1)


def _pieces(rows: np.ndarray, gap: int, span: int) -> list[np.ndarray]:
    """``rows`` (sorted) cut where two neighbours are more than ``gap`` rows apart or a piece
    would cover more than ``span`` rows."""
    pieces = []
    cuts = (np.flatnonzero(np.diff(rows) > gap + 1) + 1).tolist()
    for run in np.split(rows, cuts):
        while len(run):
            end = int(np.searchsorted(run, run[0] + span))
            pieces.append(run[:end])
            run = run[end:]
    return pieces


def _take(block: RowBlock, positions: list[int]) -> RowBlock:
    columns: dict[str, Any] = {}
    for name, column in block.columns.items():
        columns[name] = column[positions] if isinstance(column, np.ndarray) else [column[p] for p in positions]
    keys = None if block.keys is None else [block.keys[p] for p in positions]
    return RowBlock(columns, keys)


def build_splits(source: Source, out_dir: str | os.PathLike[str], validation: SplitSize, seed: WholeNumber = 0,
                 **options: Any) -> dict[str, DatasetIndex]:
    """``source`` split into ``out_dir/train`` and ``out_dir/validation`` (shards
    ``train-000000.tar``...), ``validation`` a fraction or a number of rows chosen by ``seed``.
    ``options`` are those of :func:`~pipeline.write.run.build_shards`."""
    held_out = validation_rows(len(source), validation, seed)
    return build_split_sets({TRAIN: RowSubset(source, held_out, TRAIN, complement=True),
                             VALIDATION: RowSubset(source, held_out, VALIDATION)}, out_dir, **options)


def build_split_sets(sources: Mapping[str, Source], out_dir: str | os.PathLike[str],
                     **options: Any) -> dict[str, DatasetIndex]:
    """Each split's source as a shard set in ``out_dir/<split>/`` (shards ``<split>-000000.tar``),
    after refusing (or with ``overwrite``, removing) a shard set in ``out_dir`` itself."""
    parent = destination(out_dir)
    part = options.get("part")
    try:
        hold_output(parent, part is not None)  # (each split's folder is held by its build too)
        clear_split_parent(parent, list(sources), bool(options.get("overwrite")))
        clear_child_sets(parent, bool(options.get("overwrite")), list(sources))
        index = INDEX_NAME if part is None else part_index_name(part.index, part.count)  # (a part's own index)
        if options.get("overwrite"):
            for name, source in sources.items():  # (before the old splits go: a refusal then would lose them)
                check_build_options(join(os.fspath(out_dir), name), name, **options)
                _check_casts(source, options.get("dtypes"))
            _retire_splits(os.fspath(out_dir), list(sources), index, part is not None)
        stopped = bool(options.get("resume")) and not all(parent.exists(f"{name}/{index}") for name in sources)
        indexes = {name: _build_split(source, join(os.fspath(out_dir), name), name, stopped, options)
                   for name, source in sources.items()}
    finally:
        parent.close()
    advise_pack(options, [(sources[name], index) for name, index in indexes.items()])
    return indexes


def _check_casts(source: Source, dtypes: Mapping[str, str] | None) -> None:
    """Cast the first row as the build will: a ``--dtype`` of a field the source does not have, or
    of a type its values cannot take, is refused here, before the old splits go."""
    if dtypes and len(source):
        CastSource(source, dtypes).read(0, 1)


def _retire_splits(out_dir: str, splits: list[str], index: str, part: bool) -> None:
    """For an overwrite, before any split is written: each split's old index goes, so that a
    build that stops in one split leaves no finished set of the old build beside the new splits
    (a loader would read both, and a resume keep the old one). In a local folder a plan first
    names the old set's shards as none of the new build's: they go once the split's new index is
    written, or with the resume of a build killed before; elsewhere (no plan there) the split's
    build deletes them once its index is written (its prefix's shards it does not write)."""
    for name in splits:
        target = destination(join(out_dir, name))
        try:
            if not target.exists(index):
                continue
            hold_output(target, part)
            if scheme(out_dir) == "file":
                record_plan(target, index, leftover_files(target, index, True, ()))
            prepare_output(target, True, index)
        finally:
            target.close()


def _build_split(source: Source, out_dir: str, name: str, stopped: bool, options: dict[str, Any]) -> DatasetIndex:
    """One split of a split build. Where the build stopped in another split (``stopped``), a
    split it finished under other inputs (the one file an error asked to remove from the other
    split renumbers the rows of both) is part of the same stopped build: written again."""
    try:
        return build_shards(source, out_dir, name, **options)
    except FinishedOtherRows as exc:
        if not stopped:
            raise
        if not options.get("quiet"):
            print(f"{exc.where}: a split the stopped build finished, of other rows than this one plans (an "
                  f"input, or the seed or size of the split, changed since): writing it again", file=sys.stderr)
        return build_shards(source, out_dir, name, **{**options, "resume": False, "overwrite": True})
