#!/usr/bin/env python
"""Indexing shards written by webdataset in place: how fast, and what damage costs after.

1. Speed: ``index_shards`` over webdataset shards (image-like samples of ~100 KB and small
   ones of ~2 KB), from local disk and over HTTP (nginx on 127.0.0.1), against the raw reads of
   the same bytes in the same run (``cat`` to /dev/null locally, ``curl`` over HTTP): GB/s and
   the ratio, and peak RSS of the indexer.
2. Faults: one shard damaged three ways (truncated, a flipped payload byte, a flipped tar
   header byte), streamed with ``on_error="skip"`` with and without the index: the samples
   lost in each case.

    python scripts/bench_indexing.py                 # ~1 GB of shards
    python scripts/bench_indexing.py --quick         # seconds
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import webdataset as wds

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib.common import best_of  # noqa: E402

import pipeline  # noqa: E402
from pipeline.format.tar import iter_members  # noqa: E402
from tests.storage.servers import start_nginx, stop  # noqa: E402

warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")


def write_shards(folder: Path, samples: int, sample_bytes: int, shards: int) -> list[Path]:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 255, sample_bytes, dtype=np.uint8)
    paths = []
    per_shard = -(-samples // shards)
    for s in range(shards):
        path = folder / f"w-{s:06d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for n in range(s * per_shard, min((s + 1) * per_shard, samples)):
                sink.write({"__key__": f"s{n:08d}", "npy": payload, "cls": n})
        paths.append(path)
    return paths


def index_command(*args: str) -> None:
    """``pipeline index`` as a user runs it (its start-up and worker processes included)."""
    subprocess.run([sys.executable, "-m", "pipeline", "index", *args, "--workers", "2", "--overwrite", "--quiet"],
                   check=True)


def speed(folder: Path, paths: list[Path], nginx: str | None, runs: int) -> list[dict]:
    total = sum(p.stat().st_size for p in paths)
    rows = []
    cat = ["cat", *map(str, paths)]
    raw_local = best_of(runs, lambda: subprocess.run(cat, stdout=subprocess.DEVNULL, check=True))[0]
    ours_local = best_of(runs, lambda: index_command(*map(str, paths)))[0]
    rows.append({"source": "local", "gb": total / 1e9, "raw_s": raw_local, "index_s": ours_local})
    if nginx is not None:
        urls = [f"{nginx}/{folder.name}/{p.name}" for p in paths]
        curl = ["curl", "-s", *(part for url in urls for part in ("-o", "/dev/null", url))]
        raw_http = best_of(runs, lambda: subprocess.run(curl, check=True))[0]
        out = folder.parent / "http-index"
        ours_http = best_of(runs, lambda: index_command(*urls, "--output", str(out)))[0]
        rows.append({"source": "http", "gb": total / 1e9, "raw_s": raw_http, "index_s": ours_http})
    for row in rows:
        row["raw_gb_s"] = row["gb"] / row["raw_s"]
        row["index_gb_s"] = row["gb"] / row["index_s"]
        row["ratio"] = row["raw_s"] / row["index_s"]
    return rows


def damage(shard: Path, how: str) -> None:
    """Damage the middle sample's ``.npy`` member of ``shard``: cut the shard there, flip a byte
    of its data, or flip a byte of its tar header."""
    data = bytearray(shard.read_bytes())
    members = [m for m in iter_members(bytes(data), str(shard)) if m.name.endswith(".npy")]
    member = members[len(members) // 2]
    body = bytes(data).index(bytes(member.data), member.offset)  # after its headers
    if how == "truncated":
        del data[member.offset:]
    elif how == "payload byte":
        data[body + len(member.data) // 2] ^= 0x10
    else:  # header byte: the member's name field
        data[member.offset + 20] ^= 0x10
    shard.write_bytes(bytes(data))


def delivered(source, payload: np.ndarray, **options) -> tuple[int, int]:
    """Distinct samples delivered right, and samples delivered wrong, in one epoch under the skip policy."""
    loader = pipeline.make_loader(source, num_workers=0, batch_size=64, on_error="skip", shuffle=False, **options)
    right, wrong = set(), 0
    for batch in loader:
        for n, x in zip(batch["cls"].tolist(), batch["npy"]):
            if np.array_equal(x.numpy(), payload):
                right.add(n)
            else:
                wrong += 1
    return len(right), wrong


def faults(folder: Path, samples: int, sample_bytes: int) -> list[dict]:
    payload = np.random.default_rng(0).integers(0, 255, sample_bytes, dtype=np.uint8)
    rows = []
    for how in ("truncated", "payload byte", "header byte"):
        copy = folder.parent / f"damaged-{how.replace(' ', '-')}"
        shutil.copytree(folder, copy)
        pipeline.index_shards(copy, overwrite=True, quiet=True)
        damage(sorted(copy.glob("*.tar"))[1], how)
        bare = folder.parent / f"{copy.name}-no-index"  # the same damaged shards, with no index beside them
        shutil.copytree(copy, bare, ignore=shutil.ignore_patterns("index.*"))
        with_index, wrong_indexed = delivered(copy, payload)
        without, wrong = delivered(sorted(map(str, bare.glob("*.tar"))), payload, fields=["cls", "npy"])
        rows.append({"damage": how, "lost_with_index": samples - with_index, "wrong_with_index": wrong_indexed,
                     "lost_without": samples - without, "wrong_without": wrong})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few MB, one run: a check that it works")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results", help="folder for indexing.json")
    args = parser.parse_args(argv)
    shapes = [("images", 100_000, 10_000, 40), ("small", 2_000, 250_000, 40)]
    runs = 1 if args.quick else 3
    if args.quick:
        shapes = [("images", 100_000, 200, 4), ("small", 2_000, 2_000, 4)]
    results: dict = {"speed": {}, "faults": {}}
    with tempfile.TemporaryDirectory(prefix="pipeline-indexing-") as tmp:
        root = Path(tmp)
        nginx, process = start_nginx(root / "nginx", root) if shutil.which("nginx") else (None, None)
        try:
            for name, sample_bytes, samples, shards in shapes:
                paths = write_shards(root / name, samples, sample_bytes, shards)
                results["speed"][name] = speed(root / name, paths, nginx, runs)
            name, sample_bytes, samples, _ = shapes[0]
            results["faults"] = faults(root / name, samples, sample_bytes)
        finally:
            if process is not None:
                stop(process)
    results["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"{'shape':<8} {'source':<6} {'GB':>6} {'raw GB/s':>9} {'index GB/s':>11} {'ratio':>6}")
    for name, rows in results["speed"].items():
        for row in rows:
            print(f"{name:<8} {row['source']:<6} {row['gb']:>6.2f} {row['raw_gb_s']:>9.2f} {row['index_gb_s']:>11.2f} "
                  f"{row['ratio']:>6.2f}")
    print(f"peak RSS of the indexer (largest child process): {results['peak_rss_mb']:.0f} MB")
    print(f"\n{'damage':<14} {'indexed: lost':>14} {'wrong':>6} {'no index: lost':>15} {'wrong':>6}")
    for row in results["faults"]:
        print(f"{row['damage']:<14} {row['lost_with_index']:>14} {row['wrong_with_index']:>6} "
              f"{row['lost_without']:>15} {row['wrong_without']:>6}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "indexing.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
