#!/usr/bin/env python
"""Benchmark of the Dask engine: the embeddings build of ``bench_build.py`` (200k x 768 float32
+ an int64 label, ``.npy`` files read with pread, ``pack=16``, 32 MB shards) run by one process,
by two local worker processes, and by a Dask cluster of two worker processes (one thread each):
once started by the build itself (``--engine dask``, its start and stop included in the time),
once already running (``--scheduler``, the cost of the engine alone).

Each run is a fresh process, timed from ``sync`` to ``sync``, best of ``--repeats`` (see
``bench_build.py`` for the method)::

    python scripts/bench_dask.py            # a minute or two, ~2 GB free in --tmp
    python scripts/bench_dask.py --rows 20000 --repeats 1   # smaller
    python scripts/bench_dask.py --quick                    # 5,000 rows, one run: seconds (a test runs it)
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from bench_build import DIM
from benchlib.build_cases import Case, build_case, cases_table, make_dataset
from benchlib.common import existing_folder


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000, help="samples (default 200,000)")
    p.add_argument("--pack", type=int, default=16, help="samples per record (default 16)")
    p.add_argument("--shard-mb", type=int, default=32, help="shard size (default 32)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each case; the best is used (default 3)")
    p.add_argument("--tmp", type=existing_folder, help="folder for the generated data and shards (default: the system temp dir)")
    p.add_argument("--quick", action="store_true", help="5,000 rows, one run: a smoke run")
    args = p.parse_args()
    if args.quick:
        args.rows, args.repeats = 5000, 1
    return args


def dask_case(name: str, local: Case, scheduler: str | None) -> Case:
    return Case(name, {**local.spec, "engine": "dask", "scheduler": scheduler}, local.data_bytes)


def main(args: argparse.Namespace) -> None:
    import dask
    from distributed import LocalCluster

    with tempfile.TemporaryDirectory(prefix="bench_dask-", dir=args.tmp) as tmp:
        work = Path(tmp)
        # Dask keeps its files in a dask-scratch-space that it leaves behind: in here, for this
        # process's cluster and for those the builds start (their processes read the variable)
        os.environ["DASK_TEMPORARY_DIRECTORY"] = str(work / "dask")
        dask.config.refresh()
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=None) as running:
            data = make_dataset(work, "embeddings", args.rows, DIM, seed=2)
            one = build_case("local workers=1", data, "path", args.pack, args.shard_mb, workers=1)
            two = build_case("local workers=2", data, "path", args.pack, args.shard_mb, workers=2)
            cases = [one, two, dask_case("dask, cluster of 2 started by the build", two, None),
                     dask_case("dask, cluster of 2 already running", two, running.scheduler_address)]
            for repeat in range(args.repeats):
                print(f"repeat {repeat + 1}/{args.repeats}", flush=True)
                for case in cases:
                    case.run(work)
    print(f"\n### Local and Dask builds ({args.repeats} runs each, rates from the best; MB = 1e6 bytes)\n")
    print(cases_table([case.summary() for case in cases]))


if __name__ == "__main__":
    main(parse_args())
