"""What every part of the benchmark shares: where the checkout is, the sizes and constants of the
cases, the run's configuration, the shapes of sample, and how a part logs and prints a table."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")
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
pss_bytes, rss_parts = _memory.pss_bytes, _memory.rss_parts
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


@dataclass(frozen=True)
class Target:
    """A figure a benchmark is judged by, and whether it met its goal."""

    metric: str
    value: float
    goal: str
    met: bool | None  # None: informational

    def row(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.value, "target": self.goal, "met": self.met}


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


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def targets_table(targets: list[Target]) -> str:
    verdict = {True: "met", False: "**not met**", None: ""}
    return markdown_table(["target", "value", "goal", "result"],
                          [[t.metric, f"{t.value:,.2f}", t.goal, verdict[t.met]] for t in targets])


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def existing_folder(text: str) -> str:
    """An argparse type for ``--tmp``: a folder that is there (the benchmark makes its own
    temporary folder inside, and removes only that)."""
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"no folder {text!r}: make it first, or leave --tmp out for the "
                                         f"system's temporary folder")
    return text


def best_of(runs: int, action: Callable[[], T]) -> tuple[float, T]:
    """The best wall time of ``runs`` runs of ``action``, and what its last run returned (the
    bytes it moved, say): the least-disturbed run on a shared machine."""
    best, result = float("inf"), None
    for _ in range(runs):
        started = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - started)
    return best, result  # type: ignore[return-value]
