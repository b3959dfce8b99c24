"""Tasks sent to a running cluster carry absolute paths.

A Dask cluster started elsewhere (``scheduler=``, ``--scheduler``) runs its workers in folders of
their own: the folder their service started in, on this machine or another. A relative path in a
task would name another file there, or none: a build would read other data without a word when
the same name exists in the worker's folder. So every task for such a cluster is pickled here,
with each relative ``pathlib`` path made absolute against this process's folder (sources hold
their files' paths as ``Path``\\ s for this), and unpickled by the worker that runs it.
"""

from __future__ import annotations

import io
import os
import pickle
from concurrent.futures import Executor, Future
from pathlib import PurePath
from typing import Any, Callable


def _pickled(payload: Any) -> bytes:
    """``payload`` pickled by cloudpickle (as Dask pickles tasks: a ``Source`` class defined in
    the script that runs the build goes by value, the workers cannot import it), relative paths
    made absolute. (cloudpickle comes with Dask: a cluster is only reached through Dask.)"""
    import cloudpickle

    class AbsolutePaths(cloudpickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, PurePath) and not obj.is_absolute():
                return type(obj), (os.path.abspath(obj),)
            return super().reducer_override(obj)

    buffer = io.BytesIO()
    AbsolutePaths(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(payload)
    return buffer.getvalue()


def _run(payload: bytes) -> Any:
    function, args, kwargs = pickle.loads(payload)
    return function(*args, **kwargs)


class AbsolutePathsExecutor(Executor):
    """``executor``, its tasks' relative paths made absolute before they leave this process."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        return self.executor.submit(_run, _pickled((fn, args, kwargs)))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.executor.shutdown(wait=wait)  # (Dask's executor takes no cancel_futures)
