#!/usr/bin/env python
"""Benchmark of building shards: speed, size on disk and memory, each against a baseline
measured in the same run on the same data.

What it measures, and why:

1. tabular: 2M samples of 10 float32 features + an int64 label, written with ``pack=256``,
   against ``webdataset.ShardWriter`` writing the same samples the usual way (one ``.npy``
   and one ``.cls`` tar member per sample). Small samples are where per-sample costs (tar
   headers, padding, Python calls) dominate, which is what packing is for. webdataset
   manages ~10k samples/s, so it writes only the first ``--wds-rows`` samples; its
   samples/s and bytes per sample are measured there. Also reported: our bytes on disk
   divided by the raw bytes (``rows * 48``), the cost of the container.
2. embeddings: 200k x 768 float32 + an int64 label, read from ``.npy`` files, with
   ``pack=1`` and a packed variant (``--embedding-pack``), against ``cp`` of the same
   files followed by ``sync``: any converter must at least read the bytes and make them
   durable, so cp+sync is the bound to compare with (a demanding one: GNU cp copies in
   the kernel with ``copy_file_range``, without a pass through user space).
3. workers: the embeddings builds with ``workers=2`` against ``workers=1``, both reading
   the ``.npy`` files with pread (no arrays pickled to workers). A build parallelises over
   shards, and 614 MB in 256 MB shards is only 3 shards, so this case uses smaller shards
   (``--workers-shard-mb``) for both of its runs.
4. memory: a >= 4 GB ``.npy`` opened with ``np.load(path, mmap_mode="r")`` and passed as
   a memmap; reported is the peak RSS of the building process, which must stay bounded
   (a build that touched the map page by page would grow to the size of the file). The
   peak includes the interpreter and whatever ``import pipeline`` loads; the JSON also
   records each run's RSS just before its build started (``rss_before_build_mb``).

Method: every run is a fresh Python process (this script with ``--child``), so a peak RSS
belongs to one run. The peak is the process's ``VmHWM``: ``ru_maxrss`` is carried across
``exec`` on Linux, so in a fresh child it starts at the peak of the process that started
it. The workers' peak (``RUSAGE_CHILDREN``: the largest worker) is reported beside it; it
has the same flaw, so it is an upper bound (at least the run's own RSS when it started
its pool). Inputs are generated in a temporary folder (removed at the end), synced, and
read once so that they sit in the page cache. A timing starts after ``sync`` and ends after ``sync``, so it includes the fsync our
writer does for every shard and the write-back of what webdataset and cp leave dirty.
Every case except memory runs ``--repeats`` times, interleaved with its baseline so that
drift in disk speed hits both alike. Rates and ratios use the best time of each case: on a
shared virtual machine noise only ever adds time (a run with ``workers=2`` sometimes gets
one core's worth of CPU), so the best time is the stable estimate; the median is shown
beside it. MB = 1e6 bytes.

Usage (results also go to ``bench-results/bench_build.json``)::

    python scripts/bench_build.py --quick   # smoke run, seconds
    python scripts/bench_build.py           # full run, a few minutes, ~9 GB free in --tmp
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from benchlib.build_cases import Case, Dataset, build_case, cases_table, child_main, make_dataset
from benchlib.common import ROOT, Target, existing_folder, targets_table
from benchlib.runs import check_free_space

FEATURES = 10
DIM = 768

QUICK = dict(tabular_rows=50_000, embedding_rows=5_000, big_gb=0.05, wds_rows=2_000, repeats=1,
             workers_shard_mb=2)
FULL = dict(tabular_rows=2_000_000, embedding_rows=200_000, big_gb=4.3, wds_rows=100_000, repeats=5,
            workers_shard_mb=32)


# -- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    tabular_rows: int
    embedding_rows: int
    big_gb: float
    wds_rows: int
    repeats: int
    shard_mb: int
    workers_shard_mb: int
    tabular_pack: int
    embedding_pack: int
    skip_big: bool
    quick: bool
    tmp: str | None
    out: Path

    @property
    def big_rows(self) -> int:
        return int(self.big_gb * 1e9) // (DIM * 4)


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat: a smoke run")
    p.add_argument("--tabular-rows", type=int, help=f"tabular samples (default {FULL['tabular_rows']:,})")
    p.add_argument("--embedding-rows", type=int, help=f"embedding samples (default {FULL['embedding_rows']:,})")
    p.add_argument("--big-gb", type=float, help=f"size of the memmap of the memory case (default {FULL['big_gb']})")
    p.add_argument("--wds-rows", type=int, help=f"samples webdataset writes (default {FULL['wds_rows']:,})")
    p.add_argument("--repeats", type=int, help=f"runs of each timed case; the best is used (default {FULL['repeats']})")
    p.add_argument("--shard-mb", type=int, default=256, help="shard size of every case but workers (default 256)")
    p.add_argument("--workers-shard-mb", type=int,
                   help=f"shard size of the workers case (default {FULL['workers_shard_mb']})")
    p.add_argument("--tabular-pack", type=int, default=256, help="pack of the tabular build (default 256)")
    p.add_argument("--embedding-pack", type=int, default=16,
                   help="pack of the packed embeddings build (default 16; pack=1 is always run too)")
    p.add_argument("--skip-big", action="store_true", help="skip the memory case (needs ~2.1x --big-gb free)")
    p.add_argument("--tmp", type=existing_folder, help="folder for the generated data and shards (default: the system temp dir)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results",
                   help="folder for bench_build.json (default: bench-results/)")
    args = p.parse_args(argv)
    if args.embedding_pack < 2:
        p.error("--embedding-pack is the packed variant, it must be >= 2 (pack=1 always runs)")
    sizes = QUICK if args.quick else FULL
    pick = {name: getattr(args, name) if getattr(args, name) is not None else default
            for name, default in sizes.items()}
    return Config(**pick, shard_mb=args.shard_mb, tabular_pack=args.tabular_pack,
                  embedding_pack=args.embedding_pack, skip_big=args.skip_big, quick=args.quick,
                  tmp=args.tmp, out=args.out)


def timed_cases(cfg: Config, tabular: Dataset, emb: Dataset) -> dict[str, Case]:
    """Every case but memory, in the order they run (baselines next to what they judge)."""
    wds_rows = min(cfg.wds_rows, tabular.rows)
    p, w = cfg.embedding_pack, cfg.workers_shard_mb
    cases = [
        build_case("tabular", tabular, "memory", cfg.tabular_pack, cfg.shard_mb),
        Case("tabular webdataset", {"kind": "webdataset", "inputs": tabular.paths(), "rows": wds_rows,
                                    "shard_bytes": cfg.shard_mb << 20},
             tabular.raw_bytes * wds_rows // tabular.rows),
        Case("embeddings cp+sync", {"kind": "cp", "inputs": emb.paths(), "rows": emb.rows}, emb.raw_bytes),
        build_case("embeddings pack=1", emb, "path", 1, cfg.shard_mb),
        build_case(f"embeddings pack={p}", emb, "path", p, cfg.shard_mb),
        build_case(f"workers=1 pack=1 {w}MB", emb, "path", 1, w, workers=1),
        build_case(f"workers=2 pack=1 {w}MB", emb, "path", 1, w, workers=2),
        build_case(f"workers=1 pack={p} {w}MB", emb, "path", p, w, workers=1),
        build_case(f"workers=2 pack={p} {w}MB", emb, "path", p, w, workers=2),
    ]
    return {case.name: case for case in cases}


def targets(cfg: Config, cases: dict[str, Case], big: Case | None) -> list[Target]:
    """The ratios the benchmark exists for, each against its baseline from this run."""
    tab, wds = cases["tabular"], cases["tabular webdataset"]
    cp = cases["embeddings cp+sync"]
    p, w = cfg.embedding_pack, cfg.workers_shard_mb
    speedup = (tab.samples / tab.seconds) / (wds.samples / wds.seconds)
    overhead = tab.runs[-1]["bytes_on_disk"] / tab.data_bytes
    wds_per_sample = wds.runs[-1]["bytes_on_disk"] / wds.samples
    rows = [
        Target("tabular: our samples/s / webdataset samples/s", speedup, ">= 50", speedup >= 50),
        Target("tabular: our bytes on disk / raw bytes", overhead, "<= 1.5", overhead <= 1.5),
        Target("tabular: webdataset bytes on disk / raw bytes", wds_per_sample / (tab.data_bytes / tab.samples),
               "info", None),
        Target("tabular: webdataset bytes per sample", wds_per_sample, "info", None),
        Target(f"tabular: webdataset GB on disk for {tab.samples:,} samples (extrapolated)",
               wds_per_sample * tab.samples / 1e9, "info", None),
    ]
    for pack in (1, p):
        ours = cases[f"embeddings pack={pack}"]
        ratio = cp.seconds / ours.seconds
        rows.append(Target(f"embeddings pack={pack}: our MB/s / cp+sync MB/s", ratio, ">= 0.5", ratio >= 0.5))
    for pack in (1, p):
        one, two = cases[f"workers=1 pack={pack} {w}MB"], cases[f"workers=2 pack={pack} {w}MB"]
        ratio = one.seconds / two.seconds
        rows.append(Target(f"workers: workers=2 / workers=1 speed (pack={pack}, {w} MB shards)",
                           ratio, ">= 1.6", ratio >= 1.6))
    if big is not None:
        rss = big.summary()["peak_rss_mb"]
        rows.append(Target(f"memory: peak RSS (MB) building a {big.data_bytes / 1e9:.1f} GB memmap",
                           rss, "< 300", rss < 300))
    return rows


# -- report ----------------------------------------------------------------------------------


def environment(cases: dict[str, Case]) -> dict[str, Any]:
    """Versions; the library's as the runs imported it (not imported here)."""
    import msgpack
    import webdataset

    built = cases["tabular"].runs[-1]
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "numpy": np.__version__, "msgpack": ".".join(map(str, msgpack.version)),
            "webdataset": getattr(webdataset, "__version__", "?"),
            "pipeline": built["pipeline_version"], "pipeline_path": built["pipeline_path"]}


def save_results(cfg: Config, cases: dict[str, Case], summaries: list[dict[str, Any]],
                 rows: list[Target]) -> Path:
    cfg.out.mkdir(parents=True, exist_ok=True)
    path = cfg.out / "bench_build.json"
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()}
    payload = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "config": config,
               "environment": environment(cases), "cases": summaries, "targets": [t.row() for t in rows]}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


# -- main ------------------------------------------------------------------------------------


def disk_needed(cfg: Config) -> int:
    """Rough peak of the run: inputs plus the largest outputs alive at once."""
    tabular = cfg.tabular_rows * (FEATURES * 4 + 8)
    embeddings = cfg.embedding_rows * (DIM * 4 + 8)
    timed = 2 * tabular + 3 * embeddings
    big = 0 if cfg.skip_big else int(2.1 * cfg.big_rows * (DIM * 4 + 8))
    return max(timed, big) + (256 << 20)


def run_timed(cfg: Config, work: Path) -> dict[str, Case]:
    print("generating tabular and embeddings data...", file=sys.stderr, flush=True)
    tabular = make_dataset(work, "tabular", cfg.tabular_rows, FEATURES, seed=1)
    emb = make_dataset(work, "embeddings", cfg.embedding_rows, DIM, seed=2)
    cases = timed_cases(cfg, tabular, emb)
    for repeat in range(cfg.repeats):
        print(f"repeat {repeat + 1}/{cfg.repeats}", file=sys.stderr, flush=True)
        for case in cases.values():
            case.run(work)
    tabular.remove()
    emb.remove()
    return cases


def run_big(cfg: Config, work: Path) -> Case:
    print(f"generating a {cfg.big_rows * DIM * 4 / 1e9:.1f} GB array...", file=sys.stderr, flush=True)
    big = make_dataset(work, "big", cfg.big_rows, DIM, seed=3)
    case = build_case(f"memory: memmap pack={cfg.embedding_pack}", big, "mmap", cfg.embedding_pack, cfg.shard_mb)
    try:
        case.run(work)
    finally:
        big.remove()
    return case


def main(cfg: Config) -> None:
    with tempfile.TemporaryDirectory(prefix="bench_build-", dir=cfg.tmp) as tmp:
        work = Path(tmp)
        check_free_space(work, disk_needed(cfg), "use --tmp elsewhere, smaller sizes, or --skip-big")
        cases = run_timed(cfg, work)
        big = None if cfg.skip_big else run_big(cfg, work)
    summaries = [c.summary() for c in cases.values()] + ([big.summary()] if big else [])
    rows = targets(cfg, cases, big)
    print(f"\n### Cases ({cfg.repeats} runs each, rates from the best; MB = 1e6 bytes)\n")
    print(cases_table(summaries))
    print("\n### Targets\n")
    print(targets_table(rows))
    print(f"\nwritten to {save_results(cfg, cases, summaries, rows)}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child_main(json.loads(sys.argv[2]))
    else:
        main(parse_args())
