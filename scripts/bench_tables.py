#!/usr/bin/env python
"""Benchmark of building shards from Parquet: speed and peak memory, against pyarrow reading the
same file alone, in the same run.

What it measures, and why:

1. embeddings: a ~1 GB Parquet file of 330k rows, ``x`` a ``fixed_size_list<float32>[768]`` and
   ``y`` an int64 label, written as pyarrow writes by default (here: one row group for the
   whole file). ``build`` is ``pipeline.build_parquet`` with its defaults (``pack="auto"``,
   256 MiB shards), once with one process and once with ``workers=2``. The yardstick,
   ``pyarrow read``, is what any converter must at least do: ``ParquetFile(path).iter_batches()``
   over every column with pyarrow's defaults, touching every page of every buffer it returns.
2. memory (``--big``): a file larger than 2 GB in a single row group (~2.3 GB, 750k rows), built
   once; reported is the build's peak RSS, which must stay far below the size of the row group,
   and pyarrow's own peak reading it with its defaults, for comparison.

Method: every run is a fresh Python process (this script with ``--child``), so that a peak RSS
belongs to one run: the peak is the process's ``VmHWM`` (``ru_maxrss`` is carried across
``exec`` on Linux), and the workers' peak is ``RUSAGE_CHILDREN`` (the largest worker). Inputs
are written in a temporary folder (removed at the end), synced and read once so that they sit
in the page cache. A build's time runs from a ``sync`` to a ``sync`` (it includes making its
shards durable); cases alternate with the yardstick ``--repeats`` times, and rates use the best
time of each (noise on a shared machine only ever adds time). MB = 1e6 bytes; MB/s counts the
rows' raw bytes (768 float32 + one int64 a row).

Usage (results also go to ``bench-results/bench_tables.json``)::

    python scripts/bench_tables.py --quick   # smoke run, seconds
    python scripts/bench_tables.py           # ~1 GB file, a few minutes
    python scripts/bench_tables.py --big     # and the >2 GB file: ~7 GB free in --tmp
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from benchlib.common import existing_folder, markdown_table
from benchlib.runs import check_free_space, peak_rss_mb, synced_seconds, warm_page_cache, workers_peak_rss_mb

ROOT = Path(__file__).resolve().parent.parent
MB = 1e6
DIM = 768
ROW_BYTES = DIM * 4 + 8
QUICK = {"rows": 3_000, "big_rows": 8_000, "repeats": 1}
FULL = {"rows": 330_000, "big_rows": 750_000, "repeats": 3}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: a smoke run in seconds")
    p.add_argument("--big", action="store_true", help="also build a >2 GB file and report its peak RSS")
    p.add_argument("--rows", type=int, help=f"rows of the timed file (default {FULL['rows']:,})")
    p.add_argument("--big-rows", type=int, help=f"rows of the --big file (default {FULL['big_rows']:,})")
    p.add_argument("--repeats", type=int, help=f"runs of each timed case; the best is used (default {FULL['repeats']})")
    p.add_argument("--tmp", type=existing_folder, help="folder for the generated files and shards (default: the system temp dir)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results", help="folder for bench_tables.json")
    args = p.parse_args(argv)
    for name, default in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    args.big = args.big or args.quick
    return args


# -- inputs ------------------------------------------------------------------------------------


def write_parquet(path: Path, rows: int, seed: int) -> Path:
    """Random embeddings and labels in one row group (pyarrow's default holds up to 1Mi rows),
    synced and read once into the page cache."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    step = 50_000
    chunks = [pa.FixedSizeListArray.from_arrays(rng.standard_normal(min(step, rows - s) * DIM, dtype=np.float32), DIM)
              for s in range(0, rows, step)]
    table = pa.table({"x": pa.chunked_array(chunks), "y": rng.integers(0, 1000, rows)})
    pq.write_table(table, path, row_group_size=rows)
    del table, chunks
    os.sync()
    warm_page_cache(path)
    return path


# -- one run, in a fresh process -----------------------------------------------------------------


def child_read(spec: dict[str, Any]) -> dict[str, Any]:
    """pyarrow alone: every batch of every column, every page of every buffer touched; with
    pyarrow's defaults, or (``bounded``) with the reader settings and batch size of a build."""
    import pyarrow.parquet as pq

    rows = [0]
    checksum = [0]
    if spec["bounded"]:
        from pipeline.write.sources.tables import BATCH_BYTES, READ_BUFFER

        file = pq.ParquetFile(spec["path"], pre_buffer=False, buffer_size=READ_BUFFER)
        batches = file.iter_batches(batch_size=max(BATCH_BYTES // ROW_BYTES, 1))
    else:
        batches = pq.ParquetFile(spec["path"]).iter_batches()

    def read() -> None:
        for batch in batches:
            rows[0] += batch.num_rows
            for column in batch.columns:
                for buffer in column.buffers():
                    if buffer is not None:
                        checksum[0] += int(np.frombuffer(buffer, np.uint8)[::4096].sum())

    return {"seconds": synced_seconds(read), "rows": rows[0]}


def child_build(spec: dict[str, Any]) -> dict[str, Any]:
    import pipeline

    indexes = []
    seconds = synced_seconds(lambda: indexes.append(pipeline.build_parquet(
        spec["path"], spec["dest"], workers=spec["workers"], overwrite=True, quiet=True)))
    return {"seconds": seconds, "rows": indexes[0].samples, "shards": len(indexes[0].shards),
            "pack": indexes[0].pack}


def child_main(spec: dict[str, Any]) -> None:
    result = {"read": child_read, "build": child_build}[spec["kind"]](spec)
    result["peak_rss_mb"] = peak_rss_mb()
    result["workers_peak_rss_mb"] = workers_peak_rss_mb()
    print(json.dumps(result))


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"case {spec['case']} failed (exit {proc.returncode}):\n{proc.stderr}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if spec.get("dest"):
        shutil.rmtree(spec["dest"])
    print(f"  {spec['case']}: {result['seconds']:.2f} s, peak RSS {result['peak_rss_mb']:.0f} MB",
          file=sys.stderr, flush=True)
    return result


# -- the cases and the report ----------------------------------------------------------------------


def measure(cases: list[dict[str, Any]], repeats: int, rows: int) -> list[dict[str, Any]]:
    """Each case ``repeats`` times, interleaved; a summary per case (best and all times)."""
    runs: dict[str, list[dict[str, Any]]] = {case["case"]: [] for case in cases}
    for _ in range(repeats):
        for case in cases:
            runs[case["case"]].append(run_child(case))
    summaries = []
    for case in cases:
        done = runs[case["case"]]
        assert all(r["rows"] == rows for r in done), f"{case['case']} saw {done[0]['rows']} rows, not {rows}"
        best = min(r["seconds"] for r in done)
        summaries.append({"case": case["case"], "rows": rows, "seconds": best,
                          "all_seconds": [r["seconds"] for r in done], "data_mb_per_s": rows * ROW_BYTES / best / MB,
                          "peak_rss_mb": max(r["peak_rss_mb"] for r in done),
                          "workers_peak_rss_mb": max(r["workers_peak_rss_mb"] for r in done) if case.get(
                              "workers", 1) > 1 else None,
                          "shards": done[0].get("shards"), "pack": done[0].get("pack")})
    return summaries


def table(summaries: list[dict[str, Any]]) -> str:
    header = ["case", "rows", "file (MB)", "best (s)", "MB/s", "speed / pyarrow read", "speed / bounded read",
              "peak RSS (MB)", "workers' peak (MB)"]
    return markdown_table(header, [
        [s["case"], f"{s['rows']:,}", f"{s['file_mb']:,.0f}", f"{s['seconds']:.2f}", f"{s['data_mb_per_s']:,.0f}",
         f"{s['speed_vs_pyarrow_read']:.2f}", f"{s['speed_vs_bounded_read']:.2f}", f"{s['peak_rss_mb']:,.0f}",
         "-" if s["workers_peak_rss_mb"] is None else f"{s['workers_peak_rss_mb']:,.0f}"] for s in summaries])


def file_cases(name: str, path: Path, dest: Path, workers: tuple[int, ...]) -> list[dict[str, Any]]:
    """The two reads of ``path`` by pyarrow, and its builds with each number of ``workers``."""
    prefix = "" if name == "embeddings" else f"{name}: "
    reads = [{"case": f"{prefix}pyarrow read", "kind": "read", "path": str(path), "bounded": False},
             {"case": f"{prefix}pyarrow read, bounded", "kind": "read", "path": str(path), "bounded": True}]
    return reads + [{"case": f"{prefix}build" + (f" workers={n}" if n > 1 else ""), "kind": "build",
                     "path": str(path), "dest": str(dest), "workers": n} for n in workers]


def main(args: argparse.Namespace) -> None:
    import pyarrow

    with tempfile.TemporaryDirectory(prefix="bench_tables-", dir=args.tmp) as tmp:
        work = Path(tmp)
        check_free_space(work, 2 * ROW_BYTES * (max(args.rows, args.big_rows) if args.big else args.rows))
        print(f"writing {args.rows:,} rows of {DIM} float32...", file=sys.stderr, flush=True)
        path = write_parquet(work / "embeddings.parquet", args.rows, seed=1)
        summaries = measure(file_cases("embeddings", path, work / "out", (1, 2)), args.repeats, args.rows)
        for s in summaries:
            s["file"], s["file_mb"] = "embeddings", path.stat().st_size / MB
        path.unlink()
        if args.big:
            print(f"writing {args.big_rows:,} rows in one row group...", file=sys.stderr, flush=True)
            big = write_parquet(work / "big.parquet", args.big_rows, seed=2)
            for s in measure(file_cases("big", big, work / "out", (1,)), 1, args.big_rows):
                s["file"], s["file_mb"] = "big", big.stat().st_size / MB
                summaries.append(s)
    for yardstick in ("pyarrow read", "pyarrow read, bounded"):
        seconds = {s["file"]: s["seconds"] for s in summaries if s["case"].endswith(yardstick)}
        for s in summaries:
            s["speed_vs_bounded_read" if "bounded" in yardstick else "speed_vs_pyarrow_read"] = \
                seconds[s["file"]] / s["seconds"]
    print(f"\n### Parquet -> shards ({args.repeats} runs of each timed case, best shown; MB = 1e6 bytes)\n")
    print(table(summaries))
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "bench_tables.json"
    environment = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
                   "numpy": np.__version__, "pyarrow": pyarrow.__version__}
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    out.write_text(json.dumps({"command": " ".join([Path(sys.executable).name, *sys.argv]), "config": config,
                               "environment": environment, "cases": summaries}, indent=2) + "\n")
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child_main(json.loads(sys.argv[2]))
    else:
        main(parse_args())
