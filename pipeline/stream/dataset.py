"""ShardDataset: stream shards into PyTorch with exact, reproducible, resumable epochs.

The contract, per epoch (``set_epoch(e)``, or let :class:`~pipeline.stream.loader.ShardLoader`
count epochs for you):

- Every (rank, DataLoader worker) reads a disjoint part of the epoch's shuffled sequence (see
  :mod:`pipeline.stream.plan`); with an index, every sample is delivered exactly once per epoch
  (``remainder="pad"`` repeats up to ``world_size - 1`` samples so that ranks are equal,
  ``"drop"`` leaves out as many, ``"keep"`` lets ranks differ by a batch: for evaluation).
- Every rank yields the same number of batches (``len(dataset)``), so DDP never waits for a
  rank that ran out.
- Batches are collated inside the worker: a dict ``field -> tensor`` (or a tuple, with
  ``as_tuple``), gathered with vectorised NumPy from a shuffle buffer of ``shuffle_buffer``
  samples that mixes at least ``chunks_per_buffer`` pieces (chunks) of different shards.
- The same seed and epoch give the same batches on any machine; a new epoch a new order.

Shards written by other tools get all of this once indexed in place (``pipeline index``). Without
an index they stream too, split whole across consumers (:mod:`pipeline.stream.foreign`): then
counts per rank can differ (so under DDP only with ``allow_uneven=True``), there is no ``len()``,
and resuming mid-epoch is refused.

A sample that lacks a field some others have (an optional field of the index) gets ``fill``'s
value for it, else ``None``. Under ``on_error="skip"`` a record that fails its checks costs that
record only, counted in ``stats()``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..format.errors import ShardError
from ..format.index import ShardInfo
from ..storage import SourceError, is_remote, read_range, redact
from ..storage.cache import ShardCache
from ..storage.opener import map_range
from ..storage.retry import RetryPolicy
from .batching import drop_short_tail, messages_from_windows, to_torch
from .foreign import ForeignStream
from .plan import (
    PlanConfig,
    Remainder,
    WorkerPlan,
    chunk_table,
    epoch_order,
    epoch_plans,
    locate,
    window_permutation,
)
from .reader import Columns, assemble_columns, read_rows
from .shards import ForeignShards, IndexedShards, resolve_shards
from .stats import ReadStats
from .workers import WorkerFailure

DEFAULT_BUFFER_BYTES = 32 << 20
REQUESTS_IN_FLIGHT = 8  # ranged requests a worker keeps open at once for remote shards
log = logging.getLogger("pipeline.stream")


def distributed_rank_and_world() -> tuple[int, int]:
    """Rank and world size from torch.distributed when initialised, else RANK/WORLD_SIZE."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class ShardDataset(IterableDataset):
    """Batches from a shard set; see the module docstring for the contract.

    ``source``: an index (``index.json`` or its folder), a brace pattern
    (``shards/train/train-{000000..000009}.tar``) or a list of shard paths.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str],
        *,
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int | None = None,
        chunks_per_buffer: int = 64,
        fields: Sequence[str] | None = None,
        drop_last: bool = False,
        remainder: Remainder = "pad",
        as_tuple: Sequence[str] | None = None,
        sample_transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        batch_transform: Callable[[dict[str, Any]], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: str = "raise",
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int = 64 << 30,
        verify: bool = False,
        check_records: bool = True,
        fill: Mapping[str, Any] | None = None,
        allow_uneven: bool = False,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if remainder not in ("drop", "pad", "keep"):
            raise ValueError(f"remainder must be 'drop', 'pad' or 'keep', got {remainder!r}")
        self.read_stats = ReadStats()  # skips and retries, counted in every worker
        self.policy = RetryPolicy.from_env()  # read once: the workers get it with the dataset
        self.shards = resolve_shards(source, self.policy, self.read_stats)
        default_rank, default_world = distributed_rank_and_world()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world size {self.world_size}")
        if isinstance(self.shards, ForeignShards) and self.world_size > 1 and not allow_uneven:
            raise ValueError(
                f"{len(self.shards.urls)} shards without an index, under DDP (world size {self.world_size}): ranks "
                f"would get different numbers of samples, and DDP hangs when one runs out before the others. Index "
                f"them in place first (pipeline index SHARDS...: exact epochs, equal batches on every rank), or pass "
                f"allow_uneven=True if your loop copes with ranks that differ (DDP join(), say)")
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.remainder: Remainder = remainder
        self.fields = None if fields is None else list(fields)
        self.as_tuple = None if as_tuple is None else list(as_tuple)
        self.sample_transform = sample_transform
        self.batch_transform = batch_transform
        self.shuffle_buffer = shuffle_buffer or self._default_buffer()
        self.chunks_per_buffer = max(chunks_per_buffer, 1)
        self.on_error = on_error
        self.check_records = check_records  # each record read against its checksum in the index
        self.fill = dict(fill or {})  # values for the fields a sample lacks (optional ones)
        self.cache = None if cache_dir is None else ShardCache(cache_dir, cache_bytes, verify, self.policy,
                                                               self.read_stats)
        self.num_workers = 1  # how many DataLoader workers will read: set by ShardLoader
        self.batches_per_message = 1  # batches a worker sends at once: set by ShardLoader
        self.relay_errors = False  # send errors as a WorkerFailure: set in a ShardLoader's workers
        # a shared tensor, so that persistent DataLoader workers see set_epoch()
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self._resume: tuple[int, list[tuple[int, int, int]]] | None = None
        if isinstance(self.shards, IndexedShards):
            index = self.shards.index
            for what, names in (("fields", self.fields or ()), ("fill keys", self.fill)):
                unknown = sorted(set(names) - set(index.fields))
                if unknown and index.fields:
                    raise ValueError(f"{what} {unknown} are not in the index (it has {sorted(index.fields)})")
            self.chunks = chunk_table(index.shards.samples, index.pack, self._chunk_samples())
        self._remote = self.shards.remote

    # -- configuration -------------------------------------------------------------------------

    def sample_bytes(self) -> int:
        """Average bytes of a sample in the shards (a guess for shards without an index)."""
        if isinstance(self.shards, IndexedShards) and self.shards.index.samples:
            return max(self.shards.index.bytes // self.shards.index.samples, 1)
        return 4096

    def _chunk_samples(self) -> int:
        """Samples per chunk: small enough that a worker's window holds ``chunks_per_buffer``
        chunks even when the window is a whole worker span, for up to 8 workers per rank. It
        depends on the data, the buffer and the world size only, never on the number of
        workers, so that an epoch can resume with another number of workers."""
        assert isinstance(self.shards, IndexedShards)
        rank_samples = -(-self.shards.index.samples // self.world_size)
        return max(min(self.shuffle_buffer, rank_samples // 8) // self.chunks_per_buffer, 1)

    def _default_buffer(self) -> int:
        return int(min(max(DEFAULT_BUFFER_BYTES // self.sample_bytes(), 4 * self.batch_size), 1 << 20))

    @property
    def exact(self) -> bool:
        """Whether the epoch plan is exact (the shards have an index)."""
        return isinstance(self.shards, IndexedShards)

    @property
    def samples(self) -> int:
        if not isinstance(self.shards, IndexedShards):
            raise TypeError("shards without an index have no known length")
        return self.shards.index.samples

    @property
    def plan_config(self) -> PlanConfig:
        return PlanConfig(self.seed, self.world_size, self.batch_size, self.drop_last, self.remainder,
                          self.batches_per_message)

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration plays, from its start (also seen by persistent
        workers)."""
        self._resume = None
        self._epoch.fill_(int(epoch))

    def resume(self, epoch: int, legs: list[tuple[int, int, int]]) -> None:
        """Continue ``epoch`` after the batches that ``legs`` already delivered (see
        :func:`pipeline.stream.plan.epoch_plans`); set by the loader's ``load_state_dict``."""
        if legs and not self.exact:
            raise ValueError("resuming in the middle of an epoch needs an index; shards without one "
                             "resume at the next epoch boundary")
        self.set_epoch(epoch)
        self._resume = (epoch, [(int(k), int(n), int(m)) for k, n, m in legs])

    def _legs(self, epoch: int) -> list[tuple[int, int, int]]:
        return self._resume[1] if self._resume and self._resume[0] == epoch else []

    def batches_per_rank(self, num_workers: int | None = None, epoch: int | None = None,
                         legs: list[tuple[int, int, int]] | None = None) -> int:
        """Batches this rank yields in an epoch with ``num_workers`` workers (0 counts as 1),
        after the batches ``legs`` delivered (by default: those of a resume of this epoch)."""
        workers = max(self.num_workers if num_workers is None else num_workers, 1)
        epoch = self.epoch if epoch is None else epoch
        plans = epoch_plans(self.samples, self.plan_config, self.rank, workers,
                            self._legs(epoch) if legs is None else legs)
        return sum(plan.batches(self.batch_size, self.drop_last) for plan in plans)

    def __len__(self) -> int:
        return self.batches_per_rank()

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """Batches of this rank and worker; ``batches_per_message`` at a time when a ShardLoader
        asked for messages (it splits them again). In a worker of a ShardLoader, an error ends
        the stream with a :class:`~pipeline.stream.workers.WorkerFailure` that the loader raises."""
        info = get_worker_info()
        if info is None or not self.relay_errors:
            yield from self._batches(info)
            return
        try:
            yield from self._batches(info)
        except Exception as exc:  # noqa: BLE001 - every error goes to the loader, with its type
            yield WorkerFailure.capture(exc, info.id)

    def _batches(self, info: Any) -> Iterator[Any]:
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        epoch = self.epoch
        per_message = self.batches_per_message
        if isinstance(self.shards, IndexedShards):
            plan = epoch_plans(self.samples, self.plan_config, self.rank, workers, self._legs(epoch))[worker]
            windows = self._indexed_windows(epoch, plan)
            sizes: Any = [n * self.batch_size
                          for n in plan.message_sizes(self.batch_size, self.drop_last, per_message)]
            limit = plan.batches(self.batch_size, True) * self.batch_size if self.drop_last else None
        else:
            windows = self._foreign_stream().windows(epoch, self.rank * workers + worker, self.world_size * workers)
            sizes, limit = itertools.repeat(per_message * self.batch_size), None
        messages = messages_from_windows(windows, sizes, limit, shared=info is not None)
        if self.drop_last and limit is None:
            messages = drop_short_tail(messages, self.batch_size)
        for message in messages:
            yield self._finish(message)

    def _wanted(self) -> set[str] | None:
        return None if self.fields is None else set(self.fields)

    def _foreign_stream(self) -> ForeignStream:
        assert isinstance(self.shards, ForeignShards)
        return ForeignStream(self.shards.urls, self.seed, self.shuffle, self.shuffle_buffer, self._wanted(),
                             self.fill, self.on_error == "skip", self.policy, self.read_stats)

    def stats(self) -> dict[str, int]:
        """Counts over all workers so far: shard pieces skipped under ``on_error="skip"``, the
        samples that stood in for them, and remote reads retried."""
        return self.read_stats.totals()

    def _read_piece(self, shard: int, start: int, stop: int) -> Columns | None:
        """Rows of one piece. Under the skip policy a record that fails its checks costs that
        record, and a piece whose bytes cannot be read costs the piece (``None``): logged,
        counted; the window then lets other rows stand in for what is missing."""
        assert isinstance(self.shards, IndexedShards)
        url = self.shards.url(shard)

        def lost(exc: ShardError, samples: int) -> None:
            log.warning("skipping %d samples of %s: %s", samples, redact(url), exc)
            self.read_stats.skipped(samples)

        try:
            return read_rows(url, self.shards.shards[shard], self.shards.index.pack, start, stop, self._wanted(),
                             self._range_reader, self.shards.index.fields or None, self.check_records, self.fill,
                             lost if self.on_error == "skip" else None)
        except (ShardError, SourceError) as exc:
            if self.on_error == "raise":
                raise
            lost(exc, stop - start)
            return None

    def _range_reader(self, url: str, start: int, stop: int, shard: ShardInfo) -> bytes | memoryview:
        if not is_remote(url):
            return map_range(url, start, stop)
        if self.cache is not None:
            with self.cache.reading(url, shard.bytes, shard.sha256) as path:
                return map_range(str(path), start, stop)  # the mapping outlives an eviction
        return read_range(url, start, stop, self.policy, stats=self.read_stats)

    def _read_positions(self, order: Any, start: int, stop: int) -> Columns:
        pieces = locate(order, self.chunks, start, stop)
        if self._remote and len(pieces) > 1:  # requests wait on the network: keep several in flight
            futures = [_request_pool().submit(self._read_piece, *piece) for piece in pieces]
            try:
                results = [future.result() for future in futures]
            finally:  # on an error, let no request run on behind the caller's back
                for future in futures:
                    future.cancel()
                wait(futures)
        else:
            results = [self._read_piece(*piece) for piece in pieces]
        good = [columns for columns in results if columns]
        missing = (stop - start) - sum(_rows(columns) for columns in good)
        if missing:  # skip policy: good rows stand in for the lost ones, so that every rank
            if not good:  # still yields the same number of batches
                raise ShardError(self.shards.url(pieces[0][0]), None,  # type: ignore[union-attr]
                                 "every piece of a shuffle window failed; nothing to stand in for them")
            good.append(_repeat(assemble_columns(iter(good), stop - start - missing), missing))
        return assemble_columns(iter(good), stop - start)

    def _indexed_windows(self, epoch: int, plan: WorkerPlan) -> Iterator[tuple[Columns, np.ndarray]]:
        order = epoch_order(self.chunks, self.seed, epoch, self.shuffle)
        size = self.shuffle_buffer
        for seg in plan.segments:
            span_length = seg.span_stop - seg.span_start
            for window in range(seg.begin // size, -(-seg.end // size)):
                lo, hi = window * size, min((window + 1) * size, span_length)
                columns = self._read_positions(order, seg.span_start + lo, seg.span_start + hi)
                emit = window_permutation(self.seed, epoch, seg.span_start, window, hi - lo, self.shuffle)
                yield columns, emit[max(seg.begin, lo) - lo:min(seg.end, hi) - lo]

    def _finish(self, batch: Columns) -> Any:
        if self.sample_transform is not None:
            n = len(next(iter(batch.values())))
            samples = [self.sample_transform({k: v[i] for k, v in batch.items()}) for i in range(n)]
            batch = {k: _stack([s[k] for s in samples]) for k in samples[0]}
        out = to_torch(batch)
        if self.batch_transform is not None:
            return self.batch_transform(out)
        if self.as_tuple is not None:
            return tuple(out[name] for name in self.as_tuple)
        return out


@functools.lru_cache(maxsize=1)
def _request_pool_for(pid: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(REQUESTS_IN_FLIGHT, thread_name_prefix="shard-read")


def _request_pool() -> ThreadPoolExecutor:
    """Threads that read remote pieces of a window at once, one pool per process (a pool does
    not survive a fork)."""
    return _request_pool_for(os.getpid())


def _rows(columns: Columns) -> int:
    return len(next(iter(columns.values())))


def _repeat(columns: Columns, rows: int) -> Columns:
    """``rows`` rows taken cyclically from ``columns``."""
    index = np.arange(rows) % _rows(columns)
    return {name: col[index] if isinstance(col, np.ndarray) else [col[i] for i in index]
            for name, col in columns.items()}


def _stack(values: list[Any]) -> Any:
    if isinstance(values[0], torch.Tensor):
        return torch.stack(values)
    if isinstance(values[0], (np.ndarray, np.generic, int, float, bool)):
        return np.stack([np.asarray(v) for v in values])
    return values
