"""The targets a run is judged by, its tables, its chart, and the JSON it saves."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .cases import Row
from .common import (
    BATCH,
    CAT,
    JOBLIB,
    MEMMAP,
    MEMORY_ALLOWANCE_MB,
    MEMORY_DIM,
    OURS,
    PT,
    SHUFFLE_CLASSES,
    WDS,
    Config,
    Target,
    fmt,
    log,
    markdown_table,
    targets_table,
)
from .library import environment

SPEEDUP_GOALS = {2: {"tabular": 20.0, "embeddings": 15.0, "images": 1.7},
                 0: {"tabular": 100.0, "embeddings": 50.0, "images": 5.0}}
#: This loader against the memmap gather: 90%, and 1.2x for large samples (the gather copies each
#: twice, into its batch and into shared memory; this loader once, from the page cache to the batch).
MEMMAP_GOALS = {2: {"tabular": 0.9, "embeddings": 0.9, "images": 1.2}}


def find(rows: list[Row], shape: str, loader: str, workers: int | None) -> Row | None:
    return next((r for r in rows if (r.shape, r.loader, r.workers) == (shape, loader, workers)), None)


def ratio(rows: list[Row], row: Row, baseline: str) -> float | None:
    base = find(rows, row.shape, baseline, row.workers if baseline != CAT else None)
    return row.samples_per_s / base.samples_per_s if base else None


def throughput_targets(rows: list[Row]) -> list[Target]:
    out = []
    for workers, goals in SPEEDUP_GOALS.items():
        for shape, goal in goals.items():
            ours = find(rows, shape, OURS, workers)
            if ours is None or find(rows, shape, WDS, workers) is None:
                continue
            value = ratio(rows, ours, WDS)
            out.append(Target(f"{shape}, {workers} workers: this loader / webdataset", value, f">= {goal:g}x",
                              value >= goal))
        for shape, goal in MEMMAP_GOALS.get(workers, {}).items():
            ours = find(rows, shape, OURS, workers)
            if ours is None or find(rows, shape, MEMMAP, workers) is None:
                continue
            value = ratio(rows, ours, MEMMAP)
            out.append(Target(f"{shape}, {workers} workers: this loader / memmap gather", value, f">= {goal:.0%}",
                              value >= goal))
    return out


def memory_targets(memory: dict[str, Any] | None) -> list[Target]:
    if memory is None:
        return []
    budget = memory["budget_mb"]
    goal = f"<= {budget:.0f} (buffer + {MEMORY_ALLOWANCE_MB})"
    measures = [
        (f"memory: peak RSS of the process tree (MB), {memory['payload_gb']:.1f} GB streamed", memory["peak_rss_mb"]),
        ("memory: peak PSS of the process tree (MB)", memory["peak_pss_mb"]),
        ("memory: peak RSS above the floor (torch + 2 idle workers) (MB)",
         memory["peak_rss_mb"] - memory["floor_rss_mb"]),
        ("memory: peak PSS above the floor (MB)", memory["peak_pss_mb"] - memory["floor_pss_mb"]),
    ]
    return [Target(name, value, goal, value <= budget) for name, value in measures]


def throughput_table(rows: list[Row]) -> str:
    header = ["shape", "loader", "workers", "samples", "samples/s", "MB/s", "vs webdataset", "vs memmap",
              "peak RSS (MB)", "first batch (s)", "note"]
    lines = []
    for r in rows:
        lines.append([r.shape, r.loader, fmt(r.workers, "d"), f"{r.samples:,}", f"{r.samples_per_s:,.0f}",
                      f"{r.mb_per_s:,.1f}", fmt(ratio(rows, r, WDS) if r.workers is not None else None, ".2f", "x"),
                      fmt(ratio(rows, r, MEMMAP) if r.workers is not None else None, ".2f", "x"),
                      fmt(r.peak_rss_mb, ".0f"), fmt(r.first_batch_s, ".2f"), r.note])
    return markdown_table(header, lines)


def shuffle_table(rows: list[dict[str, Any]]) -> str:
    """The shuffle case's rows; "shuffled together": the samples a unit holds for this loader
    (the plan's, which may be fewer than its buffer), webdataset's shuffle buffer, the dataset
    for a permutation."""
    header = ["loader", "workers", "shuffled together (samples)", "batches", "distinct classes / batch (mean)",
              "(min)", "label entropy / batch (bits)"]
    return markdown_table(header, [[r["loader"], fmt(r["workers"], "d"), fmt(r["shuffled_together"], ",d"),
                                    str(r["batches"]), f"{r['distinct_mean']:.2f}", str(r["distinct_min"]),
                                    f"{r['entropy_mean_bits']:.2f}"] for r in rows])


def memory_table(m: dict[str, Any]) -> str:
    header = ["dataset", "workers", "seconds", "shuffle_buffer", "bytes/sample", "buffer/worker (MB)",
              "budget (MB)", "peak RSS (MB)", "peak RSS 1st / 2nd half (MB)", "peak PSS (MB)",
              "floor RSS / PSS (MB)"]
    return markdown_table(header, [[
        f"{m['samples']:,} x {MEMORY_DIM} float32, {m['shard_gb']:.2f} GB of shards, pack={m['pack']}",
        str(m["workers"]), f"{m['seconds']:.1f}", f"{m['shuffle_buffer']:,}", f"{m['sample_bytes']:,}",
        f"{m['buffer_per_worker_mb']:.0f}", f"{m['budget_mb']:.0f}", f"{m['peak_rss_mb']:.0f}",
        f"{m['peak_rss_first_half_mb']:.0f} / {m['peak_rss_second_half_mb']:.0f}",
        f"{m['peak_pss_mb']:.0f}", f"{m['floor_rss_mb']:.0f} / {m['floor_pss_mb']:.0f}"]])


def save_chart(rows: list[Row], path: Path) -> bool:
    """Samples/s per loader per shape, one panel per number of workers, log scale."""
    try:
        import matplotlib
    except ImportError:
        log("matplotlib is not installed: no chart (pip install matplotlib)")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = sorted({r.workers for r in rows if r.workers is not None})
    shapes = list(dict.fromkeys(r.shape for r in rows))
    loaders = [name for name in (OURS, WDS, JOBLIB, PT, MEMMAP, CAT) if any(r.loader == name for r in rows)]
    fig, axes = plt.subplots(1, len(workers), figsize=(6 * len(workers), 4.5), sharey=True, squeeze=False)
    width = 0.8 / len(loaders)
    for ax, w in zip(axes[0], workers):
        for k, name in enumerate(loaders):
            values = [find(rows, s, name, None if name == CAT else w) for s in shapes]
            heights = [r.samples_per_s if r else 0 for r in values]
            ax.bar(np.arange(len(shapes)) + (k - (len(loaders) - 1) / 2) * width, heights, width, label=name)
        ax.set_xticks(np.arange(len(shapes)), shapes)
        ax.set_yscale("log")
        ax.set_title(f"num_workers={w}, batch size {BATCH}")
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0][0].set_ylabel("samples/s (log scale)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def save_results(cfg: Config, rows: list[Row], shuffle: list[dict[str, Any]], memory: dict[str, Any] | None,
                 targets: list[Target], revision: str) -> Path:
    cfg.out.mkdir(parents=True, exist_ok=True)
    path = cfg.out / "bench.json"
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    payload = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "config": config,
               "environment": environment(revision), "throughput": [r.summary() for r in rows], "shuffle": shuffle,
               "memory": memory, "targets": [t.row() for t in targets]}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def report(cfg: Config, rows: list[Row], shuffle: list[dict[str, Any]], memory: dict[str, Any] | None,
           revision: str) -> None:
    targets = throughput_targets(rows) + memory_targets(memory)
    if rows:
        print(f"\n### Throughput (batch size {BATCH}; best of {cfg.epochs} epochs; MB/s of payload, 1 MB = 1e6 B; "
              f"first batch: epoch 1, worker start-up included)\n")
        print(throughput_table(rows))
    if shuffle:
        print(f"\n### Shuffle quality ({SHUFFLE_CLASSES} classes sorted by class, one class per shard; "
              f"ideal {SHUFFLE_CLASSES} classes, {np.log2(SHUFFLE_CLASSES):.2f} bits)\n")
        print(shuffle_table(shuffle))
    if memory:
        print("\n### Memory (budget: shuffle buffer per worker x workers + "
              f"{MEMORY_ALLOWANCE_MB} MB)\n")
        print(memory_table(memory))
    if targets:
        print("\n### Targets\n")
        print(targets_table(targets))
    print(f"\nlibrary benchmarked: pipeline at {revision}")
    print(f"written to {save_results(cfg, rows, shuffle, memory, targets, revision)}")
    if rows and save_chart(rows, cfg.out / "bench.png"):
        print(f"chart in {cfg.out / 'bench.png'}")
