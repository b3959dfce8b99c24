"""A new user's first hour, as they would run it: the files of the two classic recipes, the
command line, then ``scripts/train.py``, to a model far better than chance, and an error
that says what to do at every step where they could go wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.write.test_recipes import write_recipe

TRAIN = Path(__file__).resolve().parent.parent / "scripts" / "train.py"


def pipeline_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def train(data: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    result_file = data.parent / f"result-{data.name}.json"
    result_file.unlink(missing_ok=True)
    run = subprocess.run([sys.executable, str(TRAIN), "--data", str(data), "--epochs", "3", "--workers", "1",
                          "--result", str(result_file), *args], capture_output=True, text=True, timeout=300)
    return run, json.loads(result_file.read_text()) if result_file.exists() else {}


def clusters(n: int, features: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Points around one random centre per class: learnable, not trivially."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1, (classes, features))
    y = rng.integers(0, classes, n)
    return centres[y] + rng.normal(0, 1, (n, features)), y


@pytest.mark.parametrize("labels", ["int64", "float64"])
def test_seed_1_joblib_batches_to_a_trained_classifier(tmp_path: Path, labels: str) -> None:
    x, y = clusters(6003, 16, 5, seed=1)
    write_recipe(tmp_path / "out", x, y.astype(labels), batch_size=4)
    if labels == "int64":  # (the labels' dtype has no part in this refusal: checked once)
        built = pipeline_cli("build", "joblib", tmp_path / "out", tmp_path / "shards")
        assert built.returncode == 0, built.stderr
        run, _ = train(tmp_path / "shards")
        assert run.returncode == 1 and "Traceback" not in run.stderr
        assert "is one shard set, not a folder of splits: build it again with --validation 0.1 --overwrite" \
            in run.stderr
        for data, error in [(tmp_path / "nowhere", f"{tmp_path / 'nowhere'}: no such folder; point --data at"),
                            (tmp_path / "shards" / "index.json", "index.json is a file: point --data at the folder")]:
            run, _ = train(data)  # (they said "no shard sets ...; build some first")
            assert run.returncode == 1 and error in run.stderr and "Traceback" not in run.stderr

    built = pipeline_cli("build", "joblib", tmp_path / "out", tmp_path / "split", "--validation", "0.1")
    assert built.returncode == 0, built.stderr
    assert "wrote 5400 samples" in built.stderr and "wrote 600 samples" in built.stderr
    run, result = train(tmp_path / "split")
    assert run.returncode == 0, run.stderr
    kind = {"int64": "int64;", "float64": "float64, floats holding whole numbers;"}[labels]
    assert f"task: classification into 5 classes (labels y: {kind}" in run.stderr
    assert result["val_samples"] == 600 and result["val_accuracy"] > 0.8  # chance: 0.2


def test_seed_1_two_runs_of_the_recipe_are_named_and_one_is_chosen(tmp_path: Path) -> None:
    x, y = clusters(3000, 16, 3, seed=2)
    write_recipe(tmp_path / "out", x, y, batch_size=4)
    write_recipe(tmp_path / "out", x, y, batch_size=36)
    refused = pipeline_cli("build", "joblib", tmp_path / "out", tmp_path / "shards", "--validation", "0.1")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "x_4.job/y_4.job" in refused.stderr and "x_36.job/y_36.job" in refused.stderr
    assert "--batch-size 4" in refused.stderr
    built = pipeline_cli("build", "joblib", tmp_path / "out", tmp_path / "shards", "--validation", "0.1",
                         "--batch-size", "36", "--dtype", "x=float32")
    assert built.returncode == 0, built.stderr
    run, result = train(tmp_path / "shards")
    assert run.returncode == 0, run.stderr
    assert result["train_samples"] + result["val_samples"] == 2988 and result["val_accuracy"] > 0.7


def test_seed_2_one_pt_file_per_sample_with_its_own_split_names(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(3)
    patterns = torch.randn(4, 3, 32, 32, generator=generator)
    root = tmp_path / "donnees"
    root.mkdir()
    labels, ids = {}, []
    for n in range(600):
        sample_id, label = f"img-{n}", n % 4
        torch.save(patterns[label] + 3 * torch.randn(3, 32, 32, generator=generator), root / f"{sample_id}.pt")
        labels[sample_id] = label
        ids.append(sample_id)
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    (tmp_path / "partition.json").write_text(json.dumps({"entrainement": ids[:500], "validation": ids[500:]}))
    built = pipeline_cli("build", "files", root, tmp_path / "shards", "--labels", tmp_path / "labels.json",
                         "--partition", tmp_path / "partition.json")
    assert built.returncode == 0, built.stderr
    run, _ = train(tmp_path / "shards")
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "has no split 'train'; it has 'entrainement', 'validation': choose another with --train-split" in run.stderr
    run, result = train(tmp_path / "shards", "--train-split", "entrainement", "--lr", "0.01")
    assert run.returncode == 0, run.stderr
    assert "task: classification into 4 classes (labels y: int" in run.stderr
    assert result["val_samples"] == 100 and result["val_accuracy"] > 0.6  # chance: 0.25


def test_real_valued_labels_are_a_regression_reported_as_rmse(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(size=(8000, 12))
    y = x @ rng.normal(size=12) + 0.1 * rng.normal(size=8000)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    built = pipeline_cli("build", "arrays", tmp_path / "shards", "--array", f"x={tmp_path / 'x.npy'}",
                         "--array", f"y={tmp_path / 'y.npy'}", "--validation", "1000", "--dtype", "x=float32")
    assert built.returncode == 0, built.stderr
    run, result = train(tmp_path / "shards", "--lr", "0.01")
    assert run.returncode == 0, run.stderr
    assert "task: regression on 1 output (labels y: float64, real values; MSELoss, validation RMSE)" in run.stderr
    assert result["task"] == "regression" and result["val_rmse"] < 0.3 * float(np.std(y))
