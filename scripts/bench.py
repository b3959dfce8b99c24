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
   random permutation (the ideal: 10 classes, log2(10) = 3.32 bits).

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

Usage (results also go to ``bench-results/bench.json`` and ``bench-results/bench.png``)::

    python scripts/bench.py --quick     # smoke run on tiny data, about a minute (a test runs it)
    python scripts/bench.py             # full run, ~30 minutes, ~12 GB free in --tmp
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MB = 1e6


def _checkout_module(name: str, relative: str) -> Any:
    """A module of this checkout's library, loaded from its file: the library itself is imported
    from the snapshot under test (``--rev``), which may predate the module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


_memory = _checkout_module("checkout_memory", "pipeline/measure/memory.py")
TreeMemory, process_tree, rss_bytes = _memory.TreeMemory, _memory.process_tree, _memory.rss_bytes
BATCH = 256
CLASSES = 1000
LABEL_BYTES = 8  # int64
WDS_SHUFFLE = 1000
WDS_SHARD_SHUFFLE = 100
SHUFFLE_CLASSES = 10
SHUFFLE_FEATURES = 10
MEMORY_DIM = 768
MEMORY_PACK = 16
MEMORY_WORKERS = 2
MEMORY_ALLOWANCE_MB = 250
SHARD_BYTES = 256 << 20
_CHUNK_BYTES = 64 << 20

QUICK = dict(tabular_rows=5_000, embedding_rows=1_000, image_rows=100, pt_rows=200,
             memory_rows=5_000, shuffle_per_class=300)
FULL = dict(tabular_rows=2_000_000, embedding_rows=200_000, image_rows=10_000, pt_rows=20_000,
            memory_rows=1_400_000, shuffle_per_class=20_000)
SHAPES = ("tabular", "embeddings", "images")

OURS, WDS, JOBLIB, PT, MEMMAP, CAT = ("this loader", "webdataset", "joblib batches", ".pt per sample",
                                      "memmap gather", "cat (bytes)")


# -- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    tabular_rows: int
    embedding_rows: int
    image_rows: int
    pt_rows: int
    memory_rows: int
    shuffle_per_class: int
    shapes: tuple[str, ...]
    workers: tuple[int, ...]
    epochs: int
    embedding_pack: int
    skip_slow: bool
    skip_shuffle: bool
    skip_memory: bool
    quick: bool
    rev: str | None
    tmp: str | None
    out: Path


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument("--tmp", help="folder for the generated data (default: the system temp dir)")
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


@dataclass(frozen=True)
class Shape:
    """A kind of sample: ``rows`` samples of ``dims`` of ``dtype`` plus an int64 label."""

    name: str
    rows: int
    dims: tuple[int, ...]
    dtype: str
    pack: int

    @property
    def x_bytes(self) -> int:
        return int(np.prod(self.dims)) * np.dtype(self.dtype).itemsize

    @property
    def payload_bytes(self) -> int:
        """Bytes of one sample's arrays: what a model receives."""
        return self.x_bytes + LABEL_BYTES


def shapes_of(cfg: Config) -> list[Shape]:
    every = {
        "tabular": Shape("tabular", cfg.tabular_rows, (10,), "float32", 256),
        "embeddings": Shape("embeddings", cfg.embedding_rows, (768,), "float32", cfg.embedding_pack),
        "images": Shape("images", cfg.image_rows, (3, 224, 224), "uint8", 1),
    }
    return [every[name] for name in cfg.shapes]


# -- generated data --------------------------------------------------------------------------


@dataclass(frozen=True)
class Layouts:
    """Where one shape's data lives, in every layout a reader needs."""

    folder: Path

    @property
    def x_npy(self) -> Path:
        return self.folder / "x.npy"

    @property
    def y_npy(self) -> Path:
        return self.folder / "y.npy"

    @property
    def ours(self) -> Path:
        return self.folder / "ours"

    @property
    def wds(self) -> Path:
        return self.folder / "wds"

    @property
    def joblib(self) -> Path:
        return self.folder / "joblib"

    @property
    def pt(self) -> Path:
        return self.folder / "pt"

    def wds_urls(self) -> list[str]:
        return sorted(str(p) for p in self.wds.glob("*.tar"))

    def our_shards(self) -> list[str]:
        return sorted(str(p) for p in self.ours.glob("*.tar"))


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def random_rows(rng: np.random.Generator, n: int, dims: tuple[int, ...], dtype: str) -> np.ndarray:
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal((n, *dims), dtype=np.dtype(dtype))
    return rng.integers(0, 256, (n, *dims), dtype=np.dtype(dtype))


def write_npy(path: Path, shape: tuple[int, ...], dtype: str, fill: Callable[[int], np.ndarray]) -> Path:
    """Write a ``.npy`` a chunk of rows at a time; ``fill(n)`` returns the next ``n`` rows."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
    step = max(1, _CHUNK_BYTES // row_bytes)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        for start in range(0, shape[0], step):
            np.ascontiguousarray(fill(min(step, shape[0] - start)), dtype=dtype).tofile(f)
    return path


def generate_arrays(shape: Shape, where: Layouts, seed: int) -> None:
    rng = np.random.default_rng(seed)
    write_npy(where.x_npy, (shape.rows, *shape.dims), shape.dtype,
              lambda n: random_rows(rng, n, shape.dims, shape.dtype))
    write_npy(where.y_npy, (shape.rows,), "int64", lambda n: rng.integers(0, CLASSES, n, dtype=np.int64))


def shard_bytes_for(total_bytes: int) -> int:
    """256 MiB shards, or smaller so that small datasets still make >= 8 shards (as the
    webdataset shards do: webdataset splits whole shards between workers)."""
    return int(max(1 << 20, min(SHARD_BYTES, total_bytes // 8)))


def build_ours(shape: Shape, where: Layouts) -> None:
    import pipeline

    pipeline.write_shards(where.ours, {"x": str(where.x_npy), "y": str(where.y_npy)}, prefix="train",
                          pack=shape.pack, shard_bytes=shard_bytes_for(shape.rows * shape.payload_bytes),
                          workers=2, overwrite=True, quiet=True)


def wds_sample_bytes(shape: Shape) -> int:
    """Bytes of one sample in a webdataset tar: a 512-byte header per member, each member
    padded to 512 bytes (the ``.npy`` has a 128-byte header of its own)."""
    pad = lambda n: -(-n // 512) * 512  # noqa: E731
    return 512 + pad(128 + shape.x_bytes) + 512 + 512


def write_wds_part(x_path: str, y_path: str, start: int, stop: int, pattern: str, maxsize: int,
                   maxcount: int) -> None:
    """Rows ``[start, stop)`` as webdataset shards, the usual way: one sample at a time."""
    import webdataset as wds

    x = np.load(x_path, mmap_mode="r")
    y = np.load(y_path, mmap_mode="r")
    step = max(1, _CHUNK_BYTES // max(x[0].nbytes, 1))
    with wds.ShardWriter(pattern, maxcount=maxcount, maxsize=maxsize, verbose=0) as sink:
        for lo in range(start, stop, step):
            xs, ys = np.array(x[lo:min(lo + step, stop)]), np.array(y[lo:min(lo + step, stop)])
            for i in range(len(xs)):
                sink.write({"__key__": f"{lo + i:012d}", "npy": xs[i], "cls": int(ys[i])})


def build_wds(x_path: Path, y_path: Path, rows: int, out: Path, maxsize: int, maxcount: int,
              parts: int) -> None:
    """Write in ``parts`` processes (contiguous row ranges, shards named by part): writing
    2M small samples one at a time takes minutes, and this is preparation, not measurement."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    out.mkdir(parents=True, exist_ok=True)
    bounds = [rows * i // parts for i in range(parts + 1)]
    jobs = [(str(x_path), str(y_path), bounds[i], bounds[i + 1], str(out / f"wds-{i}-%06d.tar"), maxsize, maxcount)
            for i in range(parts)]
    if parts == 1:
        write_wds_part(*jobs[0])
        return
    with ProcessPoolExecutor(parts, mp_context=get_context("spawn")) as pool:
        for future in [pool.submit(write_wds_part, *job) for job in jobs]:
            future.result()


def build_joblib(where: Layouts) -> None:
    """``x_<B>.job``/``y_<B>.job``: batch ``B`` of 256 samples as two arrays."""
    import joblib

    x = np.load(where.x_npy, mmap_mode="r")
    y = np.load(where.y_npy, mmap_mode="r")
    where.joblib.mkdir()
    for b, lo in enumerate(range(0, len(x), BATCH)):
        joblib.dump(np.array(x[lo:lo + BATCH]), where.joblib / f"x_{b}.job")
        joblib.dump(np.array(y[lo:lo + BATCH]), where.joblib / f"y_{b}.job")


def build_pt(where: Layouts, rows: int) -> None:
    """``<i>.pt`` holding sample ``i``'s features, for the first ``rows`` samples; labels in
    ``labels.npy`` (the recipe keeps them in a dict in memory)."""
    import torch

    x = np.load(where.x_npy, mmap_mode="r")
    y = np.load(where.y_npy, mmap_mode="r")
    where.pt.mkdir()
    for i in range(rows):
        torch.save(torch.from_numpy(np.array(x[i])), where.pt / f"{i}.pt")
    np.save(where.pt / "labels.npy", np.array(y[:rows]))


def warm_page_cache(folder: Path) -> None:
    """Sync, then read every file once, so that every reader starts from the page cache."""
    os.sync()
    buffer = bytearray(_CHUNK_BYTES)
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buffer):
                    pass


def prepare_shape(cfg: Config, shape: Shape, where: Layouts, seed: int) -> None:
    where.folder.mkdir(parents=True)
    started = time.perf_counter()
    log(f"[{shape.name}] generating {shape.rows:,} samples ({shape.rows * shape.payload_bytes / 1e9:.2f} GB)...")
    generate_arrays(shape, where, seed)
    log(f"[{shape.name}] our shards (pack={shape.pack})...")
    build_ours(shape, where)
    wds_total = shape.rows * wds_sample_bytes(shape)
    shards = max(8, -(-wds_total // SHARD_BYTES))
    log(f"[{shape.name}] webdataset shards ({wds_total / 1e9:.2f} GB)...")
    build_wds(where.x_npy, where.y_npy, shape.rows, where.wds, 1 << 40, -(-shape.rows // shards),
              parts=2 if shape.rows >= 100_000 else 1)
    if not cfg.skip_slow:
        log(f"[{shape.name}] joblib batch files and {min(cfg.pt_rows, shape.rows):,} .pt files...")
        build_joblib(where)
        build_pt(where, min(cfg.pt_rows, shape.rows))
    warm_page_cache(where.folder)
    log(f"[{shape.name}] data ready in {time.perf_counter() - started:.0f} s")


def run_child(spec: dict[str, Any], pss: bool = False) -> dict[str, Any]:
    """Run one case in a fresh process while sampling its process tree's memory."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    monitor = TreeMemory(proc.pid, pss)
    monitor.start()
    out, err = proc.communicate()
    monitor.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"case {spec['kind']} failed (exit {proc.returncode}):\n{err[-4000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_mb"] = monitor.peak_rss / MB
    result["peak_pss_mb"] = monitor.peak_pss / MB if pss else None
    result["processes"] = monitor.peak_processes
    result["rss_timeline"] = monitor.timeline
    result["loadavg_1m"] = os.getloadavg()[0]  # high when something else ran meanwhile
    return result


def thin_timeline(timeline: list[tuple[float, float]], start: float, points: int = 200) -> list[tuple[float, float]]:
    """At most ``points`` samples of a timeline, times in seconds from ``start``."""
    step = max(1, len(timeline) // points)
    return [(round(t - start, 3), rss) for t, rss in timeline[::step]]


# -- the readers, built inside the child process -----------------------------------------------


class JoblibBatches:
    """The "save batches with joblib" recipe: item ``B`` is batch file ``B``, loaded whole."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.count = len([n for n in os.listdir(folder) if n.startswith("x_")])

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        import joblib

        return joblib.load(f"{self.folder}/x_{b}.job"), joblib.load(f"{self.folder}/y_{b}.job")


class SampleFiles:
    """The "one .pt file per sample" recipe: ``torch.load`` per item, labels from a dict."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        labels = np.load(f"{folder}/labels.npy")
        self.labels = {i: int(label) for i, label in enumerate(labels)}

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch

        return torch.load(f"{self.folder}/{i}.pt"), self.labels[i]


class MemmapBatches:
    """Random batches gathered from ``.npy`` memmaps: item ``B`` is rows
    ``sorted(permutation[B * 256:(B + 1) * 256])``, the permutation drawn once."""

    def __init__(self, x_path: str, y_path: str, batch_size: int, seed: int) -> None:
        self.x = np.load(x_path, mmap_mode="r")
        self.y = np.load(y_path, mmap_mode="r")
        self.batch_size = batch_size
        self.order = np.random.default_rng(seed).permutation(len(self.x))

    def __len__(self) -> int:
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, b: int) -> tuple[Any, Any]:
        import torch

        rows = np.sort(self.order[b * self.batch_size:(b + 1) * self.batch_size])
        return torch.from_numpy(self.x[rows]), torch.from_numpy(self.y[rows])


class TinyBatches:
    """Small batches, slowly: a DataLoader's fixed cost in memory, with no data to hold."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, b: int) -> tuple[Any, Any]:
        import torch

        time.sleep(0.05)
        return torch.zeros(BATCH, dtype=torch.float32), torch.zeros(BATCH, dtype=torch.int64)


def our_loader(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import pipeline

    options = {"shuffle_buffer": spec["shuffle_buffer"]} if spec.get("shuffle_buffer") else {}
    loader = pipeline.make_loader(spec["data"], num_workers=spec["workers"], batch_size=BATCH, seed=0, **options)
    dataset = loader.dataset
    info = {"shuffle_buffer": dataset.shuffle_buffer, "sample_bytes": dataset.sample_bytes(),
            "len": len(loader)}
    return loader, info


def wds_loader(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import webdataset as wds

    dataset = (wds.WebDataset(spec["data"], shardshuffle=WDS_SHARD_SHUFFLE).shuffle(WDS_SHUFFLE).decode()
               .to_tuple("npy", "cls").batched(BATCH))
    return wds.WebLoader(dataset, batch_size=None, num_workers=spec["workers"]), {"shards": len(spec["data"])}


def joblib_loader(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from torch.utils.data import DataLoader

    return DataLoader(JoblibBatches(spec["data"]), batch_size=None, shuffle=True, num_workers=spec["workers"]), {}


def pt_loader(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from torch.utils.data import DataLoader

    return DataLoader(SampleFiles(spec["data"]), batch_size=BATCH, shuffle=True, num_workers=spec["workers"]), {}


def memmap_loader(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from torch.utils.data import DataLoader

    x, y = spec["data"]
    return DataLoader(MemmapBatches(x, y, BATCH, seed=0), batch_size=None, num_workers=spec["workers"]), {}


def floor_loader(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from torch.utils.data import DataLoader

    import pipeline.stream.loader  # noqa: F401  (what our loader's process imports)

    workers = spec["workers"]
    return DataLoader(TinyBatches(), batch_size=None, num_workers=workers, persistent_workers=workers > 0,
                      prefetch_factor=2 if workers else None), {}


LOADERS: dict[str, Callable[[dict[str, Any]], tuple[Any, dict[str, Any]]]] = {
    "ours": our_loader, "webdataset": wds_loader, "joblib": joblib_loader, "pt": pt_loader,
    "memmap": memmap_loader, "floor": floor_loader,
}


def batch_labels(batch: Any) -> Any:
    """The label tensor of a batch: ``batch["y"]`` for our dicts, item 1 of the tuples."""
    return batch["y"] if isinstance(batch, dict) else batch[1]


def play_epoch(loader: Any, keep_labels: bool) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Iterate one epoch; the time to the first batch is counted from ``iter()``."""
    labels: list[np.ndarray] = []
    samples = batches = 0
    first: float | None = None
    wall_start = time.time()
    start = time.perf_counter()
    for batch in loader:
        y = batch_labels(batch)
        if first is None:
            first = time.perf_counter() - start
        samples += len(y)
        batches += 1
        if keep_labels:
            labels.append(np.asarray(y).copy())
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "samples": samples, "batches": batches, "first_batch_s": first,
            "wall_start": wall_start, "wall_end": time.time()}, labels


def label_stats(batches: list[np.ndarray], classes: int) -> dict[str, float]:
    """Mean distinct classes and mean label entropy (bits) over the full batches."""
    full = [b for b in batches if len(b) == BATCH]
    distinct = [len(np.unique(b)) for b in full]
    entropy = []
    for b in full:
        p = np.bincount(b, minlength=classes) / len(b)
        p = p[p > 0]
        entropy.append(float(-(p * np.log2(p)).sum()))
    return {"batches": len(full), "distinct_mean": float(np.mean(distinct)), "distinct_min": int(np.min(distinct)),
            "entropy_mean_bits": float(np.mean(entropy))}


def child_main(spec: dict[str, Any]) -> None:
    """Run one case described by ``spec`` and print its result as a JSON line."""
    loader, info = LOADERS[spec["kind"]](spec)
    epochs, labels = [], []
    for _ in range(spec["epochs"]):
        result, labels = play_epoch(loader, spec.get("labels", False))
        epochs.append(result)
    library = sys.modules.get("pipeline")
    out: dict[str, Any] = {"epochs": epochs, "info": {**info, "pipeline": getattr(library, "__file__", None)}}
    if spec.get("labels"):
        out["label_stats"] = label_stats(labels, SHUFFLE_CLASSES)
    print(json.dumps(out))


# -- throughput cases --------------------------------------------------------------------------


@dataclass
class Row:
    """One measured reader on one shape with one number of workers."""

    shape: str
    loader: str
    workers: int | None
    samples: int
    seconds: float
    payload_bytes: int
    first_batch_s: float | None = None
    peak_rss_mb: float | None = None
    epoch_seconds: list[float] = field(default_factory=list)
    note: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.samples * self.payload_bytes / self.seconds / MB

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_s": self.samples_per_s, "mb_per_s": self.mb_per_s}


def loader_row(shape: Shape, name: str, workers: int, spec: dict[str, Any], expected: int, note: str = "") -> Row:
    result = run_child({**spec, "workers": workers})
    epochs = result["epochs"]
    best = min(epochs, key=lambda e: e["seconds"])
    counts = {e["samples"] for e in epochs}
    if counts != {expected}:
        note = (note + "; " if note else "") + f"delivered {sorted(counts)} samples, expected {expected}"
    row = Row(shape.name, name, workers, best["samples"], best["seconds"], shape.payload_bytes,
              epochs[0]["first_batch_s"], result["peak_rss_mb"], [e["seconds"] for e in epochs], note,
              {**result["info"], "loadavg_1m": result["loadavg_1m"]})
    log(f"  {name:16s} workers={workers}: {row.samples_per_s:>12,.0f} samples/s  {row.mb_per_s:8.1f} MB/s  "
        f"first batch {row.first_batch_s:.2f} s  peak RSS {row.peak_rss_mb:.0f} MB")
    return row


def cat_row(shape: Shape, where: Layouts, epochs: int) -> Row:
    files = where.our_shards()
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    shard_bytes = sum(os.path.getsize(f) for f in files)
    row = Row(shape.name, CAT, None, shape.rows, min(times), shape.payload_bytes, epoch_seconds=times,
              note=f"our shards, {shard_bytes / MB / min(times):,.0f} MB/s of shard bytes",
              info={"shard_bytes": shard_bytes})
    log(f"  {CAT:16s}          : {row.samples_per_s:>12,.0f} samples/s  {row.mb_per_s:8.1f} MB/s")
    return row


def shape_rows(cfg: Config, shape: Shape, where: Layouts) -> list[Row]:
    """Every reader on one shape, with each number of workers."""
    base = {"epochs": cfg.epochs}
    rows = [cat_row(shape, where, cfg.epochs)]
    pt_rows = min(cfg.pt_rows, shape.rows)
    for workers in cfg.workers:
        rows.append(loader_row(shape, OURS, workers, {**base, "kind": "ours", "data": str(where.ours)}, shape.rows,
                               f"pack={shape.pack}"))
        rows.append(loader_row(shape, WDS, workers, {**base, "kind": "webdataset", "data": where.wds_urls()},
                               shape.rows))
        rows.append(loader_row(shape, MEMMAP, workers,
                               {**base, "kind": "memmap", "data": [str(where.x_npy), str(where.y_npy)]}, shape.rows))
        if not cfg.skip_slow:
            rows.append(loader_row(shape, JOBLIB, workers, {**base, "kind": "joblib", "data": str(where.joblib)},
                                   shape.rows, "shuffles batch files, not samples"))
            rows.append(loader_row(shape, PT, workers, {**base, "kind": "pt", "data": str(where.pt)}, pt_rows,
                                   f"first {pt_rows:,} samples only" if pt_rows < shape.rows else ""))
    return rows


def run_shapes(cfg: Config, work: Path) -> list[Row]:
    rows: list[Row] = []
    for seed, shape in enumerate(shapes_of(cfg), start=1):
        where = Layouts(work / shape.name)
        prepare_shape(cfg, shape, where, seed)
        rows += shape_rows(cfg, shape, where)
        shutil.rmtree(where.folder)
    return rows


# -- shuffle quality ---------------------------------------------------------------------------


def prepare_sorted(cfg: Config, where: Layouts) -> None:
    """10 classes, sorted by class, one class per shard, in both formats."""
    import pipeline

    where.folder.mkdir(parents=True)
    per_class = cfg.shuffle_per_class
    rng = np.random.default_rng(7)
    labels = np.repeat(np.arange(SHUFFLE_CLASSES, dtype=np.int64), per_class)
    np.save(where.x_npy, rng.standard_normal((len(labels), SHUFFLE_FEATURES), dtype=np.float32))
    np.save(where.y_npy, labels)
    index = pipeline.write_shards(where.ours, {"x": str(where.x_npy), "y": str(where.y_npy)}, prefix="sorted",
                                  pack=256, shard_samples=per_class, shard_bytes=None, workers=1,
                                  overwrite=True, quiet=True)
    assert [s.samples for s in index.shards] == [per_class] * SHUFFLE_CLASSES, "one class per shard expected"
    build_wds(where.x_npy, where.y_npy, len(labels), where.wds, 1 << 40, per_class, parts=1)
    assert len(where.wds_urls()) == SHUFFLE_CLASSES, "one class per webdataset shard expected"
    warm_page_cache(where.folder)


def permutation_stats(samples: int, per_class: int) -> dict[str, float]:
    labels = np.repeat(np.arange(SHUFFLE_CLASSES, dtype=np.int64), per_class)
    shuffled = labels[np.random.default_rng(0).permutation(samples)]
    return label_stats([shuffled[i:i + BATCH] for i in range(0, samples, BATCH)], SHUFFLE_CLASSES)


def run_shuffle(cfg: Config, work: Path) -> list[dict[str, Any]]:
    where = Layouts(work / "sorted")
    log(f"[shuffle] {SHUFFLE_CLASSES} classes x {cfg.shuffle_per_class:,} samples, one class per shard...")
    prepare_sorted(cfg, where)
    samples = SHUFFLE_CLASSES * cfg.shuffle_per_class
    cases = [(f"{OURS} (default buffer)", {"kind": "ours", "data": str(where.ours)}),
             (f"{OURS} (shuffle_buffer={WDS_SHUFFLE})",
              {"kind": "ours", "data": str(where.ours), "shuffle_buffer": WDS_SHUFFLE}),
             (f"{WDS} (.shuffle({WDS_SHUFFLE}))", {"kind": "webdataset", "data": where.wds_urls()})]
    rows = []
    for workers in cfg.workers:
        for name, spec in cases:
            result = run_child({**spec, "workers": workers, "epochs": 1, "labels": True})
            stats = {"loader": name, "workers": workers, **result["label_stats"],
                     "shuffle_buffer": result["info"].get("shuffle_buffer", WDS_SHUFFLE)}
            rows.append(stats)
            log(f"  {name:34s} workers={workers}: {stats['distinct_mean']:.2f} classes/batch, "
                f"{stats['entropy_mean_bits']:.2f} bits")
    rows.append({"loader": "full random permutation", "workers": None, **permutation_stats(samples, cfg.shuffle_per_class),
                 "shuffle_buffer": samples})
    shutil.rmtree(where.folder)
    return rows


# -- memory ------------------------------------------------------------------------------------


def write_memory_shards(out: Path, rows: int) -> int:
    """Random 768-float samples written through ``ShardWriter`` a chunk at a time; returns the
    bytes of the shards."""
    import pipeline

    rng = np.random.default_rng(11)
    step = _CHUNK_BYTES // (MEMORY_DIM * 4)
    with pipeline.ShardWriter(out, prefix="memory", shard_bytes=SHARD_BYTES, pack=MEMORY_PACK,
                              overwrite=True) as writer:
        for start in range(0, rows, step):
            n = min(step, rows - start)
            writer.write_columns({"x": rng.standard_normal((n, MEMORY_DIM), dtype=np.float32),
                                  "y": rng.integers(0, CLASSES, n, dtype=np.int64)})
    return sum(p.stat().st_size for p in out.glob("*.tar"))


def halves_peak(timeline: list[tuple[float, float]], epoch: dict[str, Any]) -> dict[str, float]:
    """Peak RSS in the first and in the second half of an epoch: bounded memory shows as
    equal peaks, memory that grows with the data read as a higher second one."""
    middle = (epoch["wall_start"] + epoch["wall_end"]) / 2
    first = [rss for t, rss in timeline if epoch["wall_start"] <= t <= middle]
    second = [rss for t, rss in timeline if middle < t <= epoch["wall_end"]]
    return {"peak_rss_first_half_mb": max(first, default=0.0), "peak_rss_second_half_mb": max(second, default=0.0)}


def run_memory(cfg: Config, work: Path) -> dict[str, Any]:
    out = work / "memory"
    payload = cfg.memory_rows * (MEMORY_DIM * 4 + LABEL_BYTES)
    log(f"[memory] writing {cfg.memory_rows:,} x {MEMORY_DIM} float32 ({payload / 1e9:.2f} GB) with pack={MEMORY_PACK}...")
    shard_bytes = write_memory_shards(out, cfg.memory_rows)
    warm_page_cache(out)
    floor = run_child({"kind": "floor", "workers": MEMORY_WORKERS, "epochs": 1}, pss=True)
    streamed = run_child({"kind": "ours", "workers": MEMORY_WORKERS, "epochs": 1, "data": str(out)}, pss=True)
    shutil.rmtree(out)
    info = streamed["info"]
    buffer_mb = info["shuffle_buffer"] * info["sample_bytes"] / MB
    epoch = streamed["epochs"][0]
    result = {
        "samples": cfg.memory_rows, "shard_gb": shard_bytes / 1e9, "payload_gb": payload / 1e9,
        "workers": MEMORY_WORKERS, "pack": MEMORY_PACK, "seconds": epoch["seconds"],
        "delivered": epoch["samples"], "shuffle_buffer": info["shuffle_buffer"], "sample_bytes": info["sample_bytes"],
        "buffer_per_worker_mb": buffer_mb, "budget_mb": MEMORY_WORKERS * buffer_mb + MEMORY_ALLOWANCE_MB,
        "peak_rss_mb": streamed["peak_rss_mb"], "peak_pss_mb": streamed["peak_pss_mb"],
        "floor_rss_mb": floor["peak_rss_mb"], "floor_pss_mb": floor["peak_pss_mb"],
        "processes": streamed["processes"], **halves_peak(streamed["rss_timeline"], epoch),
        "rss_timeline_mb": thin_timeline(streamed["rss_timeline"], epoch["wall_start"]),
    }
    log(f"  peak RSS {result['peak_rss_mb']:.0f} MB (PSS {result['peak_pss_mb']:.0f} MB), buffer "
        f"{MEMORY_WORKERS} x {buffer_mb:.0f} MB, floor RSS {result['floor_rss_mb']:.0f} MB")
    return result


# -- targets and report ------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    metric: str
    value: float
    goal: str
    met: bool | None  # None: informational

    def row(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.value, "target": self.goal, "met": self.met}


SPEEDUP_GOALS = {2: {"tabular": 20.0, "embeddings": 15.0, "images": 1.7},
                 0: {"tabular": 100.0, "embeddings": 50.0, "images": 5.0}}
MEMMAP_GOAL = {2: 0.9}


def find(rows: list[Row], shape: str, loader: str, workers: int | None) -> Row | None:
    return next((r for r in rows if (r.shape, r.loader, r.workers) == (shape, loader, workers)), None)


def ratio(rows: list[Row], row: Row, baseline: str) -> float | None:
    base = find(rows, row.shape, baseline, row.workers if baseline != CAT else None)
    return row.samples_per_s / base.samples_per_s if base else None


def throughput_targets(rows: list[Row]) -> list[Target]:
    out = []
    for workers, goals in SPEEDUP_GOALS.items():
        for shape, goal in goals.items():
            ours = find(rows, shape, OURS, workers)
            if ours is None or find(rows, shape, WDS, workers) is None:
                continue
            value = ratio(rows, ours, WDS)
            out.append(Target(f"{shape}, {workers} workers: this loader / webdataset", value, f">= {goal:g}x",
                              value >= goal))
        for shape in goals if workers in MEMMAP_GOAL else ():
            ours = find(rows, shape, OURS, workers)
            if ours is None or find(rows, shape, MEMMAP, workers) is None:
                continue
            value = ratio(rows, ours, MEMMAP)
            goal = MEMMAP_GOAL[workers]
            out.append(Target(f"{shape}, {workers} workers: this loader / memmap gather", value, f">= {goal:.0%}",
                              value >= goal))
    return out


def memory_targets(memory: dict[str, Any] | None) -> list[Target]:
    if memory is None:
        return []
    budget = memory["budget_mb"]
    goal = f"<= {budget:.0f} (buffer + {MEMORY_ALLOWANCE_MB})"
    measures = [
        (f"memory: peak RSS of the process tree (MB), {memory['payload_gb']:.1f} GB streamed", memory["peak_rss_mb"]),
        ("memory: peak PSS of the process tree (MB)", memory["peak_pss_mb"]),
        ("memory: peak RSS above the floor (torch + 2 idle workers) (MB)",
         memory["peak_rss_mb"] - memory["floor_rss_mb"]),
        ("memory: peak PSS above the floor (MB)", memory["peak_pss_mb"] - memory["floor_pss_mb"]),
    ]
    return [Target(name, value, goal, value <= budget) for name, value in measures]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def throughput_table(rows: list[Row]) -> str:
    header = ["shape", "loader", "workers", "samples", "samples/s", "MB/s", "vs webdataset", "vs memmap",
              "peak RSS (MB)", "first batch (s)", "note"]
    lines = []
    for r in rows:
        lines.append([r.shape, r.loader, fmt(r.workers, "d"), f"{r.samples:,}", f"{r.samples_per_s:,.0f}",
                      f"{r.mb_per_s:,.1f}", fmt(ratio(rows, r, WDS) if r.workers is not None else None, ".2f", "x"),
                      fmt(ratio(rows, r, MEMMAP) if r.workers is not None else None, ".2f", "x"),
                      fmt(r.peak_rss_mb, ".0f"), fmt(r.first_batch_s, ".2f"), r.note])
    return markdown_table(header, lines)


def shuffle_table(rows: list[dict[str, Any]]) -> str:
    header = ["loader", "workers", "buffer (samples)", "batches", "distinct classes / batch (mean)",
              "(min)", "label entropy / batch (bits)"]
    return markdown_table(header, [[r["loader"], fmt(r["workers"], "d"), fmt(r["shuffle_buffer"], ",d"),
                                    str(r["batches"]), f"{r['distinct_mean']:.2f}", str(r["distinct_min"]),
                                    f"{r['entropy_mean_bits']:.2f}"] for r in rows])


def memory_table(m: dict[str, Any]) -> str:
    header = ["dataset", "workers", "seconds", "shuffle_buffer", "bytes/sample", "buffer/worker (MB)",
              "budget (MB)", "peak RSS (MB)", "peak RSS 1st / 2nd half (MB)", "peak PSS (MB)",
              "floor RSS / PSS (MB)"]
    return markdown_table(header, [[
        f"{m['samples']:,} x {MEMORY_DIM} float32, {m['shard_gb']:.2f} GB of shards, pack={m['pack']}",
        str(m["workers"]), f"{m['seconds']:.1f}", f"{m['shuffle_buffer']:,}", f"{m['sample_bytes']:,}",
        f"{m['buffer_per_worker_mb']:.0f}", f"{m['budget_mb']:.0f}", f"{m['peak_rss_mb']:.0f}",
        f"{m['peak_rss_first_half_mb']:.0f} / {m['peak_rss_second_half_mb']:.0f}",
        f"{m['peak_pss_mb']:.0f}", f"{m['floor_rss_mb']:.0f} / {m['floor_pss_mb']:.0f}"]])


def targets_table(targets: list[Target]) -> str:
    verdict = {True: "met", False: "**not met**", None: ""}
    return markdown_table(["target", "value", "goal", "result"],
                          [[t.metric, f"{t.value:,.2f}", t.goal, verdict[t.met]] for t in targets])


def save_chart(rows: list[Row], path: Path) -> bool:
    """Samples/s per loader per shape, one panel per number of workers, log scale."""
    try:
        import matplotlib
    except ImportError:
        log("matplotlib is not installed: no chart (pip install matplotlib)")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = sorted({r.workers for r in rows if r.workers is not None})
    shapes = list(dict.fromkeys(r.shape for r in rows))
    loaders = [name for name in (OURS, WDS, JOBLIB, PT, MEMMAP, CAT) if any(r.loader == name for r in rows)]
    fig, axes = plt.subplots(1, len(workers), figsize=(6 * len(workers), 4.5), sharey=True, squeeze=False)
    width = 0.8 / len(loaders)
    for ax, w in zip(axes[0], workers):
        for k, name in enumerate(loaders):
            values = [find(rows, s, name, None if name == CAT else w) for s in shapes]
            heights = [r.samples_per_s if r else 0 for r in values]
            ax.bar(np.arange(len(shapes)) + (k - (len(loaders) - 1) / 2) * width, heights, width, label=name)
        ax.set_xticks(np.arange(len(shapes)), shapes)
        ax.set_yscale("log")
        ax.set_title(f"num_workers={w}, batch size {BATCH}")
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0][0].set_ylabel("samples/s (log scale)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def library_revision() -> str:
    """The git commit of the working tree, with ``+changes`` when ``pipeline/`` has
    uncommitted edits."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+changes" if git("status", "--porcelain", "--", "pipeline") else "")


def snapshot_library(work: Path, rev: str | None) -> str:
    """Copy the library into the run's folder and import it from there, here and in every
    child process (through ``PYTHONPATH``, ahead of the editable install): each case starts
    a fresh interpreter, so a run of half an hour would otherwise mix the versions of a
    package edited meanwhile. Returns the revision benchmarked."""
    dest = work / "library"
    if rev:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "pipeline"], capture_output=True,
                                 check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
        revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True,
                                  text=True, check=True).stdout.strip()
    else:
        revision = library_revision()
        shutil.copytree(ROOT / "pipeline", dest / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(dest))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(dest), os.environ.get("PYTHONPATH")]))
    return revision


def environment(revision: str) -> dict[str, Any]:
    import msgpack
    import torch
    import webdataset

    import pipeline

    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "numpy": np.__version__, "torch": torch.__version__, "msgpack": ".".join(map(str, msgpack.version)),
            "webdataset": getattr(webdataset, "__version__", "?"), "pipeline": pipeline.__version__,
            "pipeline_revision": revision, "pipeline_imported_from": str(Path(pipeline.__file__).parent)}


def save_results(cfg: Config, rows: list[Row], shuffle: list[dict[str, Any]], memory: dict[str, Any] | None,
                 targets: list[Target], revision: str) -> Path:
    cfg.out.mkdir(parents=True, exist_ok=True)
    path = cfg.out / "bench.json"
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    payload = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "config": config,
               "environment": environment(revision), "throughput": [r.summary() for r in rows], "shuffle": shuffle,
               "memory": memory, "targets": [t.row() for t in targets]}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def report(cfg: Config, rows: list[Row], shuffle: list[dict[str, Any]], memory: dict[str, Any] | None,
           revision: str) -> None:
    targets = throughput_targets(rows) + memory_targets(memory)
    if rows:
        print(f"\n### Throughput (batch size {BATCH}; best of {cfg.epochs} epochs; MB/s of payload, 1 MB = 1e6 B; "
              f"first batch: epoch 1, worker start-up included)\n")
        print(throughput_table(rows))
    if shuffle:
        print(f"\n### Shuffle quality ({SHUFFLE_CLASSES} classes sorted by class, one class per shard; "
              f"ideal {SHUFFLE_CLASSES} classes, {np.log2(SHUFFLE_CLASSES):.2f} bits)\n")
        print(shuffle_table(shuffle))
    if memory:
        print("\n### Memory (budget: shuffle buffer per worker x workers + "
              f"{MEMORY_ALLOWANCE_MB} MB)\n")
        print(memory_table(memory))
    if targets:
        print("\n### Targets\n")
        print(targets_table(targets))
    print(f"\nlibrary benchmarked: pipeline at {revision}")
    print(f"written to {save_results(cfg, rows, shuffle, memory, targets, revision)}")
    if rows and save_chart(rows, cfg.out / "bench.png"):
        print(f"chart in {cfg.out / 'bench.png'}")


# -- main --------------------------------------------------------------------------------------


def disk_needed(cfg: Config) -> int:
    """Rough peak of the run: the largest shape's layouts, or the memory case's shards."""
    peaks = [s.rows * (2 * s.payload_bytes + wds_sample_bytes(s)) * (1 if cfg.skip_slow else 2)
             for s in shapes_of(cfg)]
    if not cfg.skip_memory:
        peaks.append(int(cfg.memory_rows * (MEMORY_DIM * 4 + LABEL_BYTES) * 1.05))
    return max(peaks, default=0) + (256 << 20)


def check_free_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise SystemExit(f"{folder}: {free / 1e9:.1f} GB free, this run needs ~{needed / 1e9:.1f} GB; "
                         f"use --tmp elsewhere or smaller sizes")


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
    elif "--source" in sys.argv:
        # http or s3: streaming from nginx / SeaweedFS on 127.0.0.1 against curl / boto3,
        # measured by scripts/bench_remote.py (which takes the remaining options)
        from bench_remote import main as remote_main

        sys.exit(remote_main(sys.argv[1:]))
    else:
        # a plain ``kill`` unwinds like Ctrl-C, so that the generated data is removed
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        main(parse_args())
