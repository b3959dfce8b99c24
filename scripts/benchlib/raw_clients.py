"""The raw clients a remote loader is compared with: whole objects through ``curl`` and boto3,
and bare ranged GETs through the loader's own clients (its reads, without its decoding). Each
reads its bytes once a call, so that its runs can take turns with the local loader's epochs."""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from .common import best_of


def curl_all(urls: list[str], parallel: int) -> Callable[[], int]:
    def fetch(url: str) -> int:
        out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{size_download}", url],
                             check=True, capture_output=True, text=True).stdout
        return int(float(out))

    def run() -> int:
        with ThreadPoolExecutor(max(parallel, 1)) as pool:
            return sum(pool.map(fetch, urls))
    return run


def boto3_all(bucket: str, keys: list[str], parallel: int) -> Callable[[], int]:
    import boto3

    client = boto3.client("s3")

    def fetch(key: str) -> int:
        return len(client.get_object(Bucket=bucket, Key=key)["Body"].read())

    def run() -> int:
        with ThreadPoolExecutor(max(parallel, 1)) as pool:
            return sum(pool.map(fetch, keys))
    return run


RANGE_BYTES, RANGE_THREADS = 512 << 10, 8


def ranged_gets(url: str, size: int) -> tuple[float, int, int, float]:
    """Ranged GETs of :data:`RANGE_BYTES` at random places of one object (of ``size`` bytes),
    :data:`RANGE_THREADS` at a time, into reused buffers (the loader's reads, without its
    decoding), once: the seconds, bytes and requests they took, and the CPU this process spent
    on each request in milliseconds (what caps a worker's requests on a fast network)."""
    from pipeline.storage.buffers import process_pool
    from pipeline.storage.opener import read_range_into

    starts = np.random.default_rng(0).permutation(max(size // RANGE_BYTES, 1))[:200] * RANGE_BYTES

    def read(start: int) -> int:
        out = process_pool().take(min(start + RANGE_BYTES, size) - start)
        read_range_into(url, start, out)
        return len(out)

    def run() -> int:
        with ThreadPoolExecutor(RANGE_THREADS) as pool:
            return sum(pool.map(read, starts.tolist()))

    before = time.process_time()  # (the process's CPU in nanoseconds: os.times() counts 10 ms ticks, and the few
    seconds, moved = best_of(1, run)  # requests of a small object took none of them, 0 ms a request)
    cpu_ms = (time.process_time() - before) / len(starts) * 1e3
    return seconds, moved, len(starts), cpu_ms
