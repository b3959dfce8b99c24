#!/usr/bin/env python
"""Benchmark of mixing shard sets by weight: how well batches hold each source's share, and what
mixing costs in speed and memory.

Three sources of very different sizes (100:10:1, small float32 samples) are mixed 0.5 / 0.3 / 0.2,
so that the large one is subsampled and the small one repeated 22 times an epoch. One epoch is read
through ``pipeline.make_loader`` (2 workers, batches of 256), and for each source:

- ``share mean`` and ``share std``: its share of each full batch, averaged over the epoch, and
  the standard deviation of that share from batch to batch;
- ``binomial std``: ``sqrt(w (1 - w) / 256)``, what drawing every sample of a batch at random
  with probability ``w`` gives; and ``shuffled std``, measured on the same epoch's samples
  shuffled uniformly at random (the ideal sampler, baseline of the same run).

A std close to the binomial one means batches are as mixed as a perfect sampler would make them;
much larger would mean runs of one source (a stream that alternates sources by chunk, say).

Speed: samples/s of the mixed epoch against an epoch of the large source alone (same loader,
same number of samples, in the same run), and the peak RSS of the main process and of the
largest worker for each. Every case runs in a fresh process (this script with ``--child``).

Usage (results also go to ``bench-results/bench_mixing.json``)::

    python scripts/bench_mixing.py --quick   # 20k / 2k / 200 samples: seconds
    python scripts/bench_mixing.py           # 2M / 200k / 20k samples: a minute or two
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
WEIGHTS = {"large": 0.5, "medium": 0.3, "small": 0.2}
SCALE = {"large": 100, "medium": 10, "small": 1}
DIM = 32


def write_sources(folder: Path, small: int) -> dict[str, str]:
    """The three sources; field ``s`` says which source a sample is from."""
    import pipeline

    paths = {}
    for k, (name, scale) in enumerate(SCALE.items()):
        n = small * scale
        rng = np.random.default_rng(k)
        arrays = {"x": rng.normal(size=(n, DIM)).astype(np.float32), "s": np.full(n, k, np.int8)}
        pipeline.write_shards(folder / name, arrays, prefix=name, shard_samples=max(n // 8, 64), quiet=True)
        paths[name] = str(folder / name)
    return paths


def child(case: str, paths: dict[str, str], samples: int) -> dict:
    """One epoch of ``case`` ("mix" or "single") in this process."""
    import pipeline

    if case == "mix":
        loader = pipeline.make_loader(paths, num_workers=2, batch_size=BATCH, weights=WEIGHTS)
    else:  # the large source alone, an epoch of as many samples
        loader = pipeline.make_loader({"large": paths["large"]}, num_workers=2, batch_size=BATCH,
                                      samples={"large": samples})
    started = time.perf_counter()
    shares = []
    for batch in loader:
        if len(batch["s"]) == BATCH:
            shares.append(np.bincount(batch["s"].numpy(), minlength=len(SCALE)) / BATCH)
    seconds = time.perf_counter() - started
    del loader  # its persistent workers exit and are waited for: RUSAGE_CHILDREN then counts them
    gc.collect()
    return {"case": case, "seconds": seconds, "samples_per_s": samples / seconds, "shares": np.array(shares).tolist(),
            "peak_rss_mb": peak_rss_mb(), "worker_peak_rss_mb": workers_peak_rss_mb()}


def shuffled_std(shares: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per-source std of batch shares when the same samples are shuffled uniformly at random."""
    labels = np.repeat(np.arange(shares.shape[1]), np.round(shares.sum(axis=0) * BATCH).astype(int))
    rng.shuffle(labels)
    batches = labels[:len(labels) // BATCH * BATCH].reshape(-1, BATCH)
    return np.stack([(batches == s).mean(axis=1) for s in range(shares.shape[1])], axis=1).std(axis=0)


def run_child(case: str, paths: dict[str, str], samples: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", case, "--paths", json.dumps(paths),
                          "--samples", str(samples)], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sources: a smoke run in seconds")
    parser.add_argument("--tmp", type=existing_folder, help="folder for the shards, removed at the end (default: the "
                                                           "system temp dir)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results",
                        help="folder for bench_mixing.json (default: bench-results/ in the checkout)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, json.loads(args.paths), args.samples)))
        return
    root = Path(tempfile.mkdtemp(prefix="bench-mixing-", dir=args.tmp))
    try:
        paths = write_sources(root, 200 if args.quick else 20_000)
        samples = sum(200 * s if args.quick else 20_000 * s for s in SCALE.values())
        mixed, single = run_child("mix", paths, samples), run_child("single", paths, samples)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    shares = np.array(mixed["shares"])
    baseline = shuffled_std(shares, np.random.default_rng(0))
    rows = []
    print(f"{len(shares)} full batches of {BATCH}, one epoch of {samples:,} samples\n")
    print("| source | size | weight | share mean | share std | binomial std | shuffled std |")
    print("|---|---|---|---|---|---|---|")
    for s, (name, weight) in enumerate(WEIGHTS.items()):
        row = {"source": name, "weight": weight, "mean": shares[:, s].mean(), "std": shares[:, s].std(),
               "binomial_std": (weight * (1 - weight) / BATCH) ** 0.5, "shuffled_std": baseline[s]}
        rows.append(row)
        print(f"| {name} | {samples // sum(SCALE.values()) * SCALE[name]:,} | {weight} | {row['mean']:.4f} | "
              f"{row['std']:.4f} | {row['binomial_std']:.4f} | {row['shuffled_std']:.4f} |")
    print(f"\nmixed: {mixed['samples_per_s']:,.0f} samples/s, large source alone: {single['samples_per_s']:,.0f} "
          f"samples/s (ratio {mixed['samples_per_s'] / single['samples_per_s']:.2f}); peak RSS main "
          f"{mixed['peak_rss_mb']:.0f} vs {single['peak_rss_mb']:.0f} MB, largest worker "
          f"{mixed['worker_peak_rss_mb']:.0f} vs {single['worker_peak_rss_mb']:.0f} MB")
    args.out.mkdir(parents=True, exist_ok=True)
    for result in (mixed, single):
        result.pop("shares")
    (args.out / "bench_mixing.json").write_text(json.dumps({"quality": rows, "mixed": mixed, "single": single}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
