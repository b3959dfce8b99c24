"""What a dataset's reads went through, counted across its DataLoader workers: pieces skipped
and the samples that stood in for them (``on_error="skip"``), the requests and retries of
remote reads, and where a worker's time went (the per-stage profile).

The counts live in a shared-memory table, one row per worker (or the main process), so that the
main process sums what every worker counted. Counts are only ever added: a worker that starts
again (a new epoch, a resume) adds to what earlier ones counted, and two datasets of a process
(train and validation) each count their own reads. :class:`ReadStats` is what the storage
layer reports retries to (a :class:`~pipeline.storage.retry.RetrySink`).

The profile is the time of each stage of a worker, summed over workers (and over the reader
threads of a worker that reads remote pieces several at once):

- ``storage_s``: waiting for the bytes of a piece (a remote request, a cache's copy, mapping a
  local file; the page faults of a local file that is not in the page cache happen later, while
  its records are read, and count as decoding);
- ``decode_s``: walking, checking (checksums, the schema) and decoding the records of a piece
  (with a remote index, fetching the block of its table that says where they start counts here);
- ``gather_s``: joining the rows read and gathering a unit's samples in emission order into the
  buffers sent;
- ``transform_s``: running the ``sample_transform`` and ``batch_transform`` (with the seeding of
  their random generators and the making of the batches they are given and return);
- ``handover_s``: from a worker's handing a unit over to the DataLoader until it is asked for the
  next: sending it, and waiting while the loader's prefetch queue is full (time the worker is
  idle because the training loop, not the input, is the bottleneck).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from enum import IntEnum
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ..fork_safe import ForkSafeLock
from .shared_memory import in_shared_memory

#: DataLoader workers a dataset counts apart: each adds to a row of its own, without a lock
#: between processes (a shared row would lose additions). 256 rows of 9 counts are 18 KB: a
#: table of 32 KB or more is copied into shared memory by OpenMP's threads, which hang in a
#: process forked from one that used them (a child that makes a loader of its own).
MAX_WORKERS = 255
_ROWS = MAX_WORKERS + 1  # one per worker id, the last one the main process's


class Count(IntEnum):
    """The columns of the table: counts, then nanoseconds spent in each stage."""

    SKIPPED = 0
    REPLACED = 1
    RETRIES = 2
    REQUESTS = 3
    STORAGE = 4
    DECODE = 5
    GATHER = 6
    HANDOVER = 7
    TRANSFORM = 8


_NAMES = {Count.SKIPPED: "skipped_pieces", Count.REPLACED: "replaced_samples", Count.RETRIES: "retries",
          Count.REQUESTS: "requests"}
#: The stages of a worker, in the order of a unit's way through it.
STAGES = {Count.STORAGE: "storage_s", Count.DECODE: "decode_s", Count.GATHER: "gather_s",
          Count.TRANSFORM: "transform_s", Count.HANDOVER: "handover_s"}
# The reader threads of a process share its row: adding is a read and a write, so they take
# turns.
_lock = ForkSafeLock()


class ReadStats:
    """Counts of one dataset, shared with its workers (picklable: workers started with spawn
    get the same table)."""

    def __init__(self) -> None:
        self.table = torch.zeros((_ROWS, len(Count)), dtype=torch.int64).share_memory_()
        self._view: np.ndarray | None = None

    def __getstate__(self) -> dict:
        return {"table": self.table}

    def __setstate__(self, state: dict) -> None:
        self.table, self._view = in_shared_memory(state["table"]), None  # (a copy's, anew)

    def _add(self, *counts: tuple[Count, int]) -> None:
        """Add each ``(column, count)`` to this process's row, in one turn of the lock."""
        if self._view is None:  # NumPy's view of the shared table: adding to it costs ~100x less than torch's
            self._view = self.table.numpy()
        info = get_worker_info()
        row = MAX_WORKERS if info is None else info.id % MAX_WORKERS  # (more workers: refused by make_loader)
        with _lock:
            for column, count in counts:
                self._view[row, column] += count

    def retried(self) -> None:
        """One more retry of a remote read."""
        self._add((Count.RETRIES, 1))

    def requested(self) -> None:
        """One more request sent for a remote read (its first, a retry, or a resume)."""
        self._add((Count.REQUESTS, 1))

    def skipped(self, samples: int) -> None:
        """One more piece skipped, whose ``samples`` other samples stand in for (or, without
        an index, that could not be read)."""
        self._add((Count.SKIPPED, 1), (Count.REPLACED, samples))

    def spent(self, stage: Count, seconds: float) -> None:
        """``seconds`` more spent in ``stage`` (one of :data:`STAGES`)."""
        self._add((stage, int(seconds * 1e9)))

    def spent_reading(self, waited: float, seconds: float) -> None:
        """``seconds`` more spent reading a piece, ``waited`` of them waiting for storage (the
        rest decoding and checking it): one add, as a piece of a record costs a few microseconds."""
        self._add((Count.STORAGE, int(waited * 1e9)), (Count.DECODE, int((seconds - waited) * 1e9)))

    @contextmanager
    def timing(self, stage: Count) -> Iterator[None]:
        """Count the time of the block as spent in ``stage``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.spent(stage, time.perf_counter() - started)

    def totals(self) -> dict[str, float]:
        """The counts of every worker so far, and the seconds of each stage of the profile."""
        sums = self.table.sum(dim=0).tolist()
        out: dict[str, float] = {name: sums[column] for column, name in _NAMES.items()}
        out.update({name: sums[column] / 1e9 for column, name in STAGES.items()})
        return out
