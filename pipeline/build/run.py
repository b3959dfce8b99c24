"""Planned builds: cut a source into shards up front, write them in parallel, index them last.

The plan (which rows go to which shard) depends only on the source and the limits, so a
build with ``workers=4``, a build split into ``--part i/N`` runs on N machines, and a plain
single-process build all produce the same shards. Work goes through a
``concurrent.futures.Executor``: a local process pool by default, any compatible executor
(e.g. a cluster's) when given.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable

from ..format.index import INDEX_NAME, DatasetIndex, PartInfo, Schema, ShardInfo, merge_schema, part_index_name
from ..storage.destination import Destination, destination
from .fixed_records import build_records, fixed_layout
from .output import prepare_output, remove_stale_shards, save_index, shard_name
from .progress import BuildProgress
from .rows import encode_records
from .shard_file import ShardFile
from .source import DEFAULT_SHARD_BYTES, Source

_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True)
class Part:
    """Part ``index`` of ``count`` of a build split across machines (``--part index/count``)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> "Part":
        try:
            index, count = (int(v) for v in text.split("/"))
        except ValueError:
            raise ValueError(f"--part takes I/N (e.g. 0/4), got {text!r}") from None
        if not 0 <= index < count:
            raise ValueError(f"part {text!r}: need 0 <= I < N")
        return cls(index, count)

    def shard_range(self, total: int) -> range:
        """The contiguous block of the ``total`` planned shards that this part writes."""
        return range(total * self.index // self.count, total * (self.index + 1) // self.count)


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


def write_shard(run: ShardRun, i: int) -> tuple[ShardInfo, Schema]:
    """Write shard ``i`` of a run, reading its rows a chunk at a time (bounded memory)."""
    name = shard_name(run.prefix, run.first_number + i)
    start, stop = run.bounds[i], run.bounds[i + 1]
    schema: Schema | None = None
    with ShardFile(run.destination.staging / name, name) as shard:
        for chunk_start in range(start, stop, run.chunk_rows):
            block = run.window.read(chunk_start, min(chunk_start + run.chunk_rows, stop))
            schema = merge_schema(schema, block.schema(), f"{run.window.description} shard {name}")
            first = run.first_index + chunk_start
            layout = fixed_layout(block, run.pack)
            if layout is not None:  # all full records at once, then the generic path for a tail
                records, rows = build_records(block, layout, first, run.pack)
                shard.add_fixed_records(records, run.pack)
                block, first = block.slice(rows, len(block)), first + rows
            for key, parts, rows in encode_records(block, first, run.pack):
                shard.add_record(key, parts, rows)
        info = shard.commit()
    run.destination.publish(name)
    return info, schema or {}


def write_run(run: ShardRun, on_shard: Callable[[ShardInfo], None] | None = None) -> list[tuple[ShardInfo, Schema]]:
    """Write every shard of a run; the function each worker executes."""
    results = []
    for i in range(len(run.bounds) - 1):
        results.append(write_shard(run, i))
        if on_shard is not None:
            on_shard(results[-1][0])
    return results


def chunk_rows_for(source: Source, pack: int) -> int:
    """Rows read at once: about 16 MB, a whole number of records."""
    row_bytes = max(source.approx_row_bytes(), 1)
    return max(pack, (_CHUNK_BYTES // row_bytes) // pack * pack)


def plan_runs(source: Source, target: Destination, prefix: str, bounds: list[int], numbers: range,
              pack: int, runs: int) -> list[ShardRun]:
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
        tasks.append(ShardRun(source.window(lo, hi), target, prefix, first, local, lo, pack, chunk))
    return tasks


def _default_executor(workers: int) -> Executor:
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def run_tasks(tasks: list[ShardRun], workers: int, executor: Executor | None,
              progress: BuildProgress) -> list[tuple[ShardInfo, Schema]]:
    """Execute the runs and return their results in shard order; the first failure cancels
    what has not started and propagates (no index is written then)."""
    def report(info: ShardInfo) -> None:
        progress.update(info.samples, info.bytes)

    if executor is None and workers <= 1:
        return [r for task in tasks for r in write_run(task, report)]
    pool = _default_executor(workers) if executor is None else executor
    futures: dict[Future, int] = {}
    try:
        futures = {pool.submit(write_run, task): i for i, task in enumerate(tasks)}
        done: list[list[tuple[ShardInfo, Schema]]] = [[] for _ in tasks]
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            for info, _ in done[futures[future]]:
                report(info)
        return [r for results in done for r in results]
    finally:
        for future in futures:
            future.cancel()
        if executor is None:
            pool.shutdown(wait=True, cancel_futures=True)


def build_shards(
    source: Source,
    out_dir: str | os.PathLike[str],
    prefix: str = "shard",
    *,
    shard_samples: int | None = None,
    shard_bytes: int | None = DEFAULT_SHARD_BYTES,
    pack: int = 1,
    workers: int = 1,
    part: Part | None = None,
    overwrite: bool = False,
    quiet: bool = False,
    executor: Executor | None = None,
) -> DatasetIndex:
    """Write ``source`` as shards in ``out_dir`` (a folder or an ``s3://`` prefix) and return
    the index (also saved there).

    With ``part``, only that part's shards are written and a partial index
    (``index.part-I-of-N.json``) is saved; join the parts with ``merge_index_files``.
    """
    if pack < 1:
        raise ValueError(f"pack must be >= 1, got {pack}")
    if shard_samples is not None and shard_samples < 1:
        raise ValueError(f"shard_samples must be >= 1, got {shard_samples}")
    target = destination(out_dir)
    try:
        bounds = source.shard_bounds(shard_samples, shard_bytes, pack)
        total = len(bounds) - 1
        numbers = range(total) if part is None else part.shard_range(total)
        index_name = INDEX_NAME if part is None else part_index_name(part.index, part.count)
        old_shards = prepare_output(target, overwrite, index_name)
        rows = bounds[numbers.stop] - bounds[numbers.start] if numbers else 0
        progress = BuildProgress(rows, f"{source.description} -> {target}", quiet)
        tasks = plan_runs(source, target, prefix, bounds, numbers, pack, runs=1 if workers <= 1 else workers * 4)
        results = run_tasks(tasks, workers, executor, progress)
        schema: Schema | None = None
        for info, shard_schema in results:
            if info.samples:
                schema = merge_schema(schema, shard_schema, target.url(info.url))
        part_info = None if part is None else PartInfo(part.index, part.count, total)
        index = DatasetIndex(schema or {}, [info for info, _ in results], pack, part_info)
        where = save_index(target, index, index_name)
        remove_stale_shards(target, old_shards, index)
        progress.close(where)
        return index
    finally:
        target.close()
