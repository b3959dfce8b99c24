"""The generated data of the benchmark: each shape's arrays, and the same samples in every layout
read (our shards, webdataset's, joblib batch files, one ``.pt`` file per sample), the sorted
set of the shuffle case and the shards of the memory case."""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .common import (
    _CHUNK_BYTES,
    BATCH,
    CLASSES,
    MEMORY_DIM,
    MEMORY_PACK,
    SHARD_BYTES,
    SHUFFLE_CLASSES,
    SHUFFLE_FEATURES,
    Config,
    Shape,
    log,
)
from .readers import label_stats
from .runs import warm_page_cache


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


def random_rows(rng: np.random.Generator, n: int, dims: tuple[int, ...], dtype: str) -> np.ndarray:
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal((n, *dims), dtype=np.dtype(dtype))
    return rng.integers(0, 256, (n, *dims), dtype=np.dtype(dtype))


def write_npy(path: Path, shape: tuple[int, ...], dtype: str | np.dtype,
              fill: Callable[[int], np.ndarray]) -> Path:
    """Write a ``.npy`` of ``shape`` a chunk of rows at a time (never the whole array in
    memory); ``fill(n)`` returns the next ``n`` rows."""
    dtype = np.dtype(dtype)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
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
