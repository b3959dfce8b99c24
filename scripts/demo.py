"""The main job, end to end on this machine: make a dataset, build its shards, train on them.

1. Generate a synthetic classification dataset with learnable structure (10 overlapping
   Gaussian clusters in 32 dimensions), written as ``.npy`` files the way many users hold data.
2. Build train and validation shard sets from those files into ``shards/train`` and
   ``shards/validation`` (packed records, 2 worker processes), verify them, show them.
3. Train the example linear classifier on the shards for a few epochs (``scripts/train.py``),
   printing validation accuracy (chance is 10%) and throughput.

Run: ``python scripts/demo.py`` (``--samples N``, ``--epochs N`` to change the size).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from train import main as train_main  # scripts/train.py, beside this file

import pipeline

ROOT = Path(__file__).resolve().parent.parent


def make_dataset(folder: Path, samples: int, features: int = 32, classes: int = 10,
                 seed: int = 0) -> dict[str, dict[str, Path]]:
    """Clusters around random class centres, split 90/10; returns the ``.npy`` paths per split."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 0.5, size=(classes, features)).astype(np.float32)
    labels = rng.integers(0, classes, size=samples)
    x = centres[labels] + rng.normal(0.0, 1.0, size=(samples, features)).astype(np.float32)
    cut = samples * 9 // 10
    splits = {"train": slice(0, cut), "validation": slice(cut, samples)}
    paths: dict[str, dict[str, Path]] = {}
    for split, rows in splits.items():
        paths[split] = {"x": folder / f"{split}_x.npy", "y": folder / f"{split}_y.npy"}
        np.save(paths[split]["x"], x[rows])
        np.save(paths[split]["y"], labels[rows].astype(np.int64))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--out", type=Path, default=ROOT / "shards")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="pipeline-demo-") as tmp:
        paths = make_dataset(Path(tmp), args.samples)
        for split, arrays in paths.items():
            pipeline.write_shards(args.out / split, arrays, prefix=split, pack=256, shard_bytes=2 << 20,
                                  workers=args.workers, overwrite=True)
    for split in paths:
        problems = pipeline.verify(args.out / split)
        if problems:
            print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
            return 1
        print(pipeline.describe(args.out / split, samples=2))
        print()
    print(f"built and verified {', '.join(str(args.out / s) for s in paths)}\n")
    return train_main(["--data", str(args.out), "--epochs", str(args.epochs), "--workers", str(args.workers)])


if __name__ == "__main__":
    sys.exit(main())
