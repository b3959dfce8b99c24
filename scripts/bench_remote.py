#!/usr/bin/env python
"""Streaming from remote storage: this loader over HTTP (nginx) and S3 (SeaweedFS), both on
127.0.0.1, against the same loader on the same shards on local disk, and against the raw client
reading the same bytes (``curl`` for HTTP, boto3's ``get_object().read()`` for S3). Two shapes of
sample (``--shape``): embeddings (768 float32, 16 to a record) and images (3x224x224 uint8, one
to a record).

Why: remote reads add requests, loopback transfers and the retry/resume layer; the questions are
how close to local the loader gets, and how much of the raw client's bandwidth it keeps while it
also checks, decodes, shuffles and batches. Every reader runs in the same process tree on the
same shards, ``--runs`` times each (the best run counts: noise on a shared machine only adds
time). The local loader stays up throughout, and each remote reader's runs (a loader's epochs, a
raw client's reads) take turns with its epochs: every remote row is compared with local epochs
of the same minute, not with the first row (the machine's load can change a lot over the
minutes a run takes). A loader row also gives
the requests an epoch took (``stats()``). HTTP and S3 are read by the loader once per client its
ranges can go through (urllib3; over S3 presigned URLs on urllib3, the default, and boto3; and
obstore in the workers, ``PIPELINE_OBSTORE=workers``, when installed); S3 also through
``cache_dir`` (its first epoch fills the cache, the row is of later epochs: what days of training
see). Each source ends with bare ranged GETs of 512 KB through each client (in a child process),
with the CPU spent on each request.

Usage::

    python scripts/bench_remote.py --source http            # or s3, or both (default)
    python scripts/bench_remote.py --rows 20000 --source s3 # smaller
    python scripts/bench_remote.py --shape images           # one 150 KB sample a record
    python scripts/bench_remote.py --quick                  # both sources, tiny: seconds (a test runs it)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib.common import best_of  # noqa: E402
from benchlib.raw_clients import RANGE_BYTES, RANGE_THREADS, boto3_all, curl_all, ranged_gets  # noqa: E402

import pipeline  # noqa: E402
from pipeline.measure.cpu import tree_cpu_seconds  # noqa: E402
from pipeline.measure.memory import TreeMemory, process_tree  # noqa: E402
from pipeline.stream import idle_trim  # noqa: E402
from tests.storage.servers import ACCESS_KEY, SECRET_KEY, make_bucket, start_nginx, start_seaweedfs, stop  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """A kind of sample: what each holds, how many records pack it, how many a run has."""

    sample: tuple[int, ...]
    dtype: str
    pack: int
    rows: int
    quick_rows: int


#: Two cases: embeddings (3 KB samples, packed 16 to a record) and images (one 150 KB sample a
#: record: a chunk holds fewer records, each a large copy).
SHAPES = {"embeddings": Shape((768,), "float32", 16, 200_000, 3000),
          "images": Shape((3, 224, 224), "uint8", 1, 4000, 60)}


def build_shards(folder: Path, shape: str, rows: int, pack: int) -> list[str]:
    """Shards of ``rows`` random samples of ``shape`` (and a label each); returns their names."""
    kind = SHAPES[shape]
    rng = np.random.default_rng(0)
    size = (rows, *kind.sample)
    x = rng.random(size, dtype=np.float32) if kind.dtype == "float32" else rng.integers(0, 256, size, dtype=np.uint8)
    index = pipeline.write_shards(folder, {"x": x, "y": np.arange(rows)}, prefix=shape, pack=pack,
                                  shard_bytes=64 << 20, quiet=True)
    return [s.url for s in index.shards]


SERVERS: set[int] = set()  # the servers' processes, left out of the loader's memory
SEAWEEDFS_PORTS: dict[str, int] = {}  # (in the report: a test looks for files left behind by port)


def server_cpu_seconds() -> float:
    """CPU seconds the servers have run so far."""
    return sum(tree_cpu_seconds(pid) for pid in SERVERS)


class LoaderEpoch:
    """One epoch of a loader that has already played one (its workers are up, its connections
    open): the steady state a training run sees. Counts the requests of its last epoch, the
    peak PSS of the loader's processes (this one and its workers) over its epochs, and the least
    CPU seconds an epoch took of the loader's processes and of the servers (noise only adds).
    The loader's CPU includes that of the memory sampler's thread in this process; the workers
    of another loader (``aside``: the local one it takes turns with) are left out."""

    def __init__(self, source: str, workers: int, **options: Any) -> None:
        before = set(process_tree(os.getpid(), SERVERS))
        self.aside: set[int] = set()
        self.loader = pipeline.make_loader(source, num_workers=workers, batch_size=256, fields=["x", "y"], **options)
        self.index = pipeline.load_index(source)
        self.requests = 0
        self.forget()
        self()
        self.pids = set(process_tree(os.getpid(), SERVERS)) - before  # its workers (persistent: they stay)
        self.forget()  # the warm-up's (workers starting, connections opening) is not the steady state's

    def forget(self) -> None:
        """Start the peak and the least CPU afresh: what follows is measured on its own."""
        self.peak_pss, self.loader_cpu, self.server_cpu = 0, float("inf"), float("inf")

    def __call__(self) -> int:
        before = self.loader.stats()["requests"]
        skip = SERVERS | self.aside
        memory = TreeMemory(os.getpid(), pss=True, skip=skip)
        loader_cpu, server_cpu = tree_cpu_seconds(os.getpid(), skip), server_cpu_seconds()
        memory.start()
        try:
            samples = sum(len(batch["y"]) for batch in self.loader)
        finally:
            memory.stop()
        self.loader_cpu = min(self.loader_cpu, tree_cpu_seconds(os.getpid(), skip) - loader_cpu)
        self.server_cpu = min(self.server_cpu, server_cpu_seconds() - server_cpu)
        assert samples == self.index.samples, (samples, self.index.samples)
        self.requests = self.loader.stats()["requests"] - before
        self.peak_pss = max(self.peak_pss, memory.peak_pss)
        return self.index.bytes


T = TypeVar("T")


def taking_turns(runs: int, local: LoaderEpoch, remote: Callable[[], tuple[float, T]]) -> tuple[float, float, T]:
    """The best times of ``local``'s epochs and of ``remote``'s runs (each returns its seconds
    and what it read), taking turns ``runs`` times, and what ``remote``'s last run returned: a
    ratio of the two is of runs a second apart, whatever the shared machine's load did in the
    minutes between rows."""
    local.forget()
    best_local = best_remote = float("inf")
    for _ in range(runs):
        best_local = min(best_local, best_of(1, local)[0])
        seconds, result = remote()
        best_remote = min(best_remote, seconds)
    return best_local, best_remote, result


READ_AHEAD: int | None = None  # the loader's read_ahead, set by --read-ahead


def row(source: str, reader: str, seconds: float, moved: int, requests: int | None = None,
        peak_pss: int | None = None, cpu: tuple[float, float] | None = None) -> dict:
    """A row of the table; ``cpu``: the loader's and the servers' CPU seconds an epoch."""
    return {"source": source, "reader": reader, "seconds": seconds, "mb_per_s": moved / seconds / 1e6,
            "requests": requests, "peak_pss_mb": None if peak_pss is None else peak_pss / 1e6,
            "loader_cpu_s": None if cpu is None else cpu[0], "server_cpu_s": None if cpu is None else cpu[1]}


def loader_label(workers: int, how: str = "") -> str:
    return f"this loader ({workers} workers{', ' + how if how else ''})"


def local_row(local: LoaderEpoch, runs: int) -> dict:
    """The row of the loader on local files, measured on its own."""
    seconds, moved = best_of(runs, local)
    return row("local", loader_label(local.loader.num_workers), seconds, moved, requests=local.requests, peak_pss=local.peak_pss,
               cpu=(local.loader_cpu, local.server_cpu))


def alongside(local: LoaderEpoch, local_seconds: float) -> dict:
    """What a row keeps of the local epochs it took turns with."""
    return {"local_seconds": local_seconds, "local_mb_per_s": local.index.bytes / local_seconds / 1e6}


def loader_row(source: str, location: str, runs: int, local: LoaderEpoch, how: str = "", **options: Any) -> dict:
    """The row of the loader on ``location``, its epochs taking turns with those of ``local``.
    Each loader's CPU and memory leave out the other's workers, which idle meanwhile."""
    workers = local.loader.num_workers
    epoch = LoaderEpoch(location, workers, read_ahead=READ_AHEAD, **options)
    local.aside, epoch.aside = epoch.pids, local.pids
    try:
        local_seconds, seconds, moved = taking_turns(runs, local, lambda: best_of(1, epoch))
    finally:
        local.aside = set()
    result = row(source, loader_label(workers, how), seconds, moved, requests=epoch.requests,
                 peak_pss=epoch.peak_pss, cpu=(epoch.loader_cpu, epoch.server_cpu))
    return result | alongside(local, local_seconds) | {"local_cpu_s": local.loader_cpu}


def raw_row(source: str, reader: str, runs: int, local: LoaderEpoch, read: Callable[[], int]) -> dict:
    """The row of a raw client (``read`` reads the shards once), its runs taking turns with the
    epochs of ``local``."""
    local_seconds, seconds, moved = taking_turns(runs, local, lambda: best_of(1, read))
    return row(source, reader, seconds, moved) | alongside(local, local_seconds)


def range_clients(source: str, workers: int) -> list[tuple[str, dict[str, str]]]:
    """``(client, environment)`` for each way the ranges of ``source`` can be read here: over
    HTTP urllib3; over S3 presigned URLs on urllib3 (the default) and boto3; and obstore when it
    is installed (in the DataLoader workers; without workers, in this process)."""
    never = {"PIPELINE_OBSTORE": "never"}
    clients = [("urllib3", never)] if source == "http" else [
        ("presigned URLs, urllib3", never | {"PIPELINE_S3_PRESIGNED": "1"}),
        ("boto3", never | {"PIPELINE_S3_PRESIGNED": "0"})]
    try:
        import obstore  # noqa: F401
    except ImportError:
        return clients
    return clients + [("obstore", {"PIPELINE_OBSTORE": "workers" if workers else "always"})]


@contextlib.contextmanager
def client_env(env: dict[str, str]) -> Iterator[None]:
    """``env`` set for the loader made inside (its workers inherit it)."""
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in before.items():
            os.environ.pop(name)
            if value is not None:
                os.environ[name] = value


def client_rows(source: str, location: str, runs: int, local: LoaderEpoch) -> list[dict]:
    """The loader's row once per client its ranges can go through."""
    rows = []
    for client, env in range_clients(source, local.loader.num_workers):
        with client_env(env):
            rows.append(loader_row(source, location, runs, local, how=client))
    return rows


def ranged_rows(source: str, url: str, size: int, runs: int, local: LoaderEpoch) -> list[dict]:
    """:func:`ranged_row` per client, each in a child process: obstore used here would keep the
    workers of later loaders from it (it is not fork-safe)."""
    rows = []
    for client, env in range_clients(source, 0):
        with client_env(env), multiprocessing.get_context("fork").Pool(1) as pool:
            rows.append(ranged_row(source, url, size, runs, local, client, pool))
    return rows


def ranged_row(source: str, url: str, size: int, runs: int, local: LoaderEpoch, client: str, pool: Any) -> dict:
    """The row of bare ranged GETs (:func:`ranged_gets`) through ``client`` in ``pool``'s
    process, their runs taking turns with the epochs of ``local``. The CPU a request is the
    least of the runs' (noise only adds)."""
    cpu_ms: list[float] = []

    def run() -> tuple[float, tuple[int, int]]:
        seconds, moved, requests, cpu = pool.apply(ranged_gets, (url, size))
        cpu_ms.append(cpu)
        return seconds, (moved, requests)

    local_seconds, seconds, (moved, requests) = taking_turns(runs, local, run)
    reader = f"ranged GETs of {RANGE_BYTES >> 10} KB, {RANGE_THREADS} threads, {client}: {min(cpu_ms):.2f} ms CPU a request"
    return (row(source, reader, seconds, moved, requests=requests) | alongside(local, local_seconds)
            | {"cpu_ms_per_request": min(cpu_ms)})


def bench_http(folder: Path, names: list[str], runs: int, local: LoaderEpoch) -> list[dict]:
    url, process = start_nginx(folder / "nginx", folder)
    SERVERS.add(process.pid)
    try:
        curl = curl_all([f"{url}/data/{n}" for n in names], local.loader.num_workers)
        rows = [raw_row("http", "curl", runs, local, curl)]
        rows += client_rows("http", f"{url}/data/index.json", runs, local)
        shard = folder / "data" / names[0]
        return rows + ranged_rows("http", f"{url}/data/{names[0]}", shard.stat().st_size, runs, local)
    finally:
        SERVERS.discard(process.pid)
        stop(process)


def bench_s3(folder: Path, names: list[str], runs: int, local: LoaderEpoch) -> list[dict]:
    endpoint, process = start_seaweedfs(folder / "seaweedfs")
    SERVERS.add(process.pid)
    SEAWEEDFS_PORTS.update(process.ports)
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                       "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1"})
    try:
        import boto3

        client = boto3.client("s3")
        make_bucket("bench")
        for path in sorted((folder / "data").iterdir()):  # the shards and the index (json and bin)
            client.upload_file(str(path), "bench", f"data/{path.name}")
        whole_objects = boto3_all("bench", [f"data/{n}" for n in names], local.loader.num_workers)
        rows = [raw_row("s3", "boto3 get_object().read()", runs, local, whole_objects)]
        rows += client_rows("s3", "s3://bench/data/", runs, local)
        rows.append(loader_row("s3", "s3://bench/data/", runs, local, how="cache_dir, epochs 2+",
                               cache_dir=folder / "cache"))
        shard = folder / "data" / names[0]
        return rows + ranged_rows("s3", f"s3://bench/data/{names[0]}", shard.stat().st_size, runs, local)
    finally:
        SERVERS.discard(process.pid)
        stop(process)


def blank(value: float | None, spec: str) -> str:
    """A table cell: ``value`` formatted, or empty where there is none (the raw clients have no
    loader CPU or requests)."""
    return "" if value is None else format(value, spec)


def print_table(rows: list[dict]) -> None:
    """The rows as a Markdown table (each one's ratios added to it), then what the CPU of an
    epoch allows each remote loader row at most on this machine's cores. Each remote row is
    compared with the local epochs it took turns with (MB/s: the ranged GETs read other bytes)."""
    print("| source | reader | best (s) | MB/s | vs local loader | local alongside (s) | vs raw client "
          "| requests an epoch | peak PSS (MB) | loader CPU an epoch (s) | server CPU an epoch (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    raw: dict[str, float] = {}
    for r in rows:
        raw.setdefault(r["source"], r["mb_per_s"])  # each source's first row is its raw client
        r["vs_local"] = r["mb_per_s"] / r["local_mb_per_s"] if "local_mb_per_s" in r else None
        r["vs_raw"] = r["mb_per_s"] / raw[r["source"]]
        vs_raw = "" if r["source"] == "local" else f"{r['vs_raw']:.0%}"
        print(f"| {r['source']} | {r['reader']} | {r['seconds']:.2f} | {r['mb_per_s']:,.0f} | "
              f"{blank(r['vs_local'], '.0%')} | "
              f"{blank(r.get('local_seconds'), '.2f')} | {vs_raw} | {blank(r['requests'], 'd')} | "
              f"{blank(r['peak_pss_mb'], ',.0f')} | {blank(r['loader_cpu_s'], '.2f')} | "
              f"{blank(r['server_cpu_s'], '.2f')} |")
    cores = len(os.sched_getaffinity(0))
    print(f"\nCPU ceilings on these {cores} cores, which the loader shares with the servers: an epoch cannot take "
          "less wall time than (loader CPU + server CPU) / cores.")
    for r in rows:
        if "local_cpu_s" not in r:  # the local row, and the raw clients: no loader CPU
            continue
        ceiling = r["local_seconds"] * cores / max(r["loader_cpu_s"] + r["server_cpu_s"], 1e-9)
        r["cpu_ceiling_vs_local"] = ceiling
        print(f"- {r['source']}, {r['reader']}: loader {r['loader_cpu_s']:.2f} s (local {r['local_cpu_s']:.2f}) "
              f"+ server {r['server_cpu_s']:.2f} s of CPU an epoch: at most {ceiling:.0%} of the local loader, "
              f"reached {r['vs_local']:.0%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=["http", "s3", "both"], default="both")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="embeddings",
                        help="embeddings (768 float32, pack 16) or images (3x224x224 uint8, pack 1)")
    parser.add_argument("--rows", type=int, help="samples (default 200,000 embeddings: 614 MB; 4,000 images: 602 MB)")
    parser.add_argument("--pack", type=int, help="samples a record (default: the shape's)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2, help="epochs each loader plays, taking turns with the local one")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results")
    parser.add_argument("--read-ahead", type=int, help="the loader's read_ahead (default: the loader's default)")
    parser.add_argument("--quick", action="store_true", help="a few MB, one run: a smoke run in seconds")
    args = parser.parse_args(argv)
    shape = SHAPES[args.shape]
    args.rows = shape.quick_rows if args.quick else args.rows or shape.rows
    args.pack = args.pack or shape.pack
    args.runs = 1 if args.quick else args.runs
    global READ_AHEAD
    READ_AHEAD = args.read_ahead
    # The loaders here take turns, and the one waiting stands for back-to-back epochs: its
    # workers must not give their memory back as if training had paused (idle_trim).
    idle_trim.IDLE_S = 3600.0

    folder = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    try:
        names = build_shards(folder / "data", args.shape, args.rows, args.pack)
        local = LoaderEpoch(str(folder / "data"), args.workers, read_ahead=READ_AHEAD)
        rows: list[dict] = [local_row(local, args.runs)]
        if args.source in ("http", "both"):
            rows += bench_http(folder, names, args.runs, local)
        if args.source in ("s3", "both"):
            rows += bench_s3(folder, names, args.runs, local)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print_table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_remote.json").write_text(json.dumps({"config": vars(args) | {"out": str(args.out)},
                                                            "rows": rows, "seaweedfs_ports": SEAWEEDFS_PORTS},
                                                           indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
