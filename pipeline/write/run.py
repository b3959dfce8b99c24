"""Planned builds: cut a source into shards up front, write them in parallel, index them last.

The plan (which rows go to which shard) depends only on the source and the limits, so a
build with ``workers=4``, a build split into ``--part i/N`` runs on N machines, and a plain
single-process build all produce the same shards. Work goes through a
``concurrent.futures.Executor``: a local process pool by default, any compatible executor
(e.g. a cluster's, see :mod:`.engines`) when given. A resumed build (``resume=True``) plans
the same shards and keeps those a killed run finished (see :mod:`.resume`).
"""

from __future__ import annotations

import math
import os
import sys
from concurrent.futures import Executor, Future, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, overload

import numpy as np

from ..caller_warning import warn_caller
from ..format.errors import FormatError, SampleError
from ..format.index import (
    INDEX_NAME,
    DatasetIndex,
    FieldSpec,
    PartInfo,
    Schema,
    ShardInfo,
    merge_schema,
    part_index_name,
)
from ..format.numbers import SplitSize, WholeNumber
from ..interrupts import held_ctrl_c
from ..storage.destination import Destination, destination
from ..storage.errors import RetriesSpent, SourceError
from ..storage.opener import scheme
from .build_options import check_build_options
from .casting import CastSource
from .engines import open_workers
from .fixed_records import build_records, fixed_layout
from .output import (
    clear_child_sets,
    clear_other_indexes,
    clear_planned_shards,
    deleted_note,
    hold_output,
    prepare_output,
    refuse_foreign_shards,
    remove_stale_shards,
    remove_unplanned_shards,
    save_index,
    shard_name,
)
from .part import Part
from .pool_workers import interruptible_task
from .progress import BuildProgress
from .resume import (
    drop_changed_shards,
    finished_index,
    kept_shard,
    leftover_files,
    plan_digest,
    record_plan,
    reference_schema,
    remove_leftovers,
    shard_plan,
)
from .rows import encode_records
from .shard_file import ShardFile
from .shard_sizes import warn_of_shard_sizes
from .source import DEFAULT_SHARD_BYTES, Source, read_rows, resolve_pack
from .unique_keys import ShardKeys, refuse_repeated_keys

_CHUNK_BYTES = 16 << 20
#: About how many bytes one task of a build with workers writes (there are at least 4 tasks a
#: worker): progress moves, and the workers share the last tasks, every few shards of a large
#: build, not in a handful of jumps. A task costs a few milliseconds (its window is sent, its
#: files reopened), nothing next to writing this much.
TASK_BYTES = 256 << 20


@dataclass(frozen=True)
class ShardRun:
    """A task: write consecutive shards ``first_number...`` from a window of the source."""

    window: Source
    destination: Destination
    prefix: str
    first_number: int
    bounds: tuple[int, ...]  # row bounds within the window, one more than shards
    first_index: int  # dataset sample number of the window's row 0
    pack: int
    chunk_rows: int
    keep: Schema | None = None  # resuming: keep a finished shard whose fields conform to this


class ShardResult(NamedTuple):
    """A shard of the build: its index entry, its schema, and whether a finished file was kept."""

    info: ShardInfo
    schema: Schema
    kept: bool = False
    varied: dict[str, str] = {}  # per field whose shape starts to vary in the shard: the sample where
    key_hashes: np.ndarray | None = None  # of the keys the source gave (see unique_keys)


def write_shard(run: ShardRun, i: int, on_rows: Callable[[int], None] | None = None) -> ShardResult:
    """Write shard ``i`` of a run, reading its rows a chunk at a time (bounded memory), telling
    ``on_rows`` each chunk's rows; when resuming, keep the file already there if it holds what the
    plan puts in the shard."""
    name = shard_name(run.prefix, run.first_number + i)
    start, stop = run.bounds[i], run.bounds[i + 1]
    if run.keep is not None:
        kept = kept_shard(run.destination.staging, name, stop - start, run.pack, run.keep)
        if kept is not None:
            return ShardResult(*kept, kept=True)
    schema: Schema | None = None
    varied: dict[str, str] = {}
    keys = ShardKeys(f"{run.window.description} shard {name}")
    with ShardFile(run.destination.staging / name, name) as shard:
        for chunk_start in range(start, stop, run.chunk_rows):
            first = run.first_index + chunk_start
            block = read_rows(run.window, chunk_start, min(chunk_start + run.chunk_rows, stop), first,
                              f"for shard {name}")
            keys.add(block.keys, first)
            schema = merge_schema(schema, block.schema(first, schema, varied), keys.where, error=SampleError)
            layout = fixed_layout(block, run.pack)
            if layout is not None:  # all full records at once, then the generic path for a tail
                records, rows = build_records(block, layout, first, run.pack)
                shard.add_fixed_records(records, run.pack)
                block, first = block.slice(rows, len(block)), first + rows
            for key, parts, rows in encode_records(block, first, run.pack):
                shard.add_record(key, parts, rows)
            if on_rows is not None:
                on_rows(min(chunk_start + run.chunk_rows, stop) - chunk_start)
        info = shard.commit()
    run.destination.publish(name)
    return ShardResult(info, schema or {}, varied={field: f"{note} in {name}" for field, note in varied.items()},
                       key_hashes=keys.hashes())


def write_run(run: ShardRun, on_shard: Callable[[ShardResult], None] | None = None,
              on_rows: Callable[[int], None] | None = None) -> list[ShardResult]:
    """Write every shard of a run; the function each worker executes."""
    results = []
    for i in range(len(run.bounds) - 1):
        results.append(write_shard(run, i, on_rows))
        if on_shard is not None:
            on_shard(results[-1])
    return results


@dataclass
class DataFailure:
    """A run's input that cannot be written (a bad value, a damaged file: the same on every try),
    returned by a worker rather than raised, so that a cluster does not run the task again and
    log its traceback each time."""

    error: FormatError


def write_run_in_worker(run: ShardRun) -> list[ShardResult] | DataFailure:
    """:func:`write_run`, its data errors returned (I/O errors, maybe passing, still raise)."""
    try:
        with interruptible_task():
            return write_run(run)
    except FormatError as exc:
        if isinstance(exc, SourceError):
            where = _cluster_worker()
            if where is None or isinstance(exc, RetriesSpent) or exc.reason is None:
                raise
            # (refused at once, a setting's doing, maybe: a cluster's workers do not share the user's shell)
            raise type(exc)(exc.url, exc.offset, f"{exc.reason} (on {where}, whose environment needs the "
                                                 f"storage's settings and credentials too)") from None
        return DataFailure(exc)


def _cluster_worker() -> str | None:
    """The Dask worker running this task, as an error names it; ``None`` elsewhere."""
    distributed = sys.modules.get("distributed")
    try:
        return None if distributed is None else f"Dask worker {distributed.get_worker().address}"
    except ValueError:  # (not in a worker)
        return None


def chunk_rows_for(source: Source, pack: int) -> int:
    """Rows read at once: about 16 MB, a whole number of records."""
    row_bytes = max(source.approx_row_bytes(), 1)
    return max(pack, (_CHUNK_BYTES // row_bytes) // pack * pack)


def task_count(slots: int, nbytes: int) -> int:
    """How many tasks a build of about ``nbytes`` is cut into for ``slots`` workers."""
    return max(slots * 4, math.ceil(nbytes / TASK_BYTES))


def plan_runs(source: Source, target: Destination, prefix: str, bounds: list[int], numbers: range,
              pack: int, runs: int, keep: Schema | None = None) -> list[ShardRun]:
    """Split the selected shards into at most ``runs`` contiguous tasks."""
    if not numbers:
        return []
    per_run = math.ceil(len(numbers) / max(runs, 1))
    chunk = chunk_rows_for(source, pack)
    tasks = []
    for first in range(numbers.start, numbers.stop, per_run):
        last = min(first + per_run, numbers.stop)
        lo, hi = bounds[first], bounds[last]
        local = tuple(b - lo for b in bounds[first:last + 1])
        tasks.append(ShardRun(source.window(lo, hi), target, prefix, first, local, lo, pack, chunk, keep))
    return tasks


def run_tasks(tasks: list[ShardRun], executor: Executor | None, progress: BuildProgress) -> list[ShardResult]:
    """Execute the runs (here when there is no executor) and return their results in shard
    order; the first failure cancels what has not started and propagates (no index is
    written then)."""
    def report(result: ShardResult) -> None:
        progress.update(result.info.samples, result.info.bytes, kept=result.kept)

    if executor is None:
        return [r for task in tasks for r in write_run(task, report, progress.advance)]
    futures: dict[Future, int] = {}
    try:
        for i, task in enumerate(tasks):
            with held_ctrl_c():  # cut, a submit can leave a pool half-started (see pipeline.interrupts)
                futures[executor.submit(write_run_in_worker, task)] = i
        done: list[list[ShardResult]] = [[] for _ in tasks]
        for future in as_completed(futures):
            outcome = future.result()
            if isinstance(outcome, DataFailure):
                raise outcome.error
            done[futures[future]] = outcome
            for result in done[futures[future]]:
                report(result)
        return [r for results in done for r in results]
    except BrokenProcessPool as exc:
        raise RuntimeError("a build worker process died (its output, if any, is above): in a script, build under "
                           "`if __name__ == \"__main__\":`, since each worker starts by importing the script; a "
                           "Source class of a notebook's or python -c's __main__ cannot be imported by the workers: "
                           "define it in a module, or build with workers=1; else it was killed (out of memory?); no "
                           "index was written") from exc
    finally:
        for future in futures:
            future.cancel()


@overload
def build_shards(source: Source, out_dir: str | os.PathLike[str], prefix: str = ..., *, validation: None = ...,
                 seed: WholeNumber = ..., shard_samples: int | None = ..., shard_bytes: int | None = ...,
                 pack: int | str = ..., dtypes: Mapping[str, str] | None = ..., workers: int = ...,
                 part: Part | None = ..., overwrite: bool = ..., resume: bool = ..., quiet: bool = ...,
                 executor: Executor | None = ..., engine: str = ...,
                 scheduler: str | None = ...) -> DatasetIndex: ...
@overload
def build_shards(source: Source, out_dir: str | os.PathLike[str], prefix: str = ..., *, validation: SplitSize,
                 seed: WholeNumber = ..., shard_samples: int | None = ..., shard_bytes: int | None = ...,
                 pack: int | str = ..., dtypes: Mapping[str, str] | None = ..., workers: int = ...,
                 part: Part | None = ..., overwrite: bool = ..., resume: bool = ..., quiet: bool = ...,
                 executor: Executor | None = ..., engine: str = ...,
                 scheduler: str | None = ...) -> dict[str, DatasetIndex]: ...
def build_shards(
    source: Source,
    out_dir: str | os.PathLike[str],
    prefix: str = "shard",
    *,
    validation: SplitSize | None = None,
    seed: WholeNumber = 0,
    shard_samples: int | None = None,
    shard_bytes: int | None = DEFAULT_SHARD_BYTES,
    pack: int | str = "auto",
    dtypes: Mapping[str, str] | None = None,
    workers: int = 1,
    part: Part | None = None,
    overwrite: bool = False,
    resume: bool = False,
    quiet: bool = False,
    executor: Executor | None = None,
    engine: str = "local",
    scheduler: str | None = None,
) -> DatasetIndex | dict[str, DatasetIndex]:
    """Write ``source`` as shards in ``out_dir`` (a folder or an ``s3://`` prefix) and return
    the index (also saved there); with ``validation`` (a fraction, or a number of rows chosen
    by ``seed``), split into ``out_dir/train`` and ``out_dir/validation``, both indexes returned
    by split name (see :mod:`.splits`).

    ``pack="auto"`` stores samples of fixed shape in records of about 64 KiB (smaller in a set
    under 32 MiB: see :func:`resolve_pack`; one sample per record when a sample is larger, or
    when samples differ in shape); ``dtypes`` (``{"x": "float32"}``) stores fields cast to other
    dtypes (see :mod:`.casting`). With ``part``, only that part's shards are written and a
    partial index (``index.part-I-of-N.json``) is saved; join the parts with ``merge_index_files``.
    ``resume=True`` completes a build that was killed, keeping the shards it finished (a local
    folder only); if its index is already there, nothing is done. The tasks run here, in
    ``workers`` processes, in ``executor``, or on Dask (``engine="dask"``: a cluster of
    ``workers`` local processes, or the one at ``scheduler``).
    """
    options: dict[str, Any] = dict(shard_samples=shard_samples, shard_bytes=shard_bytes, pack=pack, dtypes=dtypes,
                                   workers=workers, part=part, overwrite=overwrite, resume=resume, quiet=quiet,
                                   executor=executor, engine=engine, scheduler=scheduler)
    check_build_options(out_dir, prefix, **options)  # (before anything is written, a split's folder too)
    from .splits import build_splits, check_seed  # (splits build each split with this function: imported on use)

    check_seed(seed)
    if validation is not None:
        if prefix != "shard":
            raise ValueError("a split build names shards after each split (train-000000.tar); a prefix does not apply")
        return build_splits(source, out_dir, validation, seed, **options)
    if seed != 0:  # (the build has no other draw it could seed; a script may pass its seed whether it splits or not)
        warn_caller(f"seed={seed!r} (--seed) chooses the samples validation= (--validation) holds out, and none "
                    f"is given: every sample is written, in the order given (the seed is not used)")
    metadata = dict(source.metadata or {})
    if dtypes:
        source = CastSource(source, dtypes)
    pack = resolve_pack(pack, source)
    target = destination(out_dir)
    progress: BuildProgress | None = None
    try:
        bounds = source.shard_bounds(shard_samples, shard_bytes, pack)
        total = len(bounds) - 1
        numbers = range(total) if part is None else part.shard_range(total)
        index_name = INDEX_NAME if part is None else part_index_name(part.index, part.count)
        every_name = [shard_name(prefix, n) for n in range(total)]  # (all parts')
        names = every_name[numbers.start:numbers.stop]
        if part is None:
            plan, build_plan = shard_plan(source, bounds, numbers, names), None
        else:  # (every part plans the whole build, which merge-index compares: a few hashes a shard)
            whole = shard_plan(source, bounds, range(total), every_name)
            plan, build_plan = {name: whole[name] for name in names}, plan_digest(whole)
        hold_output(target, part is not None)
        resumable = scheme(os.fspath(out_dir)) == "file"  # (a remote build cannot resume: no plan to keep)
        leftovers = leftover_files(target, index_name, overwrite, every_name) if resumable and (overwrite or resume) \
            else {}
        if resume:
            planned = [(name, bounds[n + 1] - bounds[n]) for name, n in zip(names, numbers)]
            done = finished_index(target, index_name, planned, pack, metadata, plan)
            if done is not None:  # a run killed after its index still leaves temporary files
                remove_leftovers(target, names, every_name, index_name, leftovers)
                _say(quiet, f"{target.url(index_name)} is already complete ({len(planned)} shards); nothing to resume")
                return done
        if overwrite and resumable:  # before anything goes: what a kill leaves is then no finished shard of ours
            record_plan(target, index_name, leftovers)  # (hold_output made the folder)
        clear_child_sets(target, overwrite)
        old_shards = prepare_output(target, overwrite, index_name, resumable=resumable)
        replaced = clear_other_indexes(target, index_name, overwrite, resuming=resume)
        if resume:
            refuse_foreign_shards(target, names)
            dropped = drop_changed_shards(target, index_name, plan)
            if dropped:
                _say(quiet, dropped)
        else:
            clear_planned_shards(target, prefix, names, overwrite, resumable=resumable)
        if resumable:
            record_plan(target, index_name, {**leftovers, **plan})
        rows = bounds[numbers.stop] - bounds[numbers.start] if numbers else 0
        progress = BuildProgress(rows, f"{source.description} -> {target}", quiet)
        keep = reference_schema(source, pack) if resume else None
        with open_workers(engine, workers, scheduler, executor) as pool:
            runs = 1 if pool.executor is None else task_count(pool.slots, rows * source.approx_row_bytes())
            tasks = plan_runs(source, target, prefix, bounds, numbers, pack, runs, keep)
            results = run_tasks(tasks, pool.executor, progress)
        refuse_repeated_keys(((result.info.url, result.key_hashes) for result in results), source.description)
        schema = _merged_schema(results, target, progress, source)
        warn_of_shard_sizes([result.info for result in results], shard_bytes, shard_samples, target)
        part_info = None if part is None else PartInfo(part.index, part.count, total, build_plan)
        index = DatasetIndex(schema or {}, [result.info for result in results], pack, part_info, metadata=metadata,
                             plan=plan_digest(plan))
        where = save_index(target, index, index_name)
        deleted = remove_stale_shards(target, old_shards + replaced, every_name)
        deleted += remove_leftovers(target, names, every_name, index_name, leftovers)
        # what a killed run (under other options) wrote beyond this build's shards: not part of the set
        stale = remove_unplanned_shards(target, prefix, names) if (resume or overwrite) and part is None else []
        if stale:
            _say(quiet, f"removed {len(stale)} shards an earlier run wrote beyond this build's ({stale[0]}, ...)")
        progress.close(where, whole=part is None or total == 0, note=deleted_note(deleted))
        return index
    finally:
        if progress is not None:
            progress.abandon()
        target.close()


def _merged_schema(results: list[ShardResult], target: Destination, progress: BuildProgress,
                   source: Source) -> Schema | None:
    """The schema of the shards together; a field whose shape varies is said, naming the first
    sample (or shard) where it does: batches hold it as a list, not a tensor."""
    schema: Schema | None = None
    for result in results:
        if not result.info.samples:
            continue
        merged = merge_schema(schema, result.schema, target.url(result.info.url), error=SampleError)
        for name, spec in merged.items():
            before = (schema or {}).get(name)
            if spec.varies and not (before is not None and before.varies):
                progress.say(f"warning: field {name!r} varies in shape: {_where_varied(result, name, before)}. "
                             f"Batches hold such a field as a list of tensors, one per sample (pad or crop them in a "
                             f"batch_transform); if every sample should have one shape, mend that sample and build "
                             f"again with --overwrite{source.why_shapes_vary(name)}")
        schema = merged
    return schema


def _where_varied(result: ShardResult, name: str, before: FieldSpec | None) -> str:
    """The sample of ``result``'s shard where field ``name`` starts to vary, else the shard."""
    if name in result.varied:
        return result.varied[name]
    earlier = "" if before is None else f", the shards before it {list(before.shape or ())}"
    return f"{result.info.url} holds shape {list(result.schema[name].shape or ())}{earlier}"


def _say(quiet: bool, line: str) -> None:
    if not quiet:
        print(line, file=sys.stderr)
