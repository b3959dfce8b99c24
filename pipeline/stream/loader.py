"""The DataLoader side: ``make_loader``, a loader whose state survives a checkpoint, and a
device prefetcher that measures how long training waits for data.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader

from .batching import split_message
from .dataset import ShardDataset
from .workers import (
    RelayErrors,
    WorkerError,
    WorkerFailure,
    exited_workers,
    is_worker_death,
    stop_workers,
    translate_worker_deaths,
)

STATE_VERSION = 1
_PLAN_KEYS = ("seed", "world_size", "batch_size", "drop_last", "remainder", "shuffle", "samples")


def _seed_numpy_in_worker(worker_id: int) -> None:
    """Give each worker's global NumPy RNG its own seed (for user transforms); the dataset's
    own shuffling never uses global RNGs."""
    np.random.seed(torch.initial_seed() % 2**32)


class ShardLoader(DataLoader):
    """A DataLoader over a :class:`ShardDataset` (``batch_size=None``: batches come collated
    from the workers) that counts epochs and batches.

    Iterating it plays the current epoch from where it stands, then moves to the next epoch.
    ``state_dict()`` after batch ``n`` and ``load_state_dict()`` in a fresh process make the
    next iteration yield batch ``n + 1`` onward exactly as an uninterrupted run would, with the
    same ``num_workers``; with a different ``num_workers`` the epoch continues with exactly the
    samples not yet delivered, each once (in another order). Continuing mid-epoch starts new
    workers (persistent ones hold a copy of the dataset from before).
    """

    def __init__(self, dataset: ShardDataset, num_workers: int = 0,
                 batches_per_message: int | None = None, **kwargs: Any) -> None:
        if num_workers:  # workers send errors as messages, which this loader raises
            kwargs["worker_init_fn"] = RelayErrors(kwargs.get("worker_init_fn"))
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        dataset.num_workers = max(num_workers, 1)
        dataset.batches_per_message = batches_per_message or _auto_batches_per_message(dataset, num_workers)
        self._epoch = dataset.epoch
        self._batches = 0
        self._legs: list[tuple[int, int, int]] = []
        self._workers_resumed = False  # whether persistent workers hold a resumed plan

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning at the next iteration."""
        self._epoch, self._batches, self._legs = int(epoch), 0, []

    def __len__(self) -> int:
        return self.dataset.batches_per_rank(max(self.num_workers, 1), self._epoch, self._legs)  # type: ignore[attr-defined]

    def _leg(self, batches: int) -> tuple[int, int, int]:
        return max(self.num_workers, 1), batches, self.dataset.batches_per_message  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        dataset: ShardDataset = self.dataset  # type: ignore[assignment]
        if self._batches:  # an earlier iteration stopped early: continue after its last batch
            self._legs.append(self._leg(self._batches))
            self._batches = 0
        dataset.resume(self._epoch, self._legs) if self._legs else dataset.set_epoch(self._epoch)
        if self._iterator is not None and (self._legs or self._workers_resumed or not all(
                w.is_alive() for w in getattr(self._iterator, "_workers", ()))):
            # persistent workers hold a copy of the dataset taken before this resume (or during
            # an earlier one, which would replay it), or one of them died
            self._stop_workers(self._iterator)
        self._workers_resumed = bool(self._legs)
        iterator = super().__iter__()
        if self.num_workers:
            translate_worker_deaths()
        failure = None
        try:
            for message in iterator:
                if isinstance(message, WorkerFailure):
                    failure = message
                    break
                for batch in split_message(message, dataset.batch_size) if dataset.batches_per_message > 1 else [message]:
                    self._batches += 1
                    yield batch
        except GeneratorExit:  # the loop stopped early: a break, or an error in its body (a worker's
            self._stop_workers(iterator)  # death in a training step among them); the next one restarts
            raise
        except Exception as exc:
            death = self._death_after(iterator, exc)
            if death is None:
                raise
            raise WorkerError(death) from exc
        if failure is not None:
            self._stop_workers(iterator)
            failure.raise_error()
        self.set_epoch(self._epoch + 1)

    def _death_after(self, iterator: Any, exc: Exception) -> str | None:
        """Stop the workers after ``exc`` came out of the DataLoader; if a worker died, the
        message of the :class:`WorkerError` to raise. A worker that dies while it sends a batch
        can break the connection (``ConnectionResetError``) a moment before PyTorch sees it
        gone, so an unexplained error waits a little for a worker to exit. (No exception is
        kept in a local here: with its traceback, that would be a reference cycle keeping the
        DataLoader alive until a garbage collection, maybe in a forked worker.)"""
        death = _death_text(exc)
        dead: list[int] = []
        for _ in range(3):  # a death signal may still interrupt this, until the workers are unwatched
            try:
                if death is None and self.num_workers:
                    dead = exited_workers(iterator, grace=1.0)
                self._stop_workers(iterator)
                break
            except RuntimeError as late:
                death = _death_text(late)
                if death is None:
                    raise
        if death is None and dead:
            death = (f"DataLoader worker (pid(s) {', '.join(map(str, dead))}) exited unexpectedly "
                     f"({type(exc).__name__}: {exc}).")
        if death is None:
            return None
        delivered = self._batches + sum(batches for _, batches, _ in self._legs)
        return f"{death} Epoch {self._epoch} stopped after batch {delivered}; {WorkerError.advice}"

    def _stop_workers(self, iterator: Any) -> None:
        """Stop the worker processes of ``iterator`` and forget them, so that the next iteration
        starts new ones (persistent workers with one of them dead would fail again)."""
        stop_workers(iterator)
        if self._iterator is iterator:
            self._iterator = None

    def stats(self) -> dict[str, int]:
        """Pieces skipped, samples replaced and remote reads retried so far (all workers)."""
        return self.dataset.stats()  # type: ignore[attr-defined]

    def state_dict(self, in_flight: int = 0) -> dict[str, Any]:
        """Where the loader stands: epoch, and the batches delivered so far in it (less
        ``in_flight`` batches fetched ahead by a prefetcher but not yet trained on)."""
        dataset: ShardDataset = self.dataset  # type: ignore[assignment]
        batches = self._batches - in_flight
        legs = self._legs + ([self._leg(batches)] if batches else [])
        state = {"version": STATE_VERSION, "epoch": self._epoch, "legs": [list(leg) for leg in legs]}
        state.update({key: _plan_value(dataset, key) for key in _PLAN_KEYS})
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; refuse a state whose plan this loader cannot continue."""
        dataset: ShardDataset = self.dataset  # type: ignore[assignment]
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')!r} is not supported")
        legs = [(int(k), int(n), int(m)) for k, n, m in state["legs"]]
        for key in _PLAN_KEYS:
            mine = _plan_value(dataset, key)
            if state.get(key) != mine and (legs or key not in ("world_size", "batch_size", "drop_last")):
                raise ValueError(
                    f"cannot resume: the checkpoint was taken with {key}={state.get(key)!r}, this loader "
                    f"has {key}={mine!r}" + (" (it can change only at an epoch boundary)" if legs else ""))
        if legs:
            dataset.resume(int(state["epoch"]), legs)
        self._epoch, self._batches, self._legs = int(state["epoch"]), 0, legs


def _death_text(exc: BaseException) -> str | None:
    """PyTorch's words for a worker's death, when ``exc`` reports one (also when it reached
    us translated into a WorkerError), else ``None``."""
    if not is_worker_death(exc):
        return None
    return str(exc.__cause__ if isinstance(exc, WorkerError) and exc.__cause__ else exc).strip()


def _auto_batches_per_message(dataset: ShardDataset, num_workers: int) -> int:
    """Batches per worker message: enough to amortise the DataLoader's per-message cost for
    small batches (up to 16), one for batches of 8 MB and more, one without workers or when a
    transform may change what a batch is."""
    if num_workers == 0 or dataset.batch_transform is not None or dataset.sample_transform is not None:
        return 1
    batch_bytes = dataset.batch_size * dataset.sample_bytes()
    return int(min(max((8 << 20) // batch_bytes, 1), 16))


def _plan_value(dataset: ShardDataset, key: str) -> Any:
    if key == "samples":
        return dataset.samples if dataset.exact else None
    return getattr(dataset, key)


def make_loader(
    dataset: ShardDataset | Any,
    num_workers: int = 2,
    *,
    prefetch_factor: int | None = 2,
    persistent_workers: bool | None = None,
    pin_memory: bool | None = None,
    batches_per_message: int | None = None,
    **dataset_options: Any,
) -> ShardLoader:
    """A :class:`ShardLoader` with sensible defaults: persistent workers, prefetching, per-worker
    NumPy seeds, and pinned memory when CUDA is present. ``dataset`` is a ShardDataset or what
    ShardDataset takes as source (then ``dataset_options`` are its options)."""
    if not isinstance(dataset, ShardDataset):
        dataset = ShardDataset(dataset, **dataset_options)
    elif dataset_options:
        raise TypeError(f"options {sorted(dataset_options)} apply only when a source is given")
    workers = num_workers > 0
    return ShardLoader(
        dataset,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor if workers else None,
        persistent_workers=workers if persistent_workers is None else persistent_workers and workers,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        worker_init_fn=_seed_numpy_in_worker if workers else None,
        batches_per_message=batches_per_message,
    )


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
        self.elapsed = time.perf_counter() - start

    def state_dict(self) -> dict[str, Any]:
        """The loader's state as of the last batch handed to the training loop (the batch
        fetched ahead is not counted, so resuming replays it)."""
        return self.loader.state_dict(in_flight=int(self._upcoming is not None))
