"""ShardDataset: stream shards into PyTorch with exact, reproducible, resumable epochs.

The contract, per epoch (``set_epoch(e)``, or let :class:`~pipeline.stream.loader.ShardLoader`
count epochs for you):

- Every rank delivers a disjoint part of the epoch's shuffled sequence (see
  :mod:`pipeline.stream.plan`); with an index, every sample is delivered exactly once per epoch
  (``remainder="pad"`` repeats up to ``world_size - 1`` samples so that ranks are equal, with
  ``drop_last`` only where they complete a batch; ``"drop"`` leaves out as many, ``"keep"`` lets
  ranks differ by a batch: for evaluation).
- Every rank yields the same number of batches (``len(dataset)``), so DDP never waits for a
  rank that ran out; a rank's batches do not depend on the number of DataLoader workers (nor,
  in a ShardLoader, their order; a plain DataLoader takes the workers' batches one by one in
  turn, so the same batches come in another order).
- Batches are collated inside the worker: a dict ``field -> tensor`` (or a tuple, with
  ``as_tuple``), gathered with vectorised NumPy from units of about ``shuffle_buffer`` samples
  that mix many pieces (chunks) of different shards, and of different sources in a mix.
- The same seed and epoch give the same batches on any machine; a new epoch a new order.

Several shard sets mix by weight (``ShardDataset({"web": ..., "code": ...}, weights={...})``, see
:mod:`.sources`) with the same promises. Shards written by other tools get all of this once
indexed in place (``pipeline index``). Without an index they stream too, split whole across
consumers (:mod:`.foreign`): then counts per rank can differ (so under DDP only with
``allow_uneven=True``), there is no ``len()``, and resuming mid-epoch is refused.

A sample that lacks a field some others have (an optional field of the index) gets ``fill``'s
value for it, else ``None``. Under ``on_error="skip"`` a record that fails its checks costs that
record only, counted in ``stats()``.
"""

from __future__ import annotations

import copy
import os
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from ..storage import is_remote, obstore_ranges, redact, s3_presigned
from ..storage.cache import ShardCache
from ..storage.retry import RetryPolicy
from . import message_buffers
from .allocator import fix_mmap_threshold
from .batching import drop_short_tail, gather, messages_from_windows, varied_fields
from .fill_values import conformed_fill
from .finishing import Finishing
from .foreign import ForeignStream, reference_fields, stream_places, warn_of_idle_consumers
from .idle_trim import idle_trim
from .images import Images
from .options import (
    CHUNKS_PER_BUFFER,
    DEFAULT_CACHE_BYTES,
    REMOTE_CHUNKS_PER_BUFFER,
    check_cache_options,
    check_callables,
    check_dataset_options,
    check_epoch,
    check_fill,
    check_flags,
    check_ranks_unchanged,
    check_read_fields,
    rank_and_world,
    warn_of_cache_use,
)
from .plan import Leg, PlanConfig, Remainder, leg_sequences, rank_batches, worker_reads
from .progress import delivered_per_source
from .rank_agreement import check_ranks_agree
from .read_ahead import read_ahead
from .reader import LARGE_SAMPLE_BYTES, Columns
from .shards import ForeignShards
from .shared_memory import shared_numbers
from .sources import Sources, SourceSet, open_sources
from .stats import Count, ReadStats
from .transform_seeds import batch_seeds
from .unit_images import ImageDecoding, alternatives, check_image_fields
from .units import UnitReader
from .worker_failure import WorkerFailure

DEFAULT_BUFFER_BYTES = 32 << 20


class ShardDataset(IterableDataset):
    """Batches from a shard set, or from several mixed; see the module docstring for the contract.

    ``source``: an index (``index.json`` or its folder, or a URL), a brace pattern
    (``shards/train/train-{000000..000009}.tar``), a list of shard paths, or a mapping ``name ->
    index`` of sources to mix: each gives an epoch ``samples[name]`` samples when given, else a
    share of ``epoch_samples`` (default: the sum of the sources' sizes) by ``weights[name]``
    (default: in proportion to the sources' sizes).
    """

    def __init__(
        self,
        source: Sources,
        *,
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int | None = None,
        chunks_per_buffer: int | None = None,
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
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        verify: bool = False,
        check_records: bool = True,
        fill: Mapping[str, Any] | None = None,
        allow_uneven: bool = False,
        weights: Mapping[str, float] | None = None,
        samples: Mapping[str, int] | None = None,
        epoch_samples: int | None = None,
        read_ahead: int | None = None,
        images: Mapping[str, Images] | None = None,
    ) -> None:
        super().__init__()
        decoded = list(images) if isinstance(images, Mapping) else []  # (anything else: refused below)
        transformed = sample_transform is not None or batch_transform is not None
        check_dataset_options(batch_size, on_error, remainder, read_ahead, fields, as_tuple, transformed, seed,
                              shuffle_buffer, chunks_per_buffer, decoded)
        check_flags(shuffle=shuffle, drop_last=drop_last, check_records=check_records, allow_uneven=allow_uneven)
        check_callables(sample_transform=sample_transform, batch_transform=batch_transform)
        check_fill(fill)
        self.read_stats = ReadStats()  # skips and retries, counted in every worker
        self.policy = RetryPolicy.from_env()  # read once: the workers get it with the dataset
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.ranks_given = rank is not None or world_size is not None  # (else checked as it is iterated)
        self.batch_size, self.shuffle, self.seed, self.drop_last = int(batch_size), bool(shuffle), int(seed), bool(drop_last)
        self.remainder: Remainder = remainder
        self.fields = None if fields is None else list(fields)
        self.as_tuple = None if as_tuple is None else list(as_tuple)
        self.on_error = on_error
        self.check_records = check_records  # each record read against its checksum in the index
        # units read ahead in a thread (None: see _read_ahead)
        self.read_ahead = None if read_ahead is None else int(read_ahead)
        self.fill = dict(fill or {})  # values for the fields a sample lacks (optional ones)
        folder = check_cache_options(cache_dir, cache_bytes, verify)
        obstore_ranges.check_setting()  # (else its first read, the shard table's maybe, would be said to fail)
        s3_presigned.check_setting()
        self.shards, self.sources = self._open(source, weights, samples, epoch_samples, allow_uneven, decoded,
                                                transformed)
        schema = None if self.sources is None else self.sources.schema(self.fields)  # (None: no index)
        if schema is not None:
            self.fill = conformed_fill(self.fill, schema)
        # fields batches hold as lists (see batching.listed); shards without an index: none known; images
        # are decoded into one tensor a batch, whatever the bytes they came from
        images_from = {field for key in decoded for field in (key, *alternatives(key))}
        self.varied = frozenset() if schema is None else varied_fields(schema, self.fill) - images_from
        self.finishing = Finishing(self.batch_size, sample_transform, batch_transform, self.varied, self.as_tuple,
                                   self.read_stats)
        # (local shards are read in place: no cache, nor a folder made for one, for a set that has none remote)
        cached = folder is not None and self._remote()
        warn_of_cache_use(folder if cached else None, cache_bytes, self.sources)
        self.cache = ShardCache(folder, int(cache_bytes), verify, self.policy, self.read_stats) \
            if cached and self.sources is not None else None
        self.image_decoding = None if not images else ImageDecoding(
            check_image_fields(images, schema, self.fields), seed, on_error == "skip", self.read_stats)
        self.foreign_fields = None if self.sources is not None else reference_fields(
            self.shards.urls, self._wanted(), self.fill, on_error == "skip", self.policy, self.read_stats)
        if self.foreign_fields is not None:
            check_read_fields(self.as_tuple, self.fill, self.foreign_fields, transformed,
                              "the fields read (those of the shards' first record, or fields=)", decoded)
        self.shuffle_buffer = int(shuffle_buffer or self._default_buffer())  # (a NumPy uint would wrap in the plan)
        if self.sources is not None:
            default = REMOTE_CHUNKS_PER_BUFFER if self._remote() else CHUNKS_PER_BUFFER
            per_buffer = default if chunks_per_buffer is None else int(chunks_per_buffer)
            self.sources.cut(self.shuffle_buffer, max(per_buffer, 1), self.world_size)
        self.relay_errors = False  # send errors as a WorkerFailure: set in a ShardLoader's workers
        self.unit_messages = False  # send a unit's batches as one message: set in a ShardLoader's workers
        # the epoch (persistent DataLoader workers see set_epoch()), the most consumers checked for
        # idle ones (see tell_idle_consumers), 1 once a record's fields not read were warned of (see ForeignStream)
        self._epoch, self._consumers_told, self._unread_told = shared_numbers(3)
        self._position: tuple[int, tuple[Leg, ...], int, bool] | None = None  # resumed: legs, batches, layout
        check_ranks_agree(self)

    def _open(self, source: Sources, weights: Mapping[str, float] | None, samples: Mapping[str, int] | None,
              epoch_samples: int | None, allow_uneven: bool, decoded: list[str],
              transformed: bool) -> tuple[Any, SourceSet | None]:
        """The shards to read, and the indexed sources of the plan (``None`` without an index);
        ``decoded``: the fields images decode into (``"jpg;png"``), which batches hold too;
        ``transformed``: whether transforms make the batches (which may then hold other fields)."""
        shards, sources = open_sources(source, weights, samples, epoch_samples, self.world_size, allow_uneven,
                                       self.policy, self.read_stats)
        if sources is not None:
            check_read_fields(self.as_tuple, self.fill, sources.schema(self.fields), transformed,
                              "the index" if self.fields is None else "the fields read (fields=)", decoded)
        return shards, sources

    # -- configuration -------------------------------------------------------------------------

    def sample_bytes(self) -> int:
        """Average bytes of a sample in the shards (a guess for shards without an index)."""
        return 4096 if self.sources is None else self.sources.sample_bytes

    def _default_buffer(self) -> int:
        """About 32 MB of samples (as the workers hold them: images decoded), at least 4 batches."""
        held = self.sample_bytes() + (0 if self.image_decoding is None else self.image_decoding.decoded_bytes)
        return int(min(max(DEFAULT_BUFFER_BYTES // held, 4 * self.batch_size), 1 << 20))

    @property
    def source_text(self) -> str:
        """The shards read, in a few words (for messages)."""
        if self.sources is not None and self.sources.mixed:
            return f"the mix of {self.sources.names}"
        if isinstance(self.shards, ForeignShards):
            return f"{len(self.shards.urls)} shards without an index"
        return redact(str(self.shards.base))

    @property
    def exact(self) -> bool:
        """Whether the epoch plan is exact (the shards have an index)."""
        return self.sources is not None

    @property
    def samples(self) -> int:
        """Samples in an epoch (of all sources of a mix)."""
        if self.sources is None:
            raise TypeError("shards without an index have no known length")
        return self.sources.samples

    @property
    def plan_config(self) -> PlanConfig:
        return PlanConfig(self.seed, self.batch_size, self.drop_last, self.remainder, self.shuffle,
                          self.shuffle_buffer, self.short_last_unit)

    @property
    def short_last_unit(self) -> bool:
        """Whether the epoch under way is laid out as by version 3 and before (a checkpoint of
        theirs taken in its middle, resumed): each rank's rest of a unit a unit of its own."""
        return self._position is not None and self._position[0] == self.epoch and self._position[3]

    @property
    def epoch(self) -> int:
        return self._epoch.get()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration plays, from its start (also seen by persistent
        workers)."""
        self._position = None
        self._epoch.set(check_epoch(epoch))

    def __copy__(self) -> "ShardDataset":
        """A shallow copy whose epoch is its own (see :mod:`.shared_memory`)."""
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        copied._epoch = copy.copy(self._epoch)
        return copied

    def resume(self, epoch: int, legs: Sequence[Leg], batches: int, short_last_unit: bool = False) -> None:
        """Continue ``epoch`` after ``legs`` (stretches on other world sizes) and the ``batches``
        this rank delivered since, in the layout of version 3 and before where
        ``short_last_unit``; set by the loader's ``load_state_dict``."""
        if (legs or batches) and not self.exact:
            raise ValueError("resuming in the middle of an epoch needs an index; shards without one "
                             "resume at the next epoch boundary")
        self.set_epoch(epoch)
        self._position = (epoch, tuple(legs), int(batches), short_last_unit)

    def position(self, epoch: int | None = None) -> tuple[tuple[Leg, ...], int]:
        """The legs before this one and the batches delivered in it, for ``epoch``."""
        epoch = self.epoch if epoch is None else epoch
        if self._position is not None and self._position[0] == epoch:
            return self._position[1], self._position[2]
        return (), 0

    def _sequences(self, legs: Sequence[Leg], batches: int) -> list:
        return leg_sequences(self.samples, self.plan_config, [*legs, Leg(self.world_size, batches)])

    def batches_left(self, epoch: int | None = None, legs: Sequence[Leg] | None = None,
                     batches: int | None = None) -> int:
        """Batches this rank still yields in ``epoch`` after ``legs`` and ``batches`` (by
        default: those of a resume of this epoch)."""
        found_legs, found_batches = self.position(epoch)
        legs = found_legs if legs is None else legs
        batches = found_batches if batches is None else batches
        return rank_batches(self._sequences(legs, batches)[-1][self.rank], self.plan_config) - batches

    def __len__(self) -> int:
        """This rank's batches in an epoch on this world size, those a resume leaves out
        included: see ``ShardLoader.__len__``."""
        return self.batches_left(legs=[], batches=0)

    def delivered_per_source(self, epoch: int, legs: Sequence[Leg], batches: int) -> dict[str, int]:
        """Samples of each source delivered in ``epoch`` by every rank, in ``legs`` and the
        ``batches`` since (from the plan: the same on every rank)."""
        assert self.sources is not None
        all_legs = [*legs, Leg(self.world_size, batches)]
        counts = delivered_per_source(self.sources.material(self.seed, epoch, self.shuffle), len(self.sources.names),
                                      self._sequences(legs, batches), all_legs, self.plan_config, epoch)
        return dict(zip(self.sources.names, counts.tolist()))

    def tell_idle_consumers(self, workers: int, worker: int = 0, loader: bool = False) -> None:
        """Warn (on rank 0) where shards without an index are fewer than the consumers of
        ``workers`` a rank. A ShardLoader (``loader``) tells as it is made, in the main process (a
        worker's warning pointed at torch's code); a plain DataLoader's worker ``worker``, or a loop
        over the dataset itself, as it begins, unless a loader, or the workers of an earlier epoch
        (non-persistent ones start anew each epoch), checked as many consumers already."""
        consumers = self.world_size * max(workers, 1)
        if self.sources is not None or self.rank != 0 or worker != 0:
            return
        checked = self._consumers_told.get()
        if loader or consumers > checked:
            warn_of_idle_consumers(len(self.shards.urls), consumers)
        self._consumers_told.set(max(consumers, checked))

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """Batches of this rank (of the units this worker reads). In a worker of a ShardLoader,
        a unit's batches are one message, and an error ends the stream with a
        :class:`~pipeline.stream.worker_failure.WorkerFailure` that the loader raises."""
        info = get_worker_info()
        if not self.ranks_given and (info is None or not self.relay_errors):  # (a ShardLoader checked it)
            check_ranks_unchanged(self.rank, self.world_size)  # (a forked worker has its parent's group)
        if info is None or not self.relay_errors:
            yield from self._messages(info)
            return
        try:
            yield from self._messages(info)
        except Exception as exc:  # noqa: BLE001 - every error goes to the loader, with its type
            yield WorkerFailure.capture(exc, info.id)

    def _messages(self, info: Any) -> Iterator[Any]:
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if info is not None and self._remote():
            fix_mmap_threshold(os.getpid())
            obstore_ranges.use_in_this_worker()
        units = self._indexed_units(worker, workers) if self.sources is not None else \
            self._foreign_units(worker, workers)
        epoch = self.epoch
        buffers = message_buffers.installed()
        trim = idle_trim()  # held: a loop closed as the interpreter finalizes finds this module's names gone
        trim.started()
        try:
            for unit, places in units:
                seeds = None if self.finishing.plain else batch_seeds(self.seed, epoch, places, self.batch_size)
                if not self.unit_messages:
                    yield from self.finishing.batches(unit, seeds, in_worker=False)
                    continue
                message = self.finishing.unit_message(unit, seeds)
                if buffers is not None:
                    message = buffers.lend(message)
                unit = None  # hold no unit while this one is handed over and the next one read: a unit's memory each
                handed = time.perf_counter()
                yield message
                message = None
                self.read_stats.spent(Count.HANDOVER, time.perf_counter() - handed)
        finally:
            units = None
            trim.ended()  # the reused buffers given back to the system if no epoch follows soon

    def _indexed_units(self, worker: int, workers: int) -> Iterator[tuple[Columns, np.ndarray]]:
        """The units this worker reads, each gathered in emission order (into shared memory in a
        ShardLoader's worker), with each row's place in the epoch's material."""
        assert self.sources is not None
        epoch, config = self.epoch, self.plan_config
        legs, batches = self.position(epoch)
        material = self.sources.material(self.seed, epoch, self.shuffle)
        all_legs = [*legs, Leg(self.world_size, batches)]
        sequences = self._sequences(legs, batches)
        reader = UnitReader(self.sources, self._wanted(), self.fill, self.on_error == "skip", self.check_records,
                            self.cache, self.policy, self.read_stats)
        reads = worker_reads(sequences, all_legs, config, epoch, self.rank, worker, workers)
        for columns, rows, places in read_ahead(reads, lambda unit: (*reader.read(material, sequences[0], *unit),
                                                                     unit[0]), self._read_ahead()):
            with self.read_stats.timing(Count.GATHER):
                unit = gather(columns, rows, shared=self.unit_messages)
            columns = rows = None  # the rows read are not needed once gathered: let them go before the next read
            if self.image_decoding is not None:
                unit = self.image_decoding.apply(unit, places, epoch, self.unit_messages,
                                                 lambda row, places=places: reader.provenance(material, int(places[row])))
            yield unit, places
            unit = None

    def _foreign_units(self, worker: int, workers: int) -> Iterator[tuple[Columns, np.ndarray]]:
        """The units of this worker's share of the shards, each with its rows' places in this
        consumer's stream."""
        assert isinstance(self.shards, ForeignShards)
        stream = ForeignStream(self.shards.urls, self.seed, self.shuffle, self.shuffle_buffer, self._wanted(),
                               self.fill, self.on_error == "skip", self.policy, self.read_stats, self.foreign_fields,
                               self._unread_told)
        self.tell_idle_consumers(workers, worker)
        consumer = self.rank * workers + worker
        windows = stream.windows(self.epoch, consumer, self.world_size * workers)
        unit_rows = max(self.shuffle_buffer // self.batch_size, 1) * self.batch_size
        units = messages_from_windows(windows, unit_rows, self.unit_messages, lambda: self.read_stats.timing(Count.GATHER))
        units = drop_short_tail(units, self.batch_size) if self.drop_last else units
        units = stream_places(units, consumer)
        if self.image_decoding is None:
            return units
        return self.image_decoding.stream(units, consumer, self.epoch, self.unit_messages)

    def _remote(self) -> bool:
        """Whether some shards are read over the network."""
        if self.sources is None:
            return any(is_remote(url) for url in self.shards.urls)
        return any(shards.remote for shards in self.sources.shards)

    def _read_ahead(self) -> int:
        """Units to read ahead: by default one in the main process, where reading would otherwise
        wait for the training step, and none in DataLoader workers, which their loader's
        ``prefetch_factor`` already keeps that far ahead. Nor for large samples: gathering them
        stacks one array per sample, which holds the GIL, so the reading thread and the gathering
        one slow each other down (measured: 30% fewer 150 KB images a second without workers)."""
        if self.read_ahead is not None:
            return self.read_ahead
        return 1 if get_worker_info() is None and self.sample_bytes() < LARGE_SAMPLE_BYTES else 0

    def _wanted(self) -> set[str] | None:
        return None if self.fields is None else set(self.fields)

    def stats(self) -> dict[str, float]:
        """Counts over all workers so far: records and pieces skipped under ``on_error="skip"``,
        the samples that stood in for them, the requests and retries of remote reads, and the
        seconds spent in each stage of reading (see :mod:`.stats`)."""
        return self.read_stats.totals()
