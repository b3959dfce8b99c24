#!/usr/bin/env python
"""Streaming from remote storage: this loader over HTTP (nginx) and S3 (SeaweedFS), both on
127.0.0.1, against the raw client reading the same bytes (``curl`` for HTTP, boto3's
``get_object().read()`` for S3).

Why: remote reads add requests, TLS-free loopback transfers and our retry/resume layer; the
question is how much of the raw client's bandwidth the loader keeps while it also decodes,
shuffles and batches. Target: >= 70% of the raw client's bytes/s for embeddings, with 2
workers. Both run in the same process tree, one after the other, on the same shards, twice
each (the better run counts: noise on a shared machine only adds time).

Usage::

    python scripts/bench_remote.py --source http            # or s3, or both (default)
    python scripts/bench_remote.py --rows 20000 --source s3 # smaller
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pipeline  # noqa: E402
from tests.storage.servers import ACCESS_KEY, SECRET_KEY, start_nginx, start_seaweedfs, stop  # noqa: E402


def build_embeddings(folder: Path, rows: int, pack: int) -> list[str]:
    """Embedding shards (rows x 768 float32 + label); returns the shard names."""
    rng = np.random.default_rng(0)
    x = rng.random((rows, 768), dtype=np.float32)
    index = pipeline.write_shards(folder, {"x": x, "y": np.arange(rows)}, prefix="emb", pack=pack,
                                  shard_bytes=64 << 20, quiet=True)
    return [s.url for s in index.shards]


def best_of(runs: int, action: Callable[[], int]) -> tuple[float, int]:
    """Best wall time of ``runs`` runs of ``action`` (which returns bytes moved)."""
    best, moved = float("inf"), 0
    for _ in range(runs):
        started = time.perf_counter()
        moved = action()
        best = min(best, time.perf_counter() - started)
    return best, moved


def loader_epoch(source: str, workers: int) -> Callable[[], int]:
    """One epoch of a loader that has already played one (its workers are up, its connections
    open): the steady state a training run sees."""
    loader = pipeline.make_loader(source, num_workers=workers, batch_size=256, fields=["x", "y"])
    index = pipeline.load_index(source)
    sum(len(batch["y"]) for batch in loader)

    def run() -> int:
        samples = sum(len(batch["y"]) for batch in loader)
        assert samples == index.samples
        return index.bytes
    return run


def curl_all(urls: list[str], parallel: int) -> Callable[[], int]:
    def fetch(url: str) -> int:
        out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{size_download}", url],
                             check=True, capture_output=True, text=True).stdout
        return int(float(out))

    def run() -> int:
        with ThreadPoolExecutor(parallel) as pool:
            return sum(pool.map(fetch, urls))
    return run


def boto3_all(bucket: str, keys: list[str], parallel: int) -> Callable[[], int]:
    import boto3

    client = boto3.client("s3")

    def fetch(key: str) -> int:
        return len(client.get_object(Bucket=bucket, Key=key)["Body"].read())

    def run() -> int:
        with ThreadPoolExecutor(parallel) as pool:
            return sum(pool.map(fetch, keys))
    return run


def row(source: str, reader: str, seconds: float, moved: int) -> dict:
    return {"source": source, "reader": reader, "seconds": seconds, "mb_per_s": moved / seconds / 1e6}


def bench_http(folder: Path, names: list[str], runs: int, workers: int) -> list[dict]:
    url, process = start_nginx(folder / "nginx", folder)
    try:
        rows = [row("http", "curl", *best_of(runs, curl_all([f"{url}/data/{n}" for n in names], workers)))]
        rows.append(row("http", f"this loader ({workers} workers)",
                        *best_of(runs, loader_epoch(f"{url}/data/index.json", workers))))
        return rows
    finally:
        stop(process)


def bench_s3(folder: Path, names: list[str], runs: int, workers: int) -> list[dict]:
    endpoint, process = start_seaweedfs(folder / "seaweedfs")
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                       "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1"})
    try:
        import boto3

        client = boto3.client("s3")
        for _ in range(50):
            try:
                client.create_bucket(Bucket="bench")
                break
            except Exception:  # noqa: BLE001 - the gateway may not be ready yet
                time.sleep(0.2)
        for name in names + ["index.json"]:
            client.upload_file(str(folder / "data" / name), "bench", f"emb/{name}")
        rows = [row("s3", "boto3 get_object().read()",
                    *best_of(runs, boto3_all("bench", [f"emb/{n}" for n in names], workers)))]
        rows.append(row("s3", f"this loader ({workers} workers)", *best_of(runs, loader_epoch("s3://bench/emb/", workers))))
        return rows
    finally:
        stop(process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=["http", "s3", "both"], default="both")
    parser.add_argument("--rows", type=int, default=200_000, help="embedding samples (default 200,000: 614 MB)")
    parser.add_argument("--pack", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = parser.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    try:
        names = build_embeddings(folder / "data", args.rows, args.pack)
        rows: list[dict] = []
        if args.source in ("http", "both"):
            rows += bench_http(folder, names, args.runs, args.workers)
        if args.source in ("s3", "both"):
            rows += bench_s3(folder, names, args.runs, args.workers)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print("| source | reader | best (s) | MB/s | vs raw client |\n|---|---|---|---|---|")
    raw: dict[str, float] = {}
    for r in rows:
        raw.setdefault(r["source"], r["mb_per_s"])
        ratio = r["mb_per_s"] / raw[r["source"]]
        r["vs_raw"] = ratio
        print(f"| {r['source']} | {r['reader']} | {r['seconds']:.2f} | {r['mb_per_s']:,.0f} | {ratio:.0%} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_remote.json").write_text(json.dumps({"config": vars(args) | {"out": str(args.out)},
                                                            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
