"""An exception raised in a DataLoader worker, sent to the main process as it was raised (see
:mod:`.workers`): PyTorch's own relay rebuilds it from its formatted traceback, and our errors
lose their fields (``url``, ``offset``) on the way."""

from __future__ import annotations

import os
import pickle
import traceback
from dataclasses import dataclass
from typing import NoReturn


@dataclass
class WorkerFailure:
    """What a worker sends instead of a batch when its iteration raised: the exception (its
    own type and fields, or a RuntimeError telling it when it does not survive pickling), and
    where and how it was raised."""

    error: BaseException
    worker: int
    pid: int
    traceback: str

    @classmethod
    def capture(cls, exc: BaseException, worker: int) -> "WorkerFailure":
        """The failure of worker ``worker`` raising ``exc`` (call inside the ``except``)."""
        text = "".join(traceback.format_exception(exc))
        try:
            error = pickle.loads(pickle.dumps(exc))
        except Exception:  # noqa: BLE001 - an exception class that does not pickle back
            error = RuntimeError(f"{type(exc).__qualname__}: {exc}")
        return cls(error, worker, os.getpid(), text)

    def raise_error(self) -> NoReturn:
        """Raise the exception, with a note saying which worker raised it and how. (Neither
        this object nor this frame keeps it: with its traceback, that would be a reference
        cycle holding the loader until a garbage collection, maybe in a forked worker.)"""
        error, self.error = self.error, None  # type: ignore[assignment]
        error.add_note(f"Raised in DataLoader worker {self.worker} (pid {self.pid}):\n{self.traceback.rstrip()}")
        try:
            raise error
        finally:
            del error
