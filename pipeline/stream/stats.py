"""What a dataset's reads went through, counted across its DataLoader workers: pieces skipped
and the samples that stood in for them (``on_error="skip"``), and the requests and retries of
remote reads.

The counts live in a shared-memory table, one row per worker (or the main process), so that the
main process sums what every worker counted. Counts are only ever added: a worker that starts
again (a new epoch, a resume) adds to what earlier ones counted, and two datasets of a process
(train and validation) each count their own reads. :class:`ReadStats` is what the storage
layer reports retries to (a :class:`~pipeline.storage.retry.RetrySink`).
"""

from __future__ import annotations

import os
import threading

import torch
from torch.utils.data import get_worker_info

_ROWS = 64  # one per worker id (modulo 63), the last one the main process's
_SKIPPED, _REPLACED, _RETRIES, _REQUESTS = range(4)
# The reader threads of a process share its row: adding is a read and a write, so they take
# turns. One lock per process (a fork copies a lock as it stands, perhaps held).
_lock = threading.Lock()


def _new_lock() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)


class ReadStats:
    """Counts of one dataset, shared with its workers (picklable: workers started with spawn
    get the same table)."""

    def __init__(self) -> None:
        self.table = torch.zeros((_ROWS, 4), dtype=torch.int64).share_memory_()

    def _add(self, column: int, count: int) -> None:
        info = get_worker_info()
        row = _ROWS - 1 if info is None else info.id % (_ROWS - 1)  # the main process has a row of its own
        with _lock:
            self.table[row, column] += count

    def retried(self) -> None:
        """One more retry of a remote read."""
        self._add(_RETRIES, 1)

    def requested(self) -> None:
        """One more request sent for a remote read (its first, a retry, or a resume)."""
        self._add(_REQUESTS, 1)

    def skipped(self, samples: int) -> None:
        """One more piece skipped, whose ``samples`` other samples stand in for (or, without
        an index, that could not be read)."""
        self._add(_SKIPPED, 1)
        self._add(_REPLACED, samples)

    def totals(self) -> dict[str, int]:
        skipped, replaced, retries, requests = self.table.sum(dim=0).tolist()
        return {"skipped_pieces": skipped, "replaced_samples": replaced, "retries": retries, "requests": requests}
