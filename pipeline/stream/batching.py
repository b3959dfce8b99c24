"""Cut emitted windows into batches with vectorised gathers, and hand them to torch.

A window is a set of columns plus the emission order of its rows. Rows are gathered with one
``np.take`` per field into a fresh buffer: in a DataLoader worker that buffer is a torch tensor
in shared memory, so it crosses to the main process without another copy. A DataLoader pays
a fixed cost per object it passes between processes (about a millisecond on a small machine),
so workers send *messages* of several batches, which the main process splits into views.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import lru_cache, reduce
from typing import Any, Callable, ContextManager, Iterator, Mapping, Sequence

import numpy as np
import torch

from ..format.index import Schema
from ..format.numbers import joins_exactly, outside_int64
from . import message_buffers
from .reader import Columns


@lru_cache(maxsize=None)
def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a NumPy dtype."""
    return torch.from_numpy(np.empty(0, dtype)).dtype


def shared_empty(shape: tuple[int, ...], dtype: np.dtype | torch.dtype) -> torch.Tensor:
    """An uninitialised tensor allocated straight in shared memory (``share_memory_()`` on a
    new tensor would allocate twice and copy): in a ShardLoader's worker, memory of a message
    the main process is done with (:mod:`.message_buffers`)."""
    torch_type = dtype if isinstance(dtype, torch.dtype) else torch_dtype(dtype)
    buffers = message_buffers.installed()
    reused = None if buffers is None else buffers.empty(shape, torch_type)
    if reused is not None:
        return reused
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:
        return torch.empty(shape, dtype=torch_type).share_memory_()
    count = int(np.prod(shape, dtype=np.int64))
    storage = new_shared(count * torch_type.itemsize)
    return torch.empty(0, dtype=torch_type).set_(storage, 0, shape)


def _gather_array(column: np.ndarray, index: np.ndarray, shared: bool) -> Any:
    shape = (len(index),) + column.shape[1:]
    if shared and column.dtype.kind in "biuf":
        out = shared_empty(shape, column.dtype)
        # not NumPy's mode="raise": with ``out`` it copies ``out`` into fresh memory, takes into
        # that and copies it back (three passes over a unit, and the fresh pages zeroed: 13% of a
        # worker's CPU when streaming embeddings); the bounds are checked here instead
        if len(index) and (index.min() < 0 or index.max() >= len(column)):
            raise IndexError(f"rows {index.min()}..{index.max()} gathered from {len(column)}")
        np.take(column, index, axis=0, out=out.numpy(), mode="clip")
        return out
    return np.take(column, index, axis=0)


def _gather_list(column: list, index: np.ndarray, shared: bool) -> Any:
    """Rows of a list column: equally shaped arrays are stacked straight into the batch buffer
    (one copy per sample), anything else stays a list."""
    values = list(map(column.__getitem__, index.tolist()))
    first = values[0] if values else None
    if isinstance(first, torch.Tensor) and all(  # bfloat16 samples (NumPy has no such dtype)
            isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype for v in values):
        out = shared_empty((len(values), *first.shape), first.dtype) if shared else None
        return torch.stack(values, out=out)
    if not isinstance(first, np.ndarray) or first.dtype.kind not in "biuf" or any(
            not isinstance(v, np.ndarray) or v.shape != first.shape or v.dtype != first.dtype for v in values):
        return values  # a sample that lacks the field (None), or values of several shapes
    shape = (len(values),) + first.shape
    if shared:
        out = shared_empty(shape, first.dtype)
        np.stack(values, out=out.numpy())
        return out
    return np.stack(values)


def gather(columns: Columns, index: np.ndarray, shared: bool = False) -> Columns:
    """Rows ``index`` of every column: one vectorised copy per field, into shared memory when
    ``shared``."""
    return {name: _gather_array(col, index, shared) if isinstance(col, np.ndarray)
            else _gather_list(col, index, shared) for name, col in columns.items()}


def varied_fields(schema: Schema, fill: Mapping[str, Any]) -> frozenset[str]:
    """The fields that batches hold as lists (see :func:`listed`): arrays whose samples differ in
    some dimension (``None`` in the index's shape), fields of values of several types (dtype
    ``any``: ints beside floats, numbers beside ``None``), and optional fields ``fill`` gives no
    value (``None`` where a sample lacks one)."""
    return frozenset(name for name, spec in schema.items()
                     if spec.varies or spec.dtype == "any" or spec.optional and fill.get(name) is None)


def listed(batch: Any, varied: frozenset[str], as_tuple: Sequence[str] | None = None) -> Any:
    """``batch`` (a dict, or a tuple of the fields ``as_tuple`` names) with the fields ``varied``
    as lists of per-sample values, also where its samples happen to agree and were stacked: a
    batch that is a tensor in one step and a list in the next would fail a training loop hours
    in. Done as batches are handed out, not in the workers, whose one stacked tensor crosses to
    the training process far faster than a tensor per sample (each its own shared memory)."""
    if not varied:
        return batch
    if isinstance(batch, tuple):
        return tuple(_per_sample(value) if name in varied else value for name, value in zip(as_tuple or (), batch))
    return {name: _per_sample(value) if name in varied else value for name, value in batch.items()}


def _per_sample(value: Any) -> Any:
    """A column as a list of its samples' values: an array (tensor) each, or where each holds one
    value (a number of an optional field, or of a field of several types) that value as Python
    has it, as in a batch where a sample lacks it (``[3, None]``) or where the values differ in
    type (``[1, 0.5]``): one type from step to step."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 1:
        return value.tolist()
    if isinstance(value, torch.Tensor):
        return list(value.unbind(0))
    if isinstance(value, np.ndarray):
        return list(value)
    return [v.item() if isinstance(v, (np.generic, torch.Tensor)) and v.ndim == 0 else v for v in value]


def _join(parts: list[Columns]) -> Columns:
    out: Columns = {}
    for name in parts[0]:
        cols = [p[name] for p in parts]
        if all(isinstance(c, torch.Tensor) for c in cols):
            out[name] = torch.cat(cols)
        elif all(isinstance(c, (np.ndarray, torch.Tensor)) for c in cols) \
                and joins_exactly(arrays := [np.asarray(c) for c in cols]):
            out[name] = np.concatenate(arrays)
        else:
            out[name] = [v for c in cols for v in c]
    return out


def messages_from_windows(windows: Iterator[tuple[Columns, np.ndarray]], target: int, shared: bool = False,
                          timing: Callable[[], ContextManager[Any]] = nullcontext) -> Iterator[Columns]:
    """Rows in emission order across windows, cut into messages of ``target`` rows each (whole
    batches; the last message may be shorter); each gather and join runs inside ``timing()``."""
    carry: list[Columns] = []
    carried = 0
    for columns, order in windows:
        position = 0
        while position < len(order):
            take = order[position:position + target - carried]
            position += len(take)
            if not carry and len(take) == target:
                with timing():
                    message = gather(columns, take, shared)
                yield message
                continue
            with timing():
                carry.append(gather(columns, take))
            carried += len(take)
            if carried < target:
                continue
            with timing():
                message = _join(carry)
            yield message
            carry, carried = [], 0
    if carried:
        with timing():
            message = _join(carry)
        yield message


def drop_short_tail(messages: Iterator[Columns], batch_size: int) -> Iterator[Columns]:
    """Without an index the stream's length is unknown: cut a last partial batch when it shows."""
    for message in messages:
        rows = len(next(iter(message.values())))
        keep = rows - rows % batch_size
        if keep == rows:
            yield message
        elif keep:
            yield {name: value[:keep] for name, value in message.items()}


class FinishedBatches(list):
    """A message of batches a transform finished (not columns to cut into batches): a type of
    its own, since DataLoader's conversions and pinning turn tuples (``as_tuple`` messages)
    into lists, and keep a list's type."""


def split_message(message: Any, batch_size: int) -> Iterator[Any]:
    """The batches of a message (views, no copy): a dict or tuple of tensors and lists."""
    if isinstance(message, dict):
        rows = len(next(iter(message.values())))
        for start in range(0, rows, batch_size):
            yield {name: value[start:start + batch_size] for name, value in message.items()}
    else:
        rows = len(message[0])
        for start in range(0, rows, batch_size):
            yield tuple(value[start:start + batch_size] for value in message)


def to_torch(batch: Columns) -> dict[str, Any]:
    """Arrays become tensors (without a copy, unless read-only: views of a shard's bytes, which a
    tensor must not share); so do the arrays of a list column (samples of different shapes);
    lists of str/bytes stay lists."""
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if _numeric(value):
            out[name] = _tensor(value)
        elif isinstance(value, list) and any(issubclass(kind, np.ndarray) for kind in set(map(type, value))) \
                and any(map(_numeric, value)):  # (the types first, without a Python call per value: text)
            out[name] = [_tensor(v) if _numeric(v) else v for v in value]
        else:
            out[name] = value
    return out


#: The kinds of NumPy arrays that become tensors (complex ones only a transform makes: no shard stores them).
_NUMERIC_KINDS = "biufc"


def _numeric(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in _NUMERIC_KINDS


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def per_sample(batch: Columns, transform: Callable[[dict[str, Any]], dict[str, Any]],
               varied: frozenset[str] = frozenset()) -> Columns:
    """``transform`` applied to each sample of ``batch``, the results put together again. Each
    sample holds its values as a batch would: NumPy values on any number of workers, and a field
    of ``varied`` (see :func:`listed`) as a Python value (an int as written) or an array each. A
    field the transform returns as it got it in every sample of the batch is the column as it
    was (a list for ``varied``: a transform that sets a label leaves the token sequences beside it
    a list in every batch, not a tensor where a batch's lengths happen to agree); other fields
    are stacked where one array holds their values exactly (see :func:`_stack`), else a list.
    Every sample must come back with the same fields."""
    batch = listed({k: _as_numpy(v) for k, v in batch.items()}, varied)
    n = len(next(iter(batch.values())))
    given = [{k: v[i] for k, v in batch.items()} for i in range(n)]
    samples = [transform(dict(sample)) for sample in given]  # (a copy: a transform may change its dict in place)
    for sample in samples:
        if not isinstance(sample, dict):
            forgot = " (a function that changes the sample in place still ends with `return sample`)" \
                if sample is None else ""
            raise TypeError(f"sample_transform must return a dict of fields, got {type(sample).__name__}{forgot}")
    fields = list(samples[0]) if samples else []
    for sample in samples:
        if sample.keys() != set(fields):
            raise ValueError(f"sample_transform returned the fields {sorted(fields)} for one sample of a batch and "
                             f"{sorted(sample)} for another: return the same fields for every sample (with None, or "
                             f"a value that stands for none, where a sample has no value)")
    return {k: batch[k] if _as_given(k, samples, given) else _stack([s[k] for s in samples]) for k in fields}


def _as_given(field: str, samples: list[dict[str, Any]], given: list[dict[str, Any]]) -> bool:
    """Whether ``field`` of every sample is the very value the transform was given for it."""
    return all(field in before and after[field] is before[field] for after, before in zip(samples, given))


def _as_numpy(column: Any) -> Any:
    """A column a worker gathered into a tensor (shared memory) as a NumPy view of it, as it is
    without workers: a transform gets the same types on any number of workers (bfloat16, which
    NumPy lacks, is a tensor on all)."""
    return column.numpy() if isinstance(column, torch.Tensor) and column.dtype != torch.bfloat16 else column


def batch_transformed(transform: Callable[[Any], Any], batch: Any) -> Any:
    """``transform(batch)``; ``None`` is refused, as the batch a loop would otherwise get (a
    function that changed the batch in place and returned nothing)."""
    out = transform(batch)
    if out is None:
        raise TypeError("batch_transform returned None: return the batch (a function that changes it in place still "
                        "ends with `return batch`)")
    return out


def _stack(values: list[Any]) -> Any:
    """Values of one shape as one array (tensor) where one array holds them all exactly and of a
    kind among theirs (a float32 beside a float64 is stacked; an int beside a float, a bool beside
    an int, an int64 beside a uint64, which NumPy joins as floats, and an int no int64 holds are
    not), else the list."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        same = all(isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype for v in values)
        return torch.stack(values) if same else values
    if not all(isinstance(v, (np.ndarray, np.generic, int, float, complex)) and not outside_int64(v)
               for v in values):  # (bool is an int)
        return values
    arrays = [np.asarray(v) for v in values]
    dtypes = {a.dtype for a in arrays}
    kinds = {dtype.kind for dtype in dtypes}
    if all(a.shape == arrays[0].shape for a in arrays) and kinds <= set(_NUMERIC_KINDS) and joins_exactly(arrays) \
            and reduce(np.promote_types, dtypes).kind in kinds:
        return np.stack(arrays)
    return values


def picked(batch: Any, as_tuple: Sequence[str]) -> tuple[Any, ...]:
    """The fields ``as_tuple`` names of a finished batch, in that order; the batch comes from the
    user's transforms, so a name it lacks is said plainly."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"as_tuple picks fields of a batch, but batch_transform returned a {type(batch).__name__}: "
                        f"return a dict from it, or leave as_tuple out")
    missing = [name for name in as_tuple if name not in batch]
    if missing:
        raise KeyError(f"as_tuple names {missing}, which the batch (after the transforms) lacks: it has "
                       f"{sorted(batch)}")
    return tuple(batch[name] for name in as_tuple)
