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
sys.path.insert(0, str(TRAIN.parent))
from train import main as train_main  # noqa: E402
from train import parse_args  # noqa: E402
from train_checkpoint import CannotResume  # noqa: E402


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
    # the last epoch's loss is over all its samples, those before the stop too
    assert resumed["train_samples"] == straight["train_samples"] == 2000
    assert resumed["train_loss"] == pytest.approx(straight["train_loss"], rel=1e-6)
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
        assert time.monotonic() - killed < 30  # a death unseen waits for ever; this also times the process's
        # shutdown, seconds on a loaded machine (5.4 s measured)
        assert run.returncode == 1, stderr[-3000:]
        assert "Traceback" not in stderr and "DataLoader worker (pid" in stderr, stderr[-3000:]
        assert "--resume continues from the last checkpoint exactly" in stderr
        return torch.load(checkpoint, weights_only=True)["loader"]["epoch"] + 1

    assert_resume_trains_the_same_model(data, tmp_path, "2", kill_a_worker)


@pytest.mark.parametrize("args, error", [
    (["--resume"], "--resume needs --checkpoint FILE: the checkpoint to continue from"),
    (["--resume", "--checkpoint", "missing.pt"], "--resume: no checkpoint at missing.pt; leave out --resume to start "
                                                 "afresh (--checkpoint missing.pt saves one there)"),
    (["--stop-after", "5", "--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint FILE: the checkpoint "
                                                       "to save"),
    (["--stop-after", "5"], "--stop-after needs --checkpoint FILE: the checkpoint to save"),
    (["--checkpoint", "no/such/folder/c.pt"], "--checkpoint no/such/folder/c.pt: no folder no/such/folder to save "
                                               "it in; make it first, or give a path in a folder that exists"),
    (["--classes", "-3"], "argument --classes: '-3' is not a whole number of at least 1"),
    (["--workers", "-1"], "argument --workers: '-1' is not a whole number of at least 0"),
    (["--batch-size", "0"], "argument --batch-size: '0' is not a whole number of at least 1"),
    (["--checkpoint-every", "x", "--checkpoint", "c.pt"], "argument --checkpoint-every: 'x' is not a whole number of at "
                                                          "least 1"),
])
def test_options_that_cannot_work_are_usage_errors_naming_the_option(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, args: list[str],
        error: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        parse_args(["--data", "shards", *args])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"train.py: error: {error}"


def test_labels_beyond_the_classes_given_are_an_error_naming_the_label_and_the_split(data: Path,
                                                                                     tmp_path: Path) -> None:
    run = subprocess.run(command(data, tmp_path, 1, "--workers", "0", "--classes", "2"), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.splitlines()[-1] == (
        "train.py: label 2 in the train split is not one of the 2 classes (0 to 1) given by --classes 2: give "
        "--classes 3 or more, or leave it out to count the classes from the labels")


def test_a_checkpoint_that_cannot_be_continued_is_a_message_naming_it_not_a_traceback(data: Path,
                                                                                       tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt.pt"
    assert train(data, tmp_path, "--workers", "0", "--checkpoint", str(checkpoint), "--stop-after", "3") == {}
    damaged, other = tmp_path / "damaged.pt", tmp_path / "other.pt"
    damaged.write_bytes(checkpoint.read_bytes()[:1000])
    torch.save({"weights": torch.zeros(2)}, other)

    def refused(saved: Path, *args: str) -> str:
        """The refusal as the command prints it."""
        run = subprocess.run(command(data, tmp_path, 2, "--workers", "0", "--checkpoint", str(saved), "--resume",
                                     *args), capture_output=True, text=True, timeout=300)
        assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
        return run.stderr.splitlines()[-1]

    def refused_here(saved: Path, *args: str) -> str:
        """The refusal, from main() in this process (what the command prints after "train.py: "); the
        torch settings main() makes (threads, seed) are put back for the tests that follow."""
        threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
        try:
            with pytest.raises(CannotResume) as refusal:
                train_main(command(data, tmp_path, 2, "--workers", "0", "--checkpoint", str(saved), "--resume",
                                   *args)[2:])
        finally:
            torch.set_num_threads(threads)
            torch.random.set_rng_state(rng)
        return f"train.py: {refusal.value}"

    cut = refused(damaged)
    assert cut.startswith(f"train.py: cannot resume: {damaged} is not a checkpoint that torch can read (damaged, cut "
                          f"short, or another kind of file: ") and cut.endswith(
        "); give the right file, or leave out --resume to start afresh")
    assert refused_here(other) == (f"train.py: cannot resume: {other} is not a checkpoint of this script (it has no "
                                   f"'model', 'optimizer', 'loader'); give the file its --checkpoint saved")
    assert refused_here(checkpoint, "--task", "regression") == (
        f"train.py: cannot resume from {checkpoint}: its model does not fit this data and task (weight 3x6 saved, 1x6 "
        f"here; bias 3 saved, 1 here): it was trained on other data, or with another --task or --classes; give the "
        f"same ones, or another --checkpoint to start afresh")
    assert refused_here(checkpoint, "--batch-size", "25") == (
        f"train.py: cannot resume from {checkpoint}: the checkpoint was taken with batch_size=50, this loader has "
        f"batch_size=25 (it can change only at an epoch boundary: resume with the checkpoint's, and change it once "
        f"this epoch ended, at a checkpoint taken after its loop; one taken in its last step is still in the epoch)")
    assert train(data, tmp_path, "--workers", "0", "--checkpoint", str(checkpoint), "--resume", epochs=1)["epoch"] == 0
    run = subprocess.run(command(data, tmp_path, 1, "--workers", "0", "--checkpoint", str(checkpoint), "--resume"),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout == "", run.stderr[-3000:]
    assert run.stderr.splitlines()[-1] == (f"{checkpoint} has trained 1 epoch already: nothing to do; give --epochs 2 "
                                           f"or more to train on")


def test_a_learning_rate_given_on_resume_is_the_one_trained_with(data: Path, tmp_path: Path) -> None:
    """Loading the optimizer's state brought back the checkpoint's learning rate over --lr."""
    checkpoint = tmp_path / "ckpt.pt"
    train(data, tmp_path / "a", "--workers", "0", "--checkpoint", str(checkpoint), "--lr", "0.05", epochs=1)
    train(data, tmp_path / "b", "--workers", "0", "--checkpoint", str(checkpoint), "--resume", "--lr", "0.01",
          epochs=2)
    state = torch.load(checkpoint, weights_only=True)
    assert [group["lr"] for group in state["optimizer"]["param_groups"]] == [0.01]
