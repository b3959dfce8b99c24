"""Shards without an index, streamed: whole shards dealt to the (rank, worker) consumers.

Without an index there are no sample counts, so the epoch cannot be cut into equal spans:
each consumer streams every ``consumers``-th shard of the epoch's shard order, start to end,
and shuffles what it reads a window at a time. Consumers may so get different numbers of
samples, which is why a dataset refuses this under DDP unless told it may (``allow_uneven``).
A record that fails its own checks costs that record (under ``on_error="skip"``); a broken tar
structure costs the rest of its shard, since nothing after it can be found.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from ..caller_warning import warn_caller
from ..format.errors import ShardError
from ..storage import SourceError
from ..storage.errors import CutShort, ServerSetupError
from ..storage.retry import RetryPolicy
from .material import Draw, rng_for
from .options import SKIP_HINT
from .reader import Columns, concat_columns, iter_foreign_rows, stack_values
from .shared_memory import SharedNumber
from .skip_log import log_skip
from .stats import Count, ReadStats

_COUNT_EVERY = 64  # records read between two additions to the profile
log = logging.getLogger("pipeline.stream")


def reference_fields(urls: tuple[str, ...], wanted: set[str] | None, fill: Mapping[str, Any], skip: bool,
                     policy: RetryPolicy, stats: ReadStats) -> set[str] | None:
    """The fields every epoch reads shards without an index with: those of the first record of the
    first shard, in the order given, that holds one (the first record each consumer read, in a
    shuffled order, gave other fields from one epoch to another), or ``wanted``, which that
    record must hold unless ``fill`` has a value (a misspelt name is an error now, not in some
    later epoch). Under ``skip``, a shard that cannot be read is passed over, as streaming would
    pass it over. ``None`` when no shard holds a record."""
    for url in urls:
        try:
            for columns in iter_foreign_rows(url, wanted, None, policy=policy, stats=stats, fill=fill,
                                             on_lost=(lambda exc, samples: None) if skip else None):
                return set(columns)  # the stream closes here: one record read
        except (ShardError, SourceError):
            if not skip:
                raise
    return None


def warn_of_idle_consumers(shards: int, consumers: int) -> None:
    """Warn, from the user's line, that ``shards`` without an index are fewer than their
    ``consumers`` (ranks x workers), some of which so read nothing."""
    if shards < consumers:
        warn_caller(f"{shards} shards without an index for {consumers} consumers (ranks x workers): some read "
                    f"nothing; index them with `pipeline index` for exact epochs")


@dataclass
class ForeignStream:
    """How one dataset streams its shards without an index (picklable, for workers)."""

    urls: tuple[str, ...]
    seed: int
    shuffle: bool
    window: int  # samples shuffled at once
    wanted: set[str] | None
    fill: Mapping[str, Any]
    skip: bool  # on_error="skip"
    policy: RetryPolicy
    stats: ReadStats
    fields: set[str] | None = None  # those every record is read with (see reference_fields)
    unread_told: SharedNumber | None = None  # 1 once fields not read were warned of (see iter_foreign_rows)

    def windows(self, epoch: int, consumer: int, consumers: int) -> Iterator[tuple[Columns, np.ndarray]]:
        """The windows of consumer ``consumer`` of ``consumers`` in ``epoch``: columns, and the
        order to emit their rows in."""
        urls = list(self.urls)
        if self.shuffle:
            urls = [urls[i] for i in rng_for(Draw.SHARDS, self.seed, epoch).permutation(len(urls))]
        pending: list[Columns] = []
        rows = window = 0
        fields = self.fields  # or, when unknown, those of this consumer's first record
        for url in urls[consumer::consumers]:
            for columns in self._rows(url, fields):
                fields = set(columns) if fields is None else fields
                pending.append(columns)
                rows += len(next(iter(columns.values())))
                if rows >= self.window:
                    yield self._window(pending, rows, epoch, consumer, window)
                    pending, rows, window = [], 0, window + 1
        if rows:
            yield self._window(pending, rows, epoch, consumer, window)

    def _rows(self, url: str, fields: set[str] | None) -> Iterator[Columns]:
        """The rows of one shard; under the skip policy, a bad record is left out and a broken
        shard ends there: logged, counted."""
        def lost(exc: ShardError, samples: int) -> None:
            log_skip(log, url, "a record", exc)
            self.stats.skipped(0)  # without an index, what it held is not known

        waited = busy = 0.0  # seconds waiting for the shard's bytes, and reading its records in all, not counted yet
        records = 0

        def wait(seconds: float) -> None:
            nonlocal waited
            waited += seconds

        def count() -> None:  # a record is too small to count one by one
            nonlocal waited, busy
            self.stats.spent_reading(waited, busy)
            waited = busy = 0.0

        rows = iter_foreign_rows(url, self.wanted, fields, policy=self.policy, stats=self.stats, fill=self.fill,
                                 on_lost=lost if self.skip else None, on_wait=wait, told=self.unread_told)
        try:
            while True:
                started = time.perf_counter()
                try:
                    columns = next(rows, None)
                finally:
                    busy += time.perf_counter() - started
                if columns is None:
                    return
                records += 1
                if records % _COUNT_EVERY == 0:
                    count()
                yield columns
        except ServerSetupError as exc:  # raised even under skip: each cut would lose the rest of its shard
            raise ServerSetupError(url, exc.offset, "the server does not honour Range requests, which resume a "
                                   "shard after a cut: serve the shards from one that does (nginx, S3 and most static "
                                   "hosts do), or copy them to local disk (shards without an index are not cached)"
                                   ) from None
        except (ShardError, SourceError) as exc:
            if not self.skip:
                raise _advised(exc) from None
            log_skip(log, url, "the rest", exc)
            self.stats.skipped(0)
        finally:
            rows.close()  # an epoch left early closes the shard's connection now
            count()

    def _window(self, parts: list[Columns], rows: int, epoch: int, consumer: int,
                window: int) -> tuple[Columns, np.ndarray]:
        with self.stats.timing(Count.GATHER):
            columns = {name: stack_values(col, one_type=False) if isinstance(col, list) else col
                       for name, col in concat_columns(parts).items()}
        return columns, window_permutation(self.seed, epoch, consumer, window, rows, self.shuffle)


def _advised(exc: ShardError | SourceError) -> ShardError | SourceError:
    """``exc``, a shard's failure to pass its checks (a broken tar header, a record that does not
    decode, a shard cut short), with what to do about it; others (a missing shard, the network's
    failure) as they are."""
    if not isinstance(exc, (ShardError, CutShort)) or exc.reason is None:
        return exc
    return type(exc)(exc.url, exc.offset, f"{exc.reason}: copy the shard again from where it came from, or "
                                          f"{SKIP_HINT} to train past damaged records (stats() counts them)")


def window_permutation(seed: int, epoch: int, span_start: int, window: int, size: int,
                       shuffle: bool) -> np.ndarray:
    """Emission order of one window of a stream without an index: drawn from its position."""
    if not shuffle:
        return np.arange(size)
    return rng_for(Draw.WINDOW, seed, epoch, span_start, window).permutation(size)


def stream_places(units: Iterator[Columns], consumer: int) -> Iterator[tuple[Columns, np.ndarray]]:
    """Each unit of consumer ``consumer``'s stream with its rows' places: their numbers in that
    stream, above the consumer's number (the same rows, the same places, for the same number
    of workers)."""
    done = 0
    for unit in units:
        rows = len(next(iter(unit.values())))
        yield unit, np.arange(done, done + rows, dtype=np.int64) + (consumer << 40)
        done += rows
