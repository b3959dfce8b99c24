"""What the DataLoader does to what a dataset yields before it reaches the loop: NumPy arrays
become tensors (PyTorch's ``default_convert``), but tuples stay tuples, a text field's list of
strings is passed as it is, and read-only arrays are copied first."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils.data._utils.collate import default_convert

from .batching import FinishedBatches
from .message_buffers import Lent


def convert_keeping_tuples(item: Any) -> Any:
    """DataLoader's conversion of what a dataset yields (arrays to tensors), but for a tuple,
    which it would make a list: an ``as_tuple`` batch stays a tuple, and a worker's tuple
    message is not taken for a list of batches; nor does a tuple a ``batch_transform`` returned
    in a worker, so that it comes as it does without workers."""
    if type(item) is tuple:
        return tuple(_converted(value) for value in item)
    if type(item) is dict:
        return {name: _converted(value) for name, value in item.items()}
    if isinstance(item, FinishedBatches):
        return FinishedBatches(convert_keeping_tuples(batch) for batch in item)
    if type(item) is Lent:  # a worker's message in reused buffers: its message by these rules (as a
        # NamedTuple, DataLoader's would visit every string of a text field: half a worker's time)
        return item._replace(message=convert_keeping_tuples(item.message))
    return default_convert(item)


_TEXT_TYPES = {str, bytes}


def _converted(value: Any) -> Any:
    """``default_convert(value)``, with a batch's list of strings (a text field) kept as it is:
    ``default_convert`` visits every string of it, which took two thirds of an epoch's time over
    a set with a text field beside its arrays."""
    if type(value) is list and set(map(type, value)) <= _TEXT_TYPES:
        return value
    return default_convert(_own_arrays(value))


def _own_arrays(value: Any) -> Any:
    """``value`` with its read-only arrays copied (those of a dict field are views of the bytes
    read): a tensor must not share them, and PyTorch warns of it."""
    if isinstance(value, np.ndarray):
        return value if value.flags.writeable else value.copy()
    if type(value) is dict:
        return {key: _own_arrays(item) for key, item in value.items()}
    if type(value) is list:
        return [_own_arrays(item) for item in value]
    return value
