#!/usr/bin/env python
"""Benchmark of image decoding: JPEG files in class folders, decoded and resized to 224x224 in the
loader, by this library and by the two usual ways, 0 and 2 workers, in one run.

The data and the readers are described in ``benchlib/images.py``: this loader (``build
imagefolder`` + ``Images(224)`` decoded in the workers), webdataset's ``.decode("pil")`` with
the same resize and crop in ``map``, the classic ``ImageFolder`` + ``DataLoader``, and our
decoder alone in a tight loop (the ceiling of one process). Every reader runs in a fresh
process while this one samples the process tree's RSS; the best of ``--epochs`` epochs is
reported, with the time to the first batch and peak RSS, and ratios against webdataset and
ImageFolder with the same number of workers, and against the decoder's own speed.

Targets (2 workers): >= 1.5x webdataset and >= 1.5x ImageFolder; without workers, >= 80% of
the decoder's own speed.

Usage (results also go to ``bench-results/bench_images.json``)::

    python scripts/bench_images.py --quick    # 300 images, seconds (a test runs it)
    python scripts/bench_images.py            # 10,000 images, a few minutes, ~1 GB in --tmp
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchlib.cases import Row, run_child
from benchlib.common import ROOT, Target, existing_folder, fmt, log, markdown_table, targets_table
from benchlib.images import SIZE, prepare_images
from benchlib.library import environment, snapshot_library

OURS, WDS, FOLDER, DECODER = "this loader", "webdataset decode('pil')", "ImageFolder + DataLoader", "decoder alone"
KINDS = {OURS: ("ours_images", "ours"), WDS: ("wds_images", "wds"), FOLDER: ("folder_images", "folder")}
PAYLOAD = 3 * SIZE * SIZE + 8  # a decoded image and its label


def measure(name: str, kind: str, data: object, workers: int | None, epochs: int, rows: int) -> Row:
    result = run_child({"kind": kind, "data": data, "workers": workers or 0, "epochs": epochs})
    best = min(result["epochs"], key=lambda e: e["seconds"])
    counts = {e["samples"] for e in result["epochs"]}
    note = "" if counts == {rows} else f"delivered {sorted(counts)} samples, expected {rows}"
    row = Row("jpeg", name, workers, best["samples"], best["seconds"], PAYLOAD, result["epochs"][0]["first_batch_s"],
              result["peak_rss_mb"], [e["seconds"] for e in result["epochs"]], note, result["info"])
    log(f"  {name:26s} workers={workers}: {row.samples_per_s:>8,.0f} images/s  first batch {row.first_batch_s:.2f} s  "
        f"peak RSS {row.peak_rss_mb:.0f} MB")
    return row


def targets(rows: list[Row]) -> list[Target]:
    def rate(loader: str, workers: int | None) -> float | None:
        return next((r.samples_per_s for r in rows if (r.loader, r.workers) == (loader, workers)), None)

    out = []
    for baseline in (WDS, FOLDER):
        ours, theirs = rate(OURS, 2), rate(baseline, 2)
        if ours and theirs:
            out.append(Target(f"2 workers: this loader / {baseline}", ours / theirs, ">= 1.5", ours / theirs >= 1.5))
    ours, alone = rate(OURS, 0), rate(DECODER, None)
    if ours and alone:
        out.append(Target("0 workers: this loader / decoder alone", ours / alone, ">= 0.8", ours / alone >= 0.8))
    return out


def table(rows: list[Row]) -> str:
    def ratio(row: Row, baseline: str) -> str:
        other = next((r for r in rows if (r.loader, r.workers) == (baseline, row.workers)), None)
        return "-" if other is None or row.loader == baseline else f"{row.samples_per_s / other.samples_per_s:.2f}x"

    return markdown_table(
        ["reader", "workers", "images/s", "first batch s", "peak RSS MB", "vs webdataset", "vs ImageFolder", "note"],
        [[r.loader, "-" if r.workers is None else str(r.workers), f"{r.samples_per_s:,.0f}", fmt(r.first_batch_s, ".2f"),
          fmt(r.peak_rss_mb, ".0f"), ratio(r, WDS), ratio(r, FOLDER), r.note] for r in rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="300 images, 1 epoch: a smoke run")
    p.add_argument("--rows", type=int, help="images (default 10,000; --quick 300)")
    p.add_argument("--workers", default="0,2", help="comma-separated num_workers values (default 0,2)")
    p.add_argument("--epochs", type=int, help="epochs per reader; the best is reported (default 2; --quick 1)")
    p.add_argument("--tmp", type=existing_folder, help="folder for the generated data (default: the system temp dir)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results", help="folder for bench_images.json")
    args = p.parse_args(argv)
    rows_wanted = args.rows or (300 if args.quick else 10_000)
    epochs = args.epochs or (1 if args.quick else 2)
    with tempfile.TemporaryDirectory(prefix="bench-images-", dir=args.tmp) as tmp:
        work = Path(tmp)
        revision = snapshot_library(work, None)
        log(f"pipeline at {revision}; writing {rows_wanted:,} JPEG files of 500x375")
        data = prepare_images(work, rows_wanted)
        log(f"{data['jpeg_bytes'] / 1e6:.0f} MB of JPEG ({data['jpeg_bytes'] / rows_wanted / 1e3:.0f} KB an image)")
        rows = [measure(DECODER, "decoder_loop", data["folder"], None, epochs, rows_wanted)]
        for workers in (int(w) for w in args.workers.split(",")):
            for name, (kind, key) in KINDS.items():
                rows.append(measure(name, kind, data[key], workers, epochs, rows_wanted))
    print(f"\n### Image decoding ({rows_wanted:,} JPEGs of 500x375, quality 90, to 3x{SIZE}x{SIZE} uint8; batches of "
          f"256; best of {epochs} epochs)\n")
    print(table(rows))
    found = targets(rows)
    if found:
        print("\n" + targets_table(found))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "bench_images.json"
    path.write_text(json.dumps({"command": " ".join(sys.argv), "environment": environment(revision),
                                "jpeg_bytes": data["jpeg_bytes"], "rows": [r.summary() for r in rows],
                                "targets": [t.row() for t in found]}, indent=2) + "\n")
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
