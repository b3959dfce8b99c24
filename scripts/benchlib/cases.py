"""The cases of the benchmark, each run in a fresh process while this one samples the memory of
its process tree: throughput per shape and reader, shuffle quality, and memory on a large set."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .common import (
    CAT,
    JOBLIB,
    LABEL_BYTES,
    MB,
    MEMMAP,
    MEMORY_ALLOWANCE_MB,
    MEMORY_DIM,
    MEMORY_PACK,
    MEMORY_WORKERS,
    OURS,
    PT,
    ROOT,
    SHUFFLE_CLASSES,
    WDS,
    WDS_SHUFFLE,
    Config,
    Shape,
    TreeMemory,
    log,
    shapes_of,
)
from .data import Layouts, permutation_stats, prepare_shape, prepare_sorted, write_memory_shards
from .runs import warm_page_cache


def run_child(spec: dict[str, Any], pss: bool = False) -> dict[str, Any]:
    """Run one case in a fresh process while sampling its process tree's memory."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "bench.py"), "--child", json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    monitor = TreeMemory(proc.pid, pss)
    monitor.start()
    out, err = proc.communicate()
    monitor.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"case {spec['kind']} failed (exit {proc.returncode}):\n{err[-4000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_mb"] = monitor.peak_rss / MB
    result["peak_pss_mb"] = monitor.peak_pss / MB if pss else None
    result["processes"] = monitor.peak_processes
    result["rss_timeline"] = monitor.timeline
    result["loadavg_1m"] = os.getloadavg()[0]  # high when something else ran meanwhile
    return result


def thin_timeline(timeline: list[tuple[float, float]], start: float, points: int = 200) -> list[tuple[float, float]]:
    """At most ``points`` samples of a timeline, times in seconds from ``start``."""
    step = max(1, len(timeline) // points)
    return [(round(t - start, 3), rss) for t, rss in timeline[::step]]


@dataclass
class Row:
    """One measured reader on one shape with one number of workers."""

    shape: str
    loader: str
    workers: int | None
    samples: int
    seconds: float
    payload_bytes: int
    first_batch_s: float | None = None
    peak_rss_mb: float | None = None
    epoch_seconds: list[float] = field(default_factory=list)
    note: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.samples * self.payload_bytes / self.seconds / MB

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_s": self.samples_per_s, "mb_per_s": self.mb_per_s}


def loader_row(shape: Shape, name: str, workers: int, spec: dict[str, Any], expected: int, note: str = "") -> Row:
    result = run_child({**spec, "workers": workers})
    epochs = result["epochs"]
    best = min(epochs, key=lambda e: e["seconds"])
    counts = {e["samples"] for e in epochs}
    if counts != {expected}:
        note = (note + "; " if note else "") + f"delivered {sorted(counts)} samples, expected {expected}"
    row = Row(shape.name, name, workers, best["samples"], best["seconds"], shape.payload_bytes,
              epochs[0]["first_batch_s"], result["peak_rss_mb"], [e["seconds"] for e in epochs], note,
              {**result["info"], "loadavg_1m": result["loadavg_1m"]})
    log(f"  {name:16s} workers={workers}: {row.samples_per_s:>12,.0f} samples/s  {row.mb_per_s:8.1f} MB/s  "
        f"first batch {row.first_batch_s:.2f} s  peak RSS {row.peak_rss_mb:.0f} MB")
    return row


def cat_row(shape: Shape, where: Layouts, epochs: int) -> Row:
    files = where.our_shards()
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    shard_bytes = sum(os.path.getsize(f) for f in files)
    row = Row(shape.name, CAT, None, shape.rows, min(times), shape.payload_bytes, epoch_seconds=times,
              note=f"our shards, {shard_bytes / MB / min(times):,.0f} MB/s of shard bytes",
              info={"shard_bytes": shard_bytes})
    log(f"  {CAT:16s}          : {row.samples_per_s:>12,.0f} samples/s  {row.mb_per_s:8.1f} MB/s")
    return row


def shape_rows(cfg: Config, shape: Shape, where: Layouts) -> list[Row]:
    """Every reader on one shape, with each number of workers."""
    base = {"epochs": cfg.epochs}
    rows = [cat_row(shape, where, cfg.epochs)]
    pt_rows = min(cfg.pt_rows, shape.rows)
    for workers in cfg.workers:
        rows.append(loader_row(shape, OURS, workers, {**base, "kind": "ours", "data": str(where.ours)}, shape.rows,
                               f"pack={shape.pack}"))
        rows.append(loader_row(shape, WDS, workers, {**base, "kind": "webdataset", "data": where.wds_urls()},
                               shape.rows))
        rows.append(loader_row(shape, MEMMAP, workers,
                               {**base, "kind": "memmap", "data": [str(where.x_npy), str(where.y_npy)]}, shape.rows))
        if not cfg.skip_slow:
            rows.append(loader_row(shape, JOBLIB, workers, {**base, "kind": "joblib", "data": str(where.joblib)},
                                   shape.rows, "shuffles batch files, not samples"))
            rows.append(loader_row(shape, PT, workers, {**base, "kind": "pt", "data": str(where.pt)}, pt_rows,
                                   f"first {pt_rows:,} samples only" if pt_rows < shape.rows else ""))
    return rows


def run_shapes(cfg: Config, work: Path) -> list[Row]:
    rows: list[Row] = []
    for seed, shape in enumerate(shapes_of(cfg), start=1):
        where = Layouts(work / shape.name)
        prepare_shape(cfg, shape, where, seed)
        rows += shape_rows(cfg, shape, where)
        shutil.rmtree(where.folder)
    return rows


def run_shuffle(cfg: Config, work: Path) -> list[dict[str, Any]]:
    where = Layouts(work / "sorted")
    log(f"[shuffle] {SHUFFLE_CLASSES} classes x {cfg.shuffle_per_class:,} samples, one class per shard...")
    prepare_sorted(cfg, where)
    samples = SHUFFLE_CLASSES * cfg.shuffle_per_class
    cases = [(f"{OURS} (default buffer)", {"kind": "ours", "data": str(where.ours)}),
             (f"{OURS} (shuffle_buffer={WDS_SHUFFLE})",
              {"kind": "ours", "data": str(where.ours), "shuffle_buffer": WDS_SHUFFLE}),
             (f"{WDS} (.shuffle({WDS_SHUFFLE}))", {"kind": "webdataset", "data": where.wds_urls()})]
    rows = []
    for workers in cfg.workers:
        for name, spec in cases:
            result = run_child({**spec, "workers": workers, "epochs": 1, "labels": True})
            stats = {"loader": name, "workers": workers, **result["label_stats"],
                     "shuffle_buffer": result["info"].get("shuffle_buffer", WDS_SHUFFLE),
                     "shuffled_together": result["info"].get("unit_samples", WDS_SHUFFLE)}
            rows.append(stats)
            log(f"  {name:34s} workers={workers}: {stats['distinct_mean']:.2f} classes/batch, "
                f"{stats['entropy_mean_bits']:.2f} bits")
    rows.append({"loader": "full random permutation", "workers": None, **permutation_stats(samples, cfg.shuffle_per_class),
                 "shuffle_buffer": samples, "shuffled_together": samples})
    shutil.rmtree(where.folder)
    return rows


def halves_peak(timeline: list[tuple[float, float]], epoch: dict[str, Any]) -> dict[str, float]:
    """Peak RSS in the first and in the second half of an epoch: bounded memory shows as
    equal peaks, memory that grows with the data read as a higher second one."""
    middle = (epoch["wall_start"] + epoch["wall_end"]) / 2
    first = [rss for t, rss in timeline if epoch["wall_start"] <= t <= middle]
    second = [rss for t, rss in timeline if middle < t <= epoch["wall_end"]]
    return {"peak_rss_first_half_mb": max(first, default=0.0), "peak_rss_second_half_mb": max(second, default=0.0)}


def run_memory(cfg: Config, work: Path) -> dict[str, Any]:
    out = work / "memory"
    payload = cfg.memory_rows * (MEMORY_DIM * 4 + LABEL_BYTES)
    log(f"[memory] writing {cfg.memory_rows:,} x {MEMORY_DIM} float32 ({payload / 1e9:.2f} GB) with pack={MEMORY_PACK}...")
    shard_bytes = write_memory_shards(out, cfg.memory_rows)
    warm_page_cache(out)
    floor = run_child({"kind": "floor", "workers": MEMORY_WORKERS, "epochs": 1}, pss=True)
    streamed = run_child({"kind": "ours", "workers": MEMORY_WORKERS, "epochs": 1, "data": str(out)}, pss=True)
    shutil.rmtree(out)
    info = streamed["info"]
    buffer_mb = info["shuffle_buffer"] * info["sample_bytes"] / MB
    epoch = streamed["epochs"][0]
    result = {
        "samples": cfg.memory_rows, "shard_gb": shard_bytes / 1e9, "payload_gb": payload / 1e9,
        "workers": MEMORY_WORKERS, "pack": MEMORY_PACK, "seconds": epoch["seconds"],
        "delivered": epoch["samples"], "shuffle_buffer": info["shuffle_buffer"], "sample_bytes": info["sample_bytes"],
        "buffer_per_worker_mb": buffer_mb, "budget_mb": MEMORY_WORKERS * buffer_mb + MEMORY_ALLOWANCE_MB,
        "peak_rss_mb": streamed["peak_rss_mb"], "peak_pss_mb": streamed["peak_pss_mb"],
        "floor_rss_mb": floor["peak_rss_mb"], "floor_pss_mb": floor["peak_pss_mb"],
        "processes": streamed["processes"], **halves_peak(streamed["rss_timeline"], epoch),
        "rss_timeline_mb": thin_timeline(streamed["rss_timeline"], epoch["wall_start"]),
    }
    log(f"  peak RSS {result['peak_rss_mb']:.0f} MB (PSS {result['peak_pss_mb']:.0f} MB), buffer "
        f"{MEMORY_WORKERS} x {buffer_mb:.0f} MB, floor RSS {result['floor_rss_mb']:.0f} MB")
    return result
