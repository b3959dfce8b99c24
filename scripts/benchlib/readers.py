"""The readers compared, built inside a child process, and the child's side of a case: play its
epochs and print what they did as a JSON line."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

import numpy as np

from .common import BATCH, SHUFFLE_CLASSES, WDS_SHARD_SHUFFLE, WDS_SHUFFLE
from .images import IMAGE_LOADERS


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
    """The loader, and what it holds: its ``shuffle_buffer`` and the samples of the units its
    plan cuts (at most the buffer, fewer where the rank's span is short: a unit shuffled at
    once, see pipeline/stream/plan.py)."""
    import pipeline
    from pipeline.stream.plan import Leg, leg_sequences

    options = {"shuffle_buffer": spec["shuffle_buffer"]} if spec.get("shuffle_buffer") else {}
    loader = pipeline.make_loader(spec["data"], num_workers=spec["workers"], batch_size=BATCH, seed=0, **options)
    dataset = loader.dataset
    sequence = leg_sequences(dataset.samples, dataset.plan_config, [Leg(dataset.world_size, 0)])[0][dataset.rank]
    info = {"shuffle_buffer": dataset.shuffle_buffer, "unit_samples": sequence.unit,
            "sample_bytes": dataset.sample_bytes(), "len": len(loader)}
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
    "memmap": memmap_loader, "floor": floor_loader, **IMAGE_LOADERS,
}


def batch_labels(batch: Any) -> Any:
    """The label tensor of a batch: ``batch["y"]`` (or ``"label"``) for our dicts, item 1 of the tuples."""
    if isinstance(batch, dict):
        return batch["y"] if "y" in batch else batch["label"]
    return batch[1]


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
