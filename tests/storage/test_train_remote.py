"""The training example reads its data from S3 as it reads it from a folder (what a run across
several machines does): the same samples, in the same order, so the very same model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import pipeline
from tests.storage.conftest import upload_folder
from tests.storage.servers import make_bucket

TRAIN = Path(__file__).resolve().parents[2] / "scripts" / "train.py"


def train(data: str, result: Path, *args: str) -> dict:
    run = subprocess.run([sys.executable, str(TRAIN), "--data", data, "--epochs", "1", "--batch-size", "50",
                          "--workers", "2", "--quiet", "--result", str(result), *args],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(result.read_text())


def test_training_on_s3_shards_gives_the_model_of_local_shards(s3_env: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    for split, n in (("train", 1500), ("validation", 300)):
        y = rng.integers(0, 3, n)
        x = (rng.normal(0, 1, (n, 4)) + y[:, None]).astype(np.float32)
        pipeline.write_shards(tmp_path / "data" / split, {"x": x, "y": y}, prefix=split, pack=8,
                              shard_samples=400, quiet=True)
    make_bucket("training")
    for split in ("train", "validation"):
        upload_folder(tmp_path / "data" / split, "training", f"run/{split}")
    local = train(str(tmp_path / "data"), tmp_path / "local.json")
    remote = train("s3://training/run", tmp_path / "remote.json", "--cache-dir", str(tmp_path / "cache"))
    assert remote["weights_sum"] == local["weights_sum"] and remote["val_accuracy"] == local["val_accuracy"] > 0.5
    # --cache-dir kept a whole copy (URL hash-version-name) of each shard of both splits: later epochs read them
    shards = sorted(path.name for split in ("train", "validation") for path in (tmp_path / "data" / split).glob("*.tar"))
    copies = sorted(path.name.split("-", 2)[2] for path in (tmp_path / "cache").iterdir() if path.suffix == ".tar")
    assert copies == shards and len(shards) == 5
