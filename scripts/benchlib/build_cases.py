"""The build benchmark's cases (bench_build.py, bench_dask.py): generated arrays, one build (or
baseline: webdataset, cp) run in a fresh process, and the results of a case's runs."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .common import MB, ROOT, markdown_table
from .data import write_npy
from .runs import current_rss_mb, folder_bytes, peak_rss_mb, synced_seconds, warm_page_cache, workers_peak_rss_mb

CLASSES = 1000
#: The script whose ``--child`` runs one case (this module's :func:`child_main`).
CHILD_SCRIPT = ROOT / "scripts" / "bench_build.py"


# -- generated data --------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    """Features ``x`` and labels ``y`` as ``.npy`` files."""

    x: Path
    y: Path
    rows: int
    features: int

    @property
    def raw_bytes(self) -> int:
        """Bytes of the arrays themselves: float32 features and an int64 label per row."""
        return self.rows * (self.features * 4 + 8)

    def paths(self) -> dict[str, str]:
        return {"x": str(self.x), "y": str(self.y)}

    def remove(self) -> None:
        self.x.unlink(missing_ok=True)
        self.y.unlink(missing_ok=True)


def make_dataset(folder: Path, name: str, rows: int, features: int, seed: int) -> Dataset:
    """Random float32 features (normal) and int64 labels, written, synced and read back
    once so that they are in the page cache."""
    rng = np.random.default_rng(seed)
    x = write_npy(folder / f"{name}-x.npy", (rows, features), np.float32,
                  lambda n: rng.standard_normal((n, features), dtype=np.float32))
    y = write_npy(folder / f"{name}-y.npy", (rows,), np.int64,
                  lambda n: rng.integers(0, CLASSES, n, dtype=np.int64))
    for path in (x, y):
        warm_page_cache(path)
    return Dataset(x, y, rows, features)


# -- one run, in a fresh process ---------------------------------------------------------------


def child_main(spec: dict[str, Any]) -> None:
    """Run one case described by ``spec`` and print its result as a JSON line."""
    run = {"build": child_build, "webdataset": child_webdataset, "cp": child_cp}[spec["kind"]]
    result = run(spec)
    result["peak_rss_mb"] = peak_rss_mb()
    result["children_peak_rss_mb"] = workers_peak_rss_mb()
    print(json.dumps(result))


def load_inputs(paths: dict[str, str], mode: str) -> dict[str, Any]:
    """The arrays as the build gets them: ``.npy`` paths, loaded arrays, or memmaps."""
    if mode == "path":
        return dict(paths)
    if mode == "memory":
        return {name: np.load(path) for name, path in paths.items()}
    if mode == "mmap":
        return {name: np.load(path, mmap_mode="r") for name, path in paths.items()}
    raise ValueError(f"unknown input mode {mode!r}")


def child_build(spec: dict[str, Any]) -> dict[str, Any]:
    import pipeline

    arrays = load_inputs(spec["inputs"], spec["input_mode"])
    rss_before = current_rss_mb()
    indexes = []
    seconds = synced_seconds(lambda: indexes.append(pipeline.write_shards(
        spec["dest"], arrays, prefix="bench", shard_bytes=spec["shard_bytes"], pack=spec["pack"],
        workers=spec["workers"], engine=spec.get("engine", "local"), scheduler=spec.get("scheduler"),
        overwrite=True, quiet=True)))
    return {"seconds": seconds, "samples": indexes[0].samples, "shards": len(indexes[0].shards),
            "rss_before_mb": rss_before, "pipeline_version": pipeline.__version__,
            "pipeline_path": str(Path(pipeline.__file__).parent)}


def child_webdataset(spec: dict[str, Any]) -> dict[str, Any]:
    import webdataset as wds

    data = load_inputs(spec["inputs"], "memory")
    rows = spec["rows"]
    x, y = data["x"][:rows], data["y"][:rows]
    pattern = str(Path(spec["dest"]) / "wds-%06d.tar")
    Path(spec["dest"]).mkdir(parents=True, exist_ok=True)

    def write() -> None:
        with wds.ShardWriter(pattern, maxcount=1 << 62, maxsize=spec["shard_bytes"], verbose=0) as sink:
            for i in range(rows):
                sink.write({"__key__": f"{i:012d}", "npy": x[i], "cls": int(y[i])})

    seconds = synced_seconds(write)
    shards = len(list(Path(spec["dest"]).glob("wds-*.tar")))
    return {"seconds": seconds, "samples": rows, "shards": shards, "rss_before_mb": current_rss_mb()}


def child_cp(spec: dict[str, Any]) -> dict[str, Any]:
    Path(spec["dest"]).mkdir(parents=True, exist_ok=True)
    sources = list(spec["inputs"].values())
    seconds = synced_seconds(lambda: subprocess.run(["cp", *sources, spec["dest"]], check=True))
    return {"seconds": seconds, "samples": spec["rows"], "shards": 0, "rss_before_mb": None}


# -- cases and their results -----------------------------------------------------------------


@dataclass
class Case:
    """One measured configuration; ``data_bytes`` are the raw bytes it processes (for MB/s)."""

    name: str
    spec: dict[str, Any]
    data_bytes: int
    runs: list[dict[str, Any]] = field(default_factory=list)

    def run(self, work_dir: Path) -> None:
        dest = work_dir / "out" / self.name
        shutil.rmtree(dest, ignore_errors=True)
        spec = {**self.spec, "dest": str(dest)}
        proc = subprocess.run([sys.executable, str(CHILD_SCRIPT), "--child", json.dumps(spec)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"case {self.name} failed (exit {proc.returncode}):\n{proc.stderr}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["bytes_on_disk"] = folder_bytes(dest)
        shutil.rmtree(dest)
        self.runs.append(result)
        print(f"  {self.name}: {result['seconds']:.2f} s, peak RSS {result['peak_rss_mb']:.0f} MB",
              file=sys.stderr, flush=True)

    @property
    def seconds(self) -> float:
        """The best time of the runs (see the module docstring)."""
        return min(r["seconds"] for r in self.runs)

    @property
    def samples(self) -> int:
        return self.runs[0]["samples"]

    def summary(self) -> dict[str, Any]:
        last = self.runs[-1]
        return {
            "case": self.name,
            "samples": self.samples,
            "shards": last["shards"],
            "seconds": self.seconds,
            "median_seconds": statistics.median(r["seconds"] for r in self.runs),
            "samples_per_s": self.samples / self.seconds,
            "data_mb_per_s": self.data_bytes / self.seconds / MB,
            "bytes_on_disk": last["bytes_on_disk"],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in self.runs),
            "children_peak_rss_mb": max(r["children_peak_rss_mb"] for r in self.runs),
            "rss_before_build_mb": last["rss_before_mb"],
            "all_seconds": [r["seconds"] for r in self.runs],
            "spec": {k: v for k, v in self.spec.items() if k != "inputs"},
        }


def build_case(name: str, data: Dataset, mode: str, pack: int, shard_mb: int, workers: int = 1) -> Case:
    spec = {"kind": "build", "inputs": data.paths(), "input_mode": mode, "pack": pack,
            "shard_bytes": shard_mb << 20, "workers": workers}
    return Case(name, spec, data.raw_bytes)


# -- report ----------------------------------------------------------------------------------


def cases_table(summaries: list[dict[str, Any]]) -> str:
    header = ["case", "samples", "shards", "best (s)", "median (s)", "samples/s", "data MB/s",
              "on disk (MB)", "peak RSS (MB)", "workers' peak RSS (MB)"]
    return markdown_table(header, [case_row(s) for s in summaries])


def case_row(s: dict[str, Any]) -> list[str]:
    rate = s["data_mb_per_s"]
    workers = s["spec"].get("workers", 1)
    return [s["case"], f"{s['samples']:,}", str(s["shards"]), f"{s['seconds']:.2f}",
            f"{s['median_seconds']:.2f}", f"{s['samples_per_s']:,.0f}", f"{rate:.{0 if rate >= 10 else 1}f}",
            f"{s['bytes_on_disk'] / MB:.1f}", f"{s['peak_rss_mb']:.0f}",
            f"{s['children_peak_rss_mb']:.0f}" if workers > 1 else "-"]
