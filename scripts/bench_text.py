#!/usr/bin/env python
"""Benchmark of a text field beside arrays: what a string per sample (a file name, an ID, a
caption) costs an epoch, against the same samples without it.

Two shard sets of the same samples, ``x`` (float32[8]) and ``y`` (int64), one of them with a
``name`` string of about 20 characters per sample as well (an array build's string column), are
read through ``pipeline.make_loader`` (batches of 256) with 0 and 2 workers. Each epoch runs in a
fresh process (this script with ``--child``), the two sets alternating, and the best of
``--epochs`` is reported: samples/s of each, the ratio text / without, and the peak RSS of the
main process and of the largest worker. Where the ratio goes is a worker's and the training
process's work per string (decoding it, gathering it, handing it over); the bytes are few.

Usage (results also go to ``bench-results/bench_text.json``)::

    python scripts/bench_text.py --quick   # 20k samples: seconds
    python scripts/bench_text.py           # 1M samples: about a minute
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from benchlib.common import ROOT, existing_folder
from benchlib.runs import peak_rss_mb, workers_peak_rss_mb

BATCH = 256
SETS = ("without", "text")


def write_sets(folder: Path, samples: int) -> dict[str, str]:
    """The same samples twice, the second set with a ``name`` string each."""
    import pipeline

    rng = np.random.default_rng(0)
    arrays = {"x": rng.random((samples, 8), dtype=np.float32), "y": np.arange(samples)}
    names = np.array([f"images/{i:09d}.jpg" for i in range(samples)])
    pipeline.write_shards(folder / "without", arrays, quiet=True)
    pipeline.write_shards(folder / "text", {**arrays, "name": names}, quiet=True)
    return {name: str(folder / name) for name in SETS}


def child(path: str, workers: int, samples: int) -> dict:
    """One epoch over ``path`` in this process, after one that starts the workers."""
    import pipeline

    loader = pipeline.make_loader(path, num_workers=workers, batch_size=BATCH, seed=0)
    for _ in loader:  # the workers start, the page cache holds the shards
        pass
    started = time.perf_counter()
    seen = sum(len(batch["y"]) for batch in loader)
    seconds = time.perf_counter() - started
    if seen != samples:
        raise RuntimeError(f"{path}: {seen} samples in an epoch, expected {samples}")
    del loader  # its persistent workers exit and are waited for: RUSAGE_CHILDREN then counts them
    gc.collect()
    return {"samples_per_s": samples / seconds, "peak_rss_mb": peak_rss_mb(),
            "worker_peak_rss_mb": workers_peak_rss_mb()}


def run_child(path: str, workers: int, samples: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", path, "--workers", str(workers), "--samples",
                          str(samples)], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])



def _workers_peak(workers: int, without: dict, text: dict) -> str:
    """The largest worker's peak RSS of each run, or ``-`` without workers (none to measure)."""
    if not int(workers):
        return "-"
    return f"{without['worker_peak_rss_mb']:.0f} / {text['worker_peak_rss_mb']:.0f} MB"

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20k samples: a smoke run in seconds")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of each set per case; the best is reported")
    parser.add_argument("--tmp", type=existing_folder, help="folder for the shards, removed at the end (default: the "
                                                           "system temp dir)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results",
                        help="folder for bench_text.json (default: bench-results/ in the checkout)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.workers, args.samples)))
        return
    samples = 20_000 if args.quick else 1_000_000
    root = Path(tempfile.mkdtemp(prefix="bench-text-", dir=args.tmp))
    rows = []
    try:
        paths = write_sets(root, samples)
        for workers in (0, 2):
            runs: dict[str, list[dict]] = {name: [] for name in SETS}
            for _ in range(args.epochs):  # alternating: a disturbance of the machine meets both sets
                for name in SETS:
                    runs[name].append(run_child(paths[name], workers, samples))
            best = {name: max(runs[name], key=lambda run: run["samples_per_s"]) for name in SETS}
            rows.append({"workers": workers, **{name: best[name] for name in SETS},
                         "ratio": best["text"]["samples_per_s"] / best["without"]["samples_per_s"]})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{samples:,} samples of x float32[8] and y, with and without a name string; batches of {BATCH}, best of "
          f"{args.epochs} epochs\n")
    print("| workers | without text, samples/s | with text, samples/s | ratio | peak RSS main (without / text) | "
          "largest worker |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        without, text = row["without"], row["text"]
        print(f"| {row['workers']} | {without['samples_per_s']:,.0f} | {text['samples_per_s']:,.0f} | "
              f"{row['ratio']:.2f} | {without['peak_rss_mb']:.0f} / {text['peak_rss_mb']:.0f} MB | "
              f"{_workers_peak(row['workers'], without, text)} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_text.json").write_text(json.dumps({"samples": samples, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
