"""The training example: checkpoint, crash, resume gives the very model an uninterrupted run gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pipeline

TRAIN = Path(__file__).resolve().parent.parent / "scripts" / "train.py"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(1)
    centres = rng.normal(0, 2, (3, 6)).astype(np.float32)
    for split, n in (("train", 2000), ("validation", 300)):
        y = rng.integers(0, 3, n)
        x = centres[y] + rng.normal(0, 1, (n, 6)).astype(np.float32)
        pipeline.write_shards(root / split, {"x": x, "y": y}, prefix=split, pack=8, shard_samples=450, quiet=True)
    return root


def train(data: Path, folder: Path, *args: str) -> dict:
    folder.mkdir(exist_ok=True)
    result = folder / "result.json"
    run = subprocess.run([sys.executable, str(TRAIN), "--data", str(data), "--epochs", "2", "--batch-size", "50",
                          "--quiet", "--result", str(result), *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(result.read_text()) if result.exists() else {}


@pytest.mark.parametrize("workers, stop", [("0", "13"), ("2", "45")])
def test_resume_after_a_crash_trains_the_same_model(data: Path, tmp_path: Path, workers: str, stop: str) -> None:
    straight = train(data, tmp_path / "a", "--workers", workers)
    checkpoint = tmp_path / "ckpt.pt"
    assert train(data, tmp_path / "b", "--workers", workers, "--checkpoint", str(checkpoint), "--stop-after", stop) == {}
    resumed = train(data, tmp_path / "b", "--workers", workers, "--checkpoint", str(checkpoint), "--resume")
    assert resumed["weights_sum"] == pytest.approx(straight["weights_sum"], rel=1e-6)
    assert resumed["val_accuracy"] == straight["val_accuracy"] > 0.8
