"""The training example: checkpoint, crash, resume gives the very model an uninterrupted run gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

import pipeline
from tests.helpers import child_pids

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


def command(data: Path, folder: Path, epochs: int, *args: str) -> list[str]:
    """train.py on ``data`` for ``epochs``, writing its result into ``folder``."""
    folder.mkdir(exist_ok=True)
    return [sys.executable, str(TRAIN), "--data", str(data), "--epochs", str(epochs), "--batch-size", "50",
            "--quiet", "--result", str(folder / "result.json"), *args]


def train(data: Path, folder: Path, *args: str, epochs: int = 2) -> dict:
    run = subprocess.run(command(data, folder, epochs, *args), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = folder / "result.json"
    return json.loads(result.read_text()) if result.exists() else {}


#: Runs train.py with the given arguments (which name a checkpoint) and makes it stop early;
#: returns the number of epochs the interrupted run was meant to train.
Interrupt = Callable[[list[str]], int]


def assert_resume_trains_the_same_model(data: Path, tmp_path: Path, workers: str, interrupt: Interrupt) -> None:
    checkpoint = tmp_path / "ckpt.pt"
    epochs = interrupt(["--workers", workers, "--checkpoint", str(checkpoint)])
    resumed = train(data, tmp_path / "b", "--workers", workers, "--checkpoint", str(checkpoint), "--resume",
                    epochs=epochs)
    straight = train(data, tmp_path / "a", "--workers", workers, epochs=epochs)
    assert resumed["weights_sum"] == pytest.approx(straight["weights_sum"], rel=1e-6)
    assert resumed["val_accuracy"] == straight["val_accuracy"] > 0.8
    profile = straight["profile"]  # the last epoch's, summed over the workers (when there are some)
    assert profile["decode_s"] > 0 and profile["gather_s"] > 0 and profile["wait_s"] > 0 and profile["step_s"] > 0


@pytest.mark.parametrize("workers, stop", [("0", "13"), ("2", "45"), ("0", "40")])  # 40: an epoch's last batch
def test_resume_after_a_crash_trains_the_same_model(data: Path, tmp_path: Path, workers: str, stop: str) -> None:
    def stop_after(args: list[str]) -> int:
        assert train(data, tmp_path / "b", *args, "--stop-after", stop) == {}
        return 2

    assert_resume_trains_the_same_model(data, tmp_path, workers, stop_after)


def test_a_stop_on_an_epochs_last_batch_ends_that_epoch_first(data: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt.pt"  # 2,000 samples in batches of 50: batch 40 ends epoch 0
    run = subprocess.run(command(data, tmp_path, 2, "--checkpoint", str(checkpoint), "--stop-after", "40"),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("epoch 0: train loss ") and "epoch 1" not in run.stdout  # validated, reported
    assert "stopped after 40 batches" in run.stderr
    state = torch.load(checkpoint, weights_only=True)["loader"]
    assert (state["epoch"], state["batches"]) == (1, 0)


def test_a_killed_worker_stops_training_with_a_message_and_resume_trains_the_same_model(
        data: Path, tmp_path: Path) -> None:
    def kill_a_worker(args: list[str]) -> int:
        checkpoint = Path(args[args.index("--checkpoint") + 1])
        # meant to train for long: the kill comes first, whenever the machine lets it
        run = subprocess.Popen(command(data, tmp_path / "b", 1000, *args, "--checkpoint-every", "5"),
                               stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not checkpoint.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(child_pids(run.pid)[0], signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = run.communicate(timeout=60)
        assert time.monotonic() - killed < 10
        assert run.returncode == 1, stderr[-3000:]
        assert "Traceback" not in stderr and "DataLoader worker (pid" in stderr, stderr[-3000:]
        assert "--resume continues from the last checkpoint exactly" in stderr
        return torch.load(checkpoint, weights_only=True)["loader"]["epoch"] + 1

    assert_resume_trains_the_same_model(data, tmp_path, "2", kill_a_worker)
