"""Feeding a model on a device: each batch copied there on a side stream while the step before
runs, and a measure of how long training waits for data (the input-bound fraction)."""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping

import torch


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _record_stream(batch: Any, stream: Any) -> None:
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, Mapping):
        for value in batch.values():
            _record_stream(value, stream)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            _record_stream(value, stream)


class DevicePrefetcher:
    """Iterate a loader with each batch already on ``device``: on CUDA the next batch is copied
    on a side stream (``non_blocking``, from pinned memory) while the current step runs.

    It also measures the input-bound fraction: the share of wall time the training loop spent
    waiting for the next batch rather than computing (``stats()``)."""

    def __init__(self, loader: Any, device: str | torch.device | None = None) -> None:
        self.loader = loader
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
        self.waited = 0.0
        self.elapsed = 0.0
        self.batches = 0
        self._upcoming: Any = None

    def __len__(self) -> int:
        return len(self.loader)

    def stats(self) -> dict[str, float]:
        """Seconds waited for data, seconds in all, and the input-bound fraction."""
        return {"waited_s": self.waited, "elapsed_s": self.elapsed, "batches": self.batches,
                "input_bound": self.waited / self.elapsed if self.elapsed else 0.0}

    def _timed_next(self, iterator: Iterator[Any]) -> Any:
        started = time.perf_counter()
        try:
            return next(iterator)
        finally:
            self.waited += time.perf_counter() - started

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.loader)
        start = time.perf_counter()
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

        def fetch() -> Any:
            try:
                batch = self._timed_next(iterator)
            except StopIteration:
                return None
            if stream is None:
                return _to_device(batch, self.device)
            with torch.cuda.stream(stream):
                return _to_device(batch, self.device)

        self._upcoming = fetch()
        try:
            while self._upcoming is not None:
                batch = self._upcoming
                if stream is not None:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_stream(stream)
                    _record_stream(batch, current)
                self._upcoming = fetch()  # the next copy overlaps the step on this batch
                self.batches += 1
                self.elapsed = time.perf_counter() - start
                yield batch
        except GeneratorExit:  # the loop stopped early, holding a batch fetched ahead: the loader's
            iterator.close()  # loop ends, and the next one delivers that batch again
            if self._upcoming is not None and hasattr(self.loader, "give_back"):
                self.loader.give_back(1)
            self._upcoming = None
            raise
        self.elapsed = time.perf_counter() - start

    def state_dict(self) -> dict[str, Any]:
        """The loader's state as of the last batch handed to the training loop (the batch
        fetched ahead is not counted, so resuming replays it)."""
        return self.loader.state_dict(in_flight=int(self._upcoming is not None))
