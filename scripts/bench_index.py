#!/usr/bin/env python
"""Benchmark of opening a very large shard set: 10^6, 10^8 and 10^9 samples.

Only the index is written (``index.json`` and its binary shard table); no shard exists.
Every sample is its own record (``pack=1``, the worst case: one offset per sample) of 4 KiB,
in shards of 1,000 samples, so 10^9 samples are 10^6 shards and 10^9 record offsets.

For each size a fresh process (this script with ``--child``) measures:

- ``open``: ``ShardDataset(index, world_size=64, rank=0)``: reading the index and the per-shard
  table, and cutting the shards into the chunks of the epoch plan. Time, and the RSS it added
  on top of the process after ``import torch, pipeline``.
- ``first window``: what DataLoader worker 0 of 8 on that rank then does before its first
  read: the epoch's chunk order, its plan, and the offsets of every chunk of its first
  shuffle window. Time, RSS added, and the record offsets and checksums of how many shards
  (and bytes) it touched.

The same for a mix of three sources totalling each size (``MIX``): opening reads three indexes;
the first window also lays out the epoch's pieces of all sources (its *material*).

Baseline in the same run: the index format this replaces, one JSON with every record offset
inline, parsed with ``json.loads`` at 10^6 samples (larger sizes would not fit in memory).

Usage::

    python scripts/bench_index.py --quick       # 10^5 and 10^6 samples, seconds
    python scripts/bench_index.py               # 10^6, 10^8, 10^9: ~5 GB in --tmp, minutes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from benchlib.common import ROOT, existing_folder
from benchlib.runs import current_rss_mb, folder_bytes, peak_rss_mb

SAMPLES_PER_SHARD = 1000
RECORD_BYTES = 4096
WORLD, WORKERS = 64, 8
#: The mix: three sources holding 70%, 20% and 10% of the samples, mixed 0.5 / 0.3 / 0.2 (the
#: first subsampled, the others repeated).
MIX = {"web": 0.5, "code": 0.3, "books": 0.2}
MIX_SIZES = {"web": 0.7, "code": 0.2, "books": 0.1}


class SyntheticChecksums:
    """Record checksums made up from record numbers (the table is written, never checked)."""

    def read(self, start: int, stop: int) -> np.ndarray:
        return (np.arange(start, stop, dtype=np.uint64) * 2654435761) & 0xFFFFFFFF


class FixedRecordOffsets:
    """Offsets of fixed-size records, computed block by block (nothing of size N in memory)."""

    def __init__(self, first_record: np.ndarray) -> None:
        self.first_record = first_record

    def read(self, start: int, stop: int) -> np.ndarray:
        records = np.arange(start, stop, dtype=np.int64)
        shard = np.searchsorted(self.first_record, records, side="right") - 1
        return (records - self.first_record[shard]) * RECORD_BYTES


def write_synthetic_index(folder: Path, samples: int) -> float:
    """An index of ``samples`` samples (no shards); returns seconds taken."""
    from pipeline.format.index import DatasetIndex, FieldSpec
    from pipeline.format.shard_names import NameRun, ShardNames
    from pipeline.format.shard_table import ShardTable
    from pipeline.storage.destination import Destination
    from pipeline.write.output import save_index

    started = time.perf_counter()
    shards = -(-samples // SAMPLES_PER_SHARD)
    counts = np.full(shards, SAMPLES_PER_SHARD, np.int64)
    counts[-1] = samples - SAMPLES_PER_SHARD * (shards - 1)
    first = np.concatenate([[0], np.cumsum(counts)])
    sha = np.random.default_rng(0).integers(0, 256, (shards, 32), dtype=np.uint8)
    names = ShardNames([NameRun("train-", 0, 7, ".tar", shards)])
    table = ShardTable(names, counts, counts, counts * RECORD_BYTES + 1024, sha, FixedRecordOffsets(first),
                       SyntheticChecksums())
    fields = {"x": FieldSpec("float32", (1000,)), "y": FieldSpec("int64", ())}
    folder.mkdir(parents=True, exist_ok=True)
    save_index(Destination(folder), DatasetIndex(fields, table, pack=1))
    return time.perf_counter() - started


def write_inline_json(path: Path, samples: int) -> None:
    """The replaced layout: one JSON object per shard with every record offset inline."""
    shards = []
    for number in range(-(-samples // SAMPLES_PER_SHARD)):
        count = min(SAMPLES_PER_SHARD, samples - number * SAMPLES_PER_SHARD)
        shards.append({"url": f"train-{number:07d}.tar", "samples": count, "records": count,
                       "bytes": count * RECORD_BYTES + 1024, "sha256": "ab" * 32,
                       "offsets": list(range(0, count * RECORD_BYTES, RECORD_BYTES))})
    path.write_text(json.dumps({"shards": shards}, separators=(",", ":")))


def child(args: argparse.Namespace) -> dict:
    """One measurement in this (fresh) process."""
    import torch  # noqa: F401 - loaded first, so that the numbers exclude it

    import pipeline
    from pipeline.stream.material import locate
    from pipeline.stream.plan import Leg, block_range, leg_sequences, worker_reads

    base = current_rss_mb()
    if args.child == "inline-json":
        started = time.perf_counter()
        data = json.loads(Path(args.path).read_bytes())
        seconds = time.perf_counter() - started
        return {"open_s": seconds, "open_rss_mb": current_rss_mb() - base, "shards": len(data["shards"])}
    started = time.perf_counter()
    if args.child == "mix":  # the three sources of MIX, by weight
        source = {name: str(Path(args.path) / name) for name in MIX}
        dataset = pipeline.ShardDataset(source, weights=MIX, batch_size=256, world_size=WORLD, rank=0)
    else:
        dataset = pipeline.ShardDataset(args.path, batch_size=256, world_size=WORLD, rank=0)
    open_s = time.perf_counter() - started
    open_rss = current_rss_mb() - base
    started = time.perf_counter()
    sources = dataset.sources
    material = sources.material(dataset.seed, 0, dataset.shuffle)
    legs = [Leg(WORLD, 0)]
    sequences = leg_sequences(dataset.samples, dataset.plan_config, legs)
    _, blocks = next(worker_reads(sequences, legs, dataset.plan_config, 0, 0, 0, WORKERS))
    touched: dict[tuple[int, int], int] = {}
    for block in np.unique(blocks).tolist():
        for s, shard, row_start, row_stop in locate(material, sources.chunks, *block_range(block, sequences[0])):
            info = sources.shards[s].shards[shard]  # what read_rows looks up
            touched[s, shard] = info.offsets.nbytes + info.checksum.nbytes
            int(info.offsets[row_start]), int(info.checksum[row_stop - 1])
    return {"open_s": open_s, "open_rss_mb": open_rss, "shards": sum(len(s.shards) for s in sources.shards),
            "chunks": sum(len(c) for c in sources.chunks), "pieces": len(material),
            "window_s": time.perf_counter() - started, "window_rss_mb": current_rss_mb() - base - open_rss,
            "window_offset_bytes": sum(touched.values()), "window_shards": len(touched),
            "peak_rss_mb": peak_rss_mb(), "base_rss_mb": base}


def run_child(kind: str, path: Path) -> dict:
    output = subprocess.run([sys.executable, __file__, "--child", kind, "--path", str(path)],
                            check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10^5 and 10^6 samples only")
    parser.add_argument("--tmp", type=existing_folder, help="folder for the synthetic indexes (default: the system "
                                                           "temp dir)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results",
                        help="folder for bench_index.json (default: bench-results/ in the checkout)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    sizes = [10**5, 10**6] if args.quick else [10**6, 10**8, 10**9]
    root = Path(tempfile.mkdtemp(prefix="bench-index-", dir=args.tmp))
    rows = []
    try:
        inline = root / "inline.json"
        write_inline_json(inline, 10**6)
        baseline = run_child("inline-json", inline)
        print(f"| inline JSON (replaced layout) | 10^6 | {inline.stat().st_size / 1e6:,.0f} MB | "
              f"{baseline['open_s']:.2f} s | {baseline['open_rss_mb']:.0f} MB | | | |", flush=True)
        inline.unlink()
        print("| index | samples | on disk | open | open RSS | first window | window RSS | offsets read |")
        for samples in sizes:
            for kind in ("table", "mix"):
                folder = root / f"n{samples}"
                if kind == "mix":
                    write_s = sum(write_synthetic_index(folder / name, int(samples * share))
                                  for name, share in MIX_SIZES.items())
                else:
                    write_s = write_synthetic_index(folder, samples)
                on_disk = folder_bytes(folder)
                result = run_child(kind, folder) | {"kind": kind, "samples": samples, "write_s": write_s,
                                                    "bytes": on_disk}
                rows.append(result)
                print(f"| {kind} | 10^{len(str(samples)) - 1} | {on_disk / 1e6:,.0f} MB | {result['open_s']:.2f} s | "
                      f"{result['open_rss_mb']:.0f} MB | {result['window_s']:.3f} s | "
                      f"{result['window_rss_mb']:.0f} MB | {result['window_shards']} shards, "
                      f"{result['window_offset_bytes'] / 1e3:,.0f} kB |", flush=True)
                shutil.rmtree(folder)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_index.json").write_text(json.dumps({"inline_json": baseline, "tables": rows}, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
