#!/usr/bin/env python
"""GPU feeding benchmark: train the example model on the GPU (on the CPU where there is none)
with several numbers of DataLoader workers, and say how well the input keeps up.

What runs: shards of ``--samples`` samples of ``--features`` float32 and a class label
(``pack=16``), written by ``write_shards``; per number of workers (``--workers``, default 0, 2,
4, 8), ``make_loader`` (pinned memory on CUDA) and ``DevicePrefetcher`` feed the example's
classifier (a linear layer, as in ``scripts/train.py``; ``--hidden N`` puts an MLP with a hidden
layer of N units in front, for a step that costs the GPU something) for ``--epochs`` epochs.

Reported per number of workers, for the best epoch after the first (which starts the workers):
samples/s; the input-bound fraction (the share of the loop's time spent waiting for the next
batch, ``DevicePrefetcher.stats()``); the loader's per-stage profile over all its epochs (``loader.stats()``); and,
on CUDA, whether the host-to-device copies overlap the training steps: CUDA events around each
copy (on the prefetcher's side stream) and around each step (on the default stream) give their
intervals on the GPU's clock, and ``copy_overlap`` is the share of copy time that falls inside a
step (1.0: every copy hidden behind compute; 0: the GPU waited for every copy).

Usage::

    python scripts/bench_gpu.py                 # on the GPU if there is one
    python scripts/bench_gpu.py --quick         # tiny data, 0 and 2 workers: a check (a test runs it)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import pipeline
from pipeline import DevicePrefetcher, make_loader
from pipeline.stream import prefetch

ROOT = Path(__file__).resolve().parent.parent


def write_data(folder: Path, samples: int, features: int, classes: int) -> str:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, classes, samples)
    x = rng.normal(0, 1, (samples, features)).astype(np.float32) + labels[:, None].astype(np.float32) / classes
    pipeline.write_shards(folder, {"x": x, "y": labels.astype(np.int64)}, pack=16, quiet=True)
    return str(folder)


class CopyTimer:
    """CUDA events around every host-to-device copy of a batch the prefetcher makes (on its
    side stream). The copy recurses into the batch's fields through the name it replaces: those
    nested calls are inside the batch's events already, and are not timed again."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, Any]] = []
        self._copy = prefetch._to_device
        self._copying = False

    def __enter__(self) -> "CopyTimer":
        def timed(batch: Any, device: torch.device) -> Any:
            if self._copying:
                return self._copy(batch, device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._copying = True
            try:
                out = self._copy(batch, device)
            finally:
                self._copying = False
            end.record()
            self.events.append((start, end))
            return out

        prefetch._to_device = timed
        return self

    def __exit__(self, *exc: Any) -> None:
        prefetch._to_device = self._copy


def overlap(copies: list[tuple[float, float]], steps: list[tuple[float, float]]) -> float:
    """The share of the copies' time that falls inside a step."""
    total = sum(b - a for a, b in copies)
    inside = 0.0
    for a, b in copies:
        inside += sum(max(0.0, min(b, d) - max(a, c)) for c, d in steps)
    return inside / total if total else 0.0


def run_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, loader: Any, device: torch.device) -> dict:
    cuda = device.type == "cuda"
    prefetcher = DevicePrefetcher(loader, device)
    steps: list[tuple[Any, Any]] = []
    origin = torch.cuda.Event(enable_timing=True) if cuda else None
    timer = CopyTimer() if cuda else None
    if origin is not None:
        origin.record()
    started, samples = time.perf_counter(), 0
    with timer if timer is not None else nullcontext():
        for batch in prefetcher:
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
            loss = nn.functional.cross_entropy(model(batch["x"]), batch["y"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if cuda:
                end.record()
                steps.append((begin, end))
            samples += len(batch["y"])
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    out = {"samples": samples, "seconds": seconds, "samples_per_s": samples / seconds,
           "input_bound": prefetcher.stats()["input_bound"], "copy_overlap": None}
    if cuda and timer is not None and origin is not None:
        on_clock = [(origin.elapsed_time(a), origin.elapsed_time(b)) for a, b in timer.events]
        out["copy_overlap"] = overlap(on_clock, [(origin.elapsed_time(a), origin.elapsed_time(b)) for a, b in steps])
    return out


def measure(data: str, workers: int, args: argparse.Namespace, device: torch.device) -> dict:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(args.features, args.hidden), nn.ReLU()] if args.hidden else []
    model = nn.Sequential(*layers, nn.Linear(args.hidden or args.features, args.classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = make_loader(data, num_workers=workers, batch_size=args.batch_size)
    epochs = [run_epoch(model, optimizer, loader, device) for _ in range(args.epochs)]
    best = max(epochs[1:] or epochs, key=lambda e: e["samples_per_s"])
    profile = {key: round(value, 3) for key, value in loader.stats().items() if key.endswith("_s")}
    return {"workers": workers, **best, "epoch_samples": [e["samples"] for e in epochs], "profile": profile}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=2_000_000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=4096, help="hidden units of the MLP (0: the linear example)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--workers", default="0,2,4,8", help="numbers of DataLoader workers, comma-separated")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results")
    parser.add_argument("--quick", action="store_true", help="20,000 samples, 0 and 2 workers, 2 epochs, hidden 64, "
                        "batch 256 (over --samples, --workers, --epochs, --hidden and --batch-size)")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.workers, args.epochs, args.hidden, args.batch_size = 20_000, "0,2", 2, 64, 256
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        data = write_data(Path(tmp) / "shards", args.samples, args.features, args.classes)
        rows = [measure(data, int(w), args, device) for w in args.workers.split(",")]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (no CUDA device)"
    print(f"device: {name}; {args.samples:,} x {args.features} float32, batch {args.batch_size}, "
          f"hidden {args.hidden}\n")
    print("| workers | samples/s | input-bound | copies overlapping steps | stages (s): storage / decode / gather / "
          "transform / handover |\n|---|---|---|---|---|")
    for r in rows:
        stages = " / ".join(f"{r['profile'][k]:.2f}"
                            for k in ("storage_s", "decode_s", "gather_s", "transform_s", "handover_s"))
        overlapped = "n/a" if r["copy_overlap"] is None else f"{r['copy_overlap']:.0%}"
        print(f"| {r['workers']} | {r['samples_per_s']:,.0f} | {r['input_bound']:.0%} | {overlapped} | {stages} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_gpu.json").write_text(json.dumps({"device": name, "config": vars(args) | {"out": str(args.out)},
                                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
