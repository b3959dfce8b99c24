#!/usr/bin/env python
"""Benchmark of streaming shards into PyTorch: throughput, start-up latency, memory and
shuffle quality of ``pipeline.make_loader``, each against baselines measured in the same run,
on the same data, with everything in the page cache.

What it measures, and why:

1. Throughput, on three shapes of sample where different costs dominate: **tabular**
   (2M x 10 float32 + an int64 label: per-sample overheads), **embeddings** (200k x 768
   float32 + label: a mix) and **images** (10k x 3x224x224 uint8 + label: bytes copied).
   Each shape is read with batches of 256 and ``num_workers`` 0 and 2 by

   - this loader: ``make_loader`` over shards written by ``write_shards`` (``pack=256`` for
     tabular, ``--embedding-pack`` (64) for embeddings, ``pack=1`` for images: each record
     costs some Python to parse, so small samples are packed, as the README advises);
   - webdataset, the baseline the library claims to beat: the plain pipeline
     ``WebDataset(urls, shardshuffle=100).shuffle(1000).decode().to_tuple("npy", "cls")
     .batched(256)`` in a ``WebLoader(batch_size=None)``, over shards of the same samples
     written by ``webdataset.ShardWriter`` (one ``.npy`` and one ``.cls`` member each);
   - two classic recipes: a map-style dataset whose item is one joblib batch file of 256
     samples (``x_<B>.job``/``y_<B>.job``, batches shuffled, not samples), and one ``.pt``
     file per sample read with ``torch.load`` (slow, so only the first ``--pt-rows`` samples
     are written and timed);
   - two limits: ``cat`` of our shard files to /dev/null (reading the bytes once, with no
     parsing, decoding or shuffling), and a NumPy memmap gather (``x[sorted random indices]``
     of the ``.npy`` per batch, a map-style dataset with ``batch_size=None``): the cost of
     collating random batches straight from raw arrays, with no container at all. A
     streaming loader has to reach about the memmap gather to be worth its format.

   Reported per row: samples/s and payload MB/s (features + label; 1 MB = 1e6 bytes) of
   the best of ``--epochs`` epochs (the first one pays for starting workers), the time to
   the first batch of the first epoch (worker start-up included), peak RSS of the process
   tree, and ratios against webdataset and against the memmap gather with the same number
   of workers.

2. Shuffle quality, on a dataset of 10 classes sorted by class, one class per shard (the
   worst case for any streaming shuffle): the mean number of distinct classes in a batch of
   256 and the mean label entropy of a batch in bits, for this loader (its default buffer
   and a 1000-sample buffer, like webdataset's), webdataset's pipeline above and a full
   random permutation (the ideal: 10 classes, log2(10) = 3.32 bits). The table shows the
   samples each shuffles together: for this loader the unit its plan cuts, at most the
   buffer and fewer on a short dataset (a rank's span is cut into 8 units at least).

3. Memory: a >= 4 GB dataset (1.4M x 768 float32, ``pack=16``; generated in chunks, never
   whole in RAM) streamed once with 2 workers. Its peak RSS must stay bounded by what the
   loader holds, the shuffle buffer (``dataset.shuffle_buffer`` samples x bytes per sample,
   per worker), plus a fixed allowance of 250 MB, and not grow with the dataset. A "floor"
   row measures the same process tree (torch imported, 2 DataLoader workers) moving tiny
   batches: what any loader costs before it holds data.

Method: every case runs in a fresh Python process (this script with ``--child``). The
parent samples the RSS of that process and of all its descendants (the DataLoader workers)
every 50 ms from /proc and reports the peak of the sum. A sum of RSS counts pages shared by
several processes (the interpreter and torch, copied on write into forked workers; shared
memory tensors in flight) once per process, so the memory rows also sample PSS
(``/proc/PID/smaps_rollup``), which splits shared pages between the processes that map
them. Generated files are synced and read once so that they are in the page cache before
any case runs; each shape's files are deleted before the next shape is generated. MB/s
counts payload bytes, not container bytes, so that loaders are compared on the same work.
The library is copied into the temporary folder at the start (``pipeline/`` as it is, or a
commit with ``--rev``) and every process imports that copy, so that edits to the package
during a long run cannot mix versions; the JSON records the revision.

Images stored as JPEG files, decoded in the loader, have a benchmark of their own
(``scripts/bench_images.py``): their readers and baselines differ from those of arrays.

Usage (results also go to ``bench-results/bench.json`` and ``bench-results/bench.png``)::

    python scripts/bench.py --quick     # smoke run on tiny data, about a minute (a test runs it)
    python scripts/bench.py             # full run, ~30 minutes, ~12 GB free in --tmp
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path

from benchlib.cases import run_memory, run_shapes, run_shuffle
from benchlib.common import FULL, LABEL_BYTES, MEMORY_DIM, QUICK, ROOT, SHAPES, Config, existing_folder, log, shapes_of
from benchlib.data import wds_sample_bytes
from benchlib.library import snapshot_library
from benchlib.readers import child_main
from benchlib.report import report
from benchlib.runs import check_free_space

REMOTE_SOURCES = ("http", "s3", "both")


def remote_source(argv: list[str]) -> bool:
    """Whether ``argv`` asks for ``--source``: the remote benchmark's run, not this one's."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--source")
    return pre.parse_known_args(argv)[0].source is not None


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", choices=REMOTE_SOURCES,
                   help="stream from nginx (http) and SeaweedFS (s3) on 127.0.0.1 instead, against curl and boto3: "
                        "runs scripts/bench_remote.py, which takes the other options (see its --help)")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    p.add_argument("--tabular-rows", type=int, help=f"tabular samples (default {FULL['tabular_rows']:,})")
    p.add_argument("--embedding-rows", type=int, help=f"embedding samples (default {FULL['embedding_rows']:,})")
    p.add_argument("--image-rows", type=int, help=f"image samples (default {FULL['image_rows']:,})")
    p.add_argument("--pt-rows", type=int, help=f"samples of the .pt recipe, a prefix (default {FULL['pt_rows']:,})")
    p.add_argument("--memory-rows", type=int,
                   help=f"768-float samples of the memory case (default {FULL['memory_rows']:,}, 4.3 GB)")
    p.add_argument("--shuffle-per-class", type=int,
                   help=f"samples per class (and shard) of the shuffle case (default {FULL['shuffle_per_class']:,})")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated subset of {','.join(SHAPES)}")
    p.add_argument("--workers", default="0,2", help="comma-separated num_workers values (default 0,2)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per case; the best is reported (default 2)")
    p.add_argument("--embedding-pack", type=int, default=64,
                   help="pack of the embeddings shards (default 64: 3 KB samples, 196 KB records)")
    p.add_argument("--skip-slow", action="store_true", help="skip the classic recipes (joblib, .pt)")
    p.add_argument("--skip-shuffle", action="store_true", help="skip the shuffle quality case")
    p.add_argument("--skip-memory", action="store_true", help="skip the memory case")
    p.add_argument("--rev", help="benchmark the library at this git commit (default: pipeline/ as it is at the start)")
    p.add_argument("--tmp", type=existing_folder, help="folder for the generated data (default: the system temp dir)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results",
                   help="folder for bench.json and bench.png (default: bench-results/)")
    args = p.parse_args(argv)
    shapes = tuple(s for s in args.shapes.split(",") if s)
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        p.error(f"unknown shapes {unknown}; choose from {', '.join(SHAPES)}")
    sizes = QUICK if args.quick else FULL
    pick = {name: getattr(args, name) if getattr(args, name) is not None else default
            for name, default in sizes.items()}
    return Config(**pick, shapes=shapes, workers=tuple(int(w) for w in args.workers.split(",")),
                  epochs=args.epochs, embedding_pack=args.embedding_pack, skip_slow=args.skip_slow,
                  skip_shuffle=args.skip_shuffle, skip_memory=args.skip_memory, quick=args.quick,
                  rev=args.rev, tmp=args.tmp, out=args.out)


# -- main --------------------------------------------------------------------------------------


def disk_needed(cfg: Config) -> int:
    """Rough peak of the run: the largest shape's layouts, or the memory case's shards."""
    peaks = [s.rows * (2 * s.payload_bytes + wds_sample_bytes(s)) * (1 if cfg.skip_slow else 2)
             for s in shapes_of(cfg)]
    if not cfg.skip_memory:
        peaks.append(int(cfg.memory_rows * (MEMORY_DIM * 4 + LABEL_BYTES) * 1.05))
    return max(peaks, default=0) + (256 << 20)


def main(cfg: Config) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-", dir=cfg.tmp) as tmp:
        work = Path(tmp)
        check_free_space(work, disk_needed(cfg))
        revision = snapshot_library(work, cfg.rev)
        log(f"pipeline at {revision}, imported from {work / 'library'}")
        rows = run_shapes(cfg, work)
        shuffle = [] if cfg.skip_shuffle else run_shuffle(cfg, work)
        memory = None if cfg.skip_memory else run_memory(cfg, work)
    report(cfg, rows, shuffle, memory, revision)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child_main(json.loads(sys.argv[2]))
    elif remote_source(sys.argv[1:]):
        # http or s3: streaming from nginx / SeaweedFS on 127.0.0.1 against curl / boto3,
        # measured by scripts/bench_remote.py (which takes the remaining options)
        from bench_remote import main as remote_main

        sys.exit(remote_main(sys.argv[1:]))
    else:
        # a plain ``kill`` unwinds like Ctrl-C, so that the generated data is removed
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        main(parse_args())
