"""Values a dataset shares with its DataLoader workers, which must stay shared through copies.

A dataset's epoch and counts live in tensors in shared memory, so that persistent workers
(started once, before a ``set_epoch``) see the epoch change, and the training process sees the
workers' counts; so do the marks of what its warnings told already, which workers started anew
each epoch would otherwise give again. A copy of the dataset (``copy.deepcopy``, ``pickle.loads``: a validation
variant of a training set, say) made such a tensor private: workers forked from the copy played
epoch 0's order at every epoch, and a checkpoint of the copy resumed another order than the one
played, losing samples. Whatever makes a tensor from a pickled state gets it in shared memory
here: a spawned worker's (which torch's pickler hands the same memory) as it is, a copy's anew.
"""

from __future__ import annotations

import torch


def in_shared_memory(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, moved to shared memory where it is not there: a copy's own (made from a pickled
    state), whose numbers of one block, views of one storage in a deep copy, move there together
    (a block each would hold a file open each)."""
    return tensor if tensor.is_shared() else tensor.share_memory_()


class SharedNumber:
    """A number that a dataset's DataLoader workers see change, and change for each other:
    persistent ones (started before a ``set_epoch``) and those started anew each epoch, forked
    or spawned. Each copy has its own (``copy.copy`` too: a copy's ``set_epoch`` moved the
    original's). Not a lock: two processes that change it at the same moment may each miss the
    other's change."""

    def __init__(self, value: int = 0, place: torch.Tensor | None = None) -> None:
        """``place``: an element of a shared tensor to hold it (see :func:`shared_numbers`)."""
        self._value = torch.full((), value, dtype=torch.int64).share_memory_() if place is None else place

    def get(self) -> int:
        return int(self._value.item())

    def set(self, value: int) -> None:
        self._value.fill_(value)

    def __copy__(self) -> "SharedNumber":
        return SharedNumber(self.get())

    def __getstate__(self) -> dict:
        return {"value": self._value}

    def __setstate__(self, state: dict) -> None:
        self._value = in_shared_memory(state["value"])


def shared_numbers(count: int) -> list[SharedNumber]:
    """``count`` numbers, 0 each, in one block of shared memory: each block holds a file open for
    as long as it lives, and a process has a thousand or so (a number a block halved the datasets
    a process could hold)."""
    block = torch.zeros(count, dtype=torch.int64).share_memory_()
    return [SharedNumber(place=block[i]) for i in range(count)]
