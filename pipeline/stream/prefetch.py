"""Feeding a model on a device: each batch copied there on a side stream while the step before
runs, and a measure of how long training waits for data (the input-bound fraction)."""

from __future__ import annotations

import os
import time
from typing import Any, Iterator, Mapping

import torch

from .loader import taken_over


def _close(iterator: Iterator[Any]) -> None:
    """End a loader's loop now (a ShardLoader's stops its workers); a plain DataLoader's iterator
    has nothing to close."""
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


def _holds_tensors(items: list | tuple) -> bool:
    """Whether a list or tuple may hold tensors: an ``as_tuple`` batch, a field's list of
    per-sample tensors (``None`` among them), not a text field's strings, which are looked at by
    their types alone (a call per string cost 150 us a batch of 256)."""
    return any(issubclass(kind, (torch.Tensor, Mapping, list, tuple)) for kind in set(map(type, items)))


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if type(batch) in (list, tuple) and _holds_tensors(batch):
        moved = [_to_device(v, device) for v in batch]
        return moved if type(batch) is list else tuple(moved)
    return batch


def _record_stream(batch: Any, stream: Any) -> None:
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, Mapping):
        for value in batch.values():
            _record_stream(value, stream)
    elif isinstance(batch, (list, tuple)) and _holds_tensors(batch):
        for value in batch:
            _record_stream(value, stream)


class DevicePrefetcher:
    """Iterate a loader with each batch already on ``device``: on CUDA the next batch is copied
    on a side stream (``non_blocking``, from pinned memory) while the current step runs.

    It also measures the input-bound fraction: the share of wall time the training loop spent
    waiting for the next batch rather than computing (``stats()``)."""

    #: A loop left under way by a script is closed as the interpreter finalizes, when this
    #: module's names may be gone: what that close runs is reached through the class.
    _close = staticmethod(_close)
    _clock = staticmethod(time.perf_counter)

    def __init__(self, loader: Any, device: str | torch.device | None = None) -> None:
        if isinstance(loader, (str, bytes, os.PathLike)) or not hasattr(loader, "__iter__"):
            raise TypeError(f"DevicePrefetcher wraps a loader, DevicePrefetcher(make_loader(...)); got "
                            f"{type(loader).__name__} {loader!r}")
        self.loader = loader
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
        if self.device.type == "cuda" and not torch.cuda.is_available():  # told here, not in the loop, once it ran
            raise ValueError(f"DevicePrefetcher(device={str(self.device)!r}): CUDA is not available on this machine "
                             f"(torch {torch.__version__}); leave device out to use the GPU where there is one, "
                             f"else the CPU")
        self.waited = 0.0
        self.elapsed = 0.0
        self.batches = 0
        self._upcoming: Any = None  # the batch the current loop holds, fetched ahead
        self._fetched_at: Any = None  # the loader's generation and loops when it was fetched
        self._loops = 0  # loops begun over it: only the last begun is current (see __iter__)

    def __len__(self) -> int:
        """The loader's ``len``: its batches in the epoch."""
        return len(self.loader)

    def batches_left(self) -> int:
        """The batches still to come in the epoch of a loader that counts what it delivered (a
        ShardLoader's ``batches_left()``), the batch fetched ahead among them."""
        return self.loader.batches_left() + int(self._held())

    def stats(self) -> dict[str, float]:
        """Seconds waited for data, seconds in all, batches and the input-bound fraction, over every
        loop this prefetcher ran."""
        return {"waited_s": self.waited, "elapsed_s": self.elapsed, "batches": self.batches,
                "input_bound": self.waited / self.elapsed if self.elapsed else 0.0}

    def _timed_next(self, iterator: Iterator[Any]) -> Any:
        started = time.perf_counter()
        try:
            return next(iterator)
        finally:
            self.waited += time.perf_counter() - started

    def __iter__(self) -> Iterator[Any]:
        """A loop over the loader's batches on the device. One begun while an earlier one is still
        open (an iterator kept from a look at a batch) takes over: the batch the earlier one
        holds, fetched ahead, is given back to the loader, so that the new loop delivers it, and
        the earlier one, stepped again, raises rather than deliver it twice."""
        if self._held() and hasattr(self.loader, "give_back"):
            self.loader.give_back(1)
        self._upcoming, self._loops = None, self._loops + 1
        return self._run(iter(self.loader), self._loops)  # (the loader's loop begun at once, as without a
        # prefetcher: see ShardLoader.__iter__)

    def _run(self, iterator: Iterator[Any], loop: int) -> Iterator[Any]:
        start, before = time.perf_counter(), self.elapsed  # stats() sum every loop over this prefetcher
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        taken = 0  # batches taken from the loader and not yet handed to the loop: given back if it stops
        left = self._batches_left() or None  # fetched only once the last one was trained on: see below (none
        # left: the loader's loop is asked at once, and runs out, ending its epoch)
        fetched_at = None  # the loader's generation when this loop last fetched

        def fetch() -> Any:
            nonlocal taken, left, fetched_at
            if left == 0:
                return None
            try:
                batch = self._timed_next(iterator)
            except StopIteration:
                return None
            taken, fetched_at = taken + 1, self._loader_place()
            self._fetched_at = fetched_at
            left = None if left is None else left - 1
            if stream is None:
                return _to_device(batch, self.device)
            with torch.cuda.stream(stream):
                return _to_device(batch, self.device)  # may fail (out of device memory): the batch is counted

        try:
            self._upcoming = fetch()
            while True:
                if left == 0 and self._upcoming is None and fetched_at == self._loader_place():
                    # the epoch's last batch was trained on: only now may the loader's loop run out and end
                    # its epoch, so that a checkpoint taken in that step stands at the epoch's end, as without
                    # a prefetcher (and not at the next epoch's start, which a resumed run would replay)
                    left = None
                    self._upcoming = fetch()
                if self._upcoming is not None and fetched_at[1] != self._loader_place()[1]:
                    raise taken_over()  # (the loader delivered batches past the one held to another loop)
                if not self._held():
                    break
                batch = self._upcoming
                if stream is not None:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_stream(stream)
                    _record_stream(batch, current)
                self._upcoming = fetch()  # overlaps the step on batch
                self.batches, taken = self.batches + 1, taken - 1
                self.elapsed = before + time.perf_counter() - start
                yield batch
                if self._loops != loop:  # a later loop took over, and was given the batch this one held
                    raise RuntimeError("this prefetcher was iterated again while this loop over it ran (an iterator "
                                       "kept from a look at a batch, then a for loop): the later loop goes on from "
                                       "where training stands; iterate a prefetcher in one loop at a time")
        except BaseException:  # the loop stopped early (a break, an error in its body, a worker's or a copy's)
            closing = self._clock()
            self._close(iterator)  # holding batches: the loader's loop ends, and the next one delivers them
            self.waited += self._clock() - closing  # (its workers stopping)
            if taken and self._loops == loop and fetched_at == self._loader_place() and \
                    hasattr(self.loader, "give_back"):
                self.loader.give_back(taken)
            raise
        finally:
            if self._loops == loop:
                self._upcoming = None  # nothing held; a batch fetched before the loader moved is dropped
                self.elapsed = before + self._clock() - start  # (with the step a stopped loop was in)
        self._close(iterator)

    def _batches_left(self) -> int | None:
        """The batches the loader's next loop delivers, where it knows (``None``: shards without an
        index, a loader without ``len``)."""
        try:
            return self.loader.batches_left() if hasattr(self.loader, "batches_left") else len(self.loader)
        except TypeError:
            return None

    def _loader_place(self) -> tuple[int | None, int | None]:
        """The loader's generation (moved by ``set_epoch`` and ``load_state_dict``) and loops
        begun over it (another loop takes over); ``None`` for a loader that counts neither."""
        return getattr(self.loader, "generation", None), getattr(self.loader, "loops", None)

    def _held(self) -> bool:
        """Whether a batch fetched ahead is held, from where the loader still stands: one fetched
        before ``set_epoch`` or ``load_state_dict`` moved it is not (the loader's loop ends)."""
        return self._upcoming is not None and self._fetched_at == self._loader_place()

    def state_dict(self) -> dict[str, Any]:
        """The loader's state as of the last batch handed to the training loop (the batch
        fetched ahead is not counted, so resuming replays it)."""
        return self.loader.state_dict(in_flight=int(self._held()))

    def progress(self) -> dict[str, int]:
        """The loader's ``progress()`` as of the last batch handed to the training loop (the
        batch fetched ahead is not counted, as in :meth:`state_dict`)."""
        return self.loader.progress(in_flight=int(self._held()))
