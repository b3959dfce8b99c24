"""``scripts/bench.py --quick`` end to end, so that the main benchmark cannot rot: every reader
delivers every sample, and each part of the report is there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench.py"


def script_module(name: str) -> ModuleType:
    """``scripts/<name>.py`` imported (with ``scripts/`` on the path, as when it runs)."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH.parent))


def test_the_quick_benchmark_runs_every_reader_and_reports_each_part(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(BENCH), "--quick", "--shapes", "tabular", "--workers", "0", "--epochs",
                          "1", "--tmp", str(tmp_path), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    rows = report["throughput"]
    assert {row["loader"] for row in rows} == {"this loader", "webdataset", "joblib batches", ".pt per sample",
                                                "memmap gather", "cat (bytes)"}
    for row in rows:  # every reader read every sample it was given: 5,000, or the .pt recipe's first 200
        assert row["samples"] == (200 if row["loader"] == ".pt per sample" else 5000), row
        assert "delivered" not in row["note"] and row["samples_per_s"] > 0
    shuffle = {row["loader"]: row for row in report["shuffle"]}
    assert shuffle["full random permutation"]["distinct_mean"] > 9
    assert len(shuffle) == 4 and all(row["batches"] > 0 for row in shuffle.values())
    # 3,000 samples are cut into units of one batch (8 a rank at least), whatever the buffer: the table says so
    ours = [shuffle["this loader (default buffer)"], shuffle["this loader (shuffle_buffer=1000)"]]
    assert [row["shuffled_together"] for row in ours] == [256, 256] and ours[1]["shuffle_buffer"] == 1000
    assert "| this loader (default buffer) | 0 | 256 |" in run.stdout
    memory = report["memory"]
    assert memory["delivered"] == memory["samples"] == 5000 and memory["peak_pss_mb"] > 0
    assert {target["metric"].split(":")[0] for target in report["targets"]} >= {"memory"}
    assert (tmp_path / "out" / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_the_gpu_benchmark_runs_its_cpu_path_where_there_is_no_gpu(tmp_path: Path) -> None:
    script = BENCH.with_name("bench_gpu.py")
    run = subprocess.run([sys.executable, str(script), "--quick", "--out", str(tmp_path)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "bench_gpu.json").read_text())
    assert [row["workers"] for row in report["rows"]] == [0, 2]
    for row in report["rows"]:
        assert row["epoch_samples"] == [20_000, 20_000] and 0 <= row["input_bound"] <= 1
        assert row["samples_per_s"] > 0 and row["profile"]["decode_s"] > 0
        assert (row["copy_overlap"] is None) == (report["device"] == "CPU (no CUDA device)")
    assert "| 2 |" in run.stdout


def test_copy_overlap_is_the_share_of_copy_time_inside_steps() -> None:
    overlap = script_module("bench_gpu").overlap
    assert overlap([(0, 1), (2, 4)], [(0.5, 3)]) == 0.5
    assert overlap([(0, 1)], [(2, 3)]) == 0  # steps run one after another on one stream: they never overlap
    assert abs(overlap([(1, 2)], [(0, 1.5), (1.8, 5)]) - 0.7) < 1e-9
    assert overlap([], [(0, 1)]) == 0


def test_the_copy_timer_times_each_batch_once_not_its_fields_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    bench_gpu = script_module("bench_gpu")

    class Event:  # a CUDA event's stand-in: this machine may have no GPU
        def __init__(self, enable_timing: bool) -> None:
            pass

        def record(self) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "Event", Event)
    batch = {"x": torch.zeros(4, 3), "y": torch.zeros(4, dtype=torch.int64)}
    with bench_gpu.CopyTimer() as timer:
        copied = bench_gpu.prefetch._to_device(batch, torch.device("cpu"))
        bench_gpu.prefetch._to_device(batch, torch.device("cpu"))
    assert set(copied) == {"x", "y"} and len(timer.events) == 2  # one pair of events a batch
    assert bench_gpu.prefetch._to_device is timer._copy


def test_the_image_benchmark_runs_every_reader_on_the_same_jpeg_files(tmp_path: Path) -> None:
    script = BENCH.with_name("bench_images.py")
    run = subprocess.run([sys.executable, str(script), "--quick", "--rows", "120", "--workers", "0", "--tmp",
                          str(tmp_path), "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "bench_images.json").read_text())
    assert [(row["loader"], row["workers"]) for row in report["rows"]] == [
        ("decoder alone", None), ("this loader", 0), ("webdataset decode('pil')", 0), ("ImageFolder + DataLoader", 0)]
    for row in report["rows"]:
        assert row["samples"] == 120 and not row["note"] and row["samples_per_s"] > 0, row
    assert [target["metric"] for target in report["targets"]] == ["0 workers: this loader / decoder alone"]
    assert "| this loader | 0 |" in run.stdout


def test_the_remote_table_compares_each_row_with_its_own_local_epochs_and_shows_ceilings_uncapped(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    remote = script_module("bench_remote")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    local = remote.row("local", "this loader (2 workers)", 0.35, 35_000_000, requests=0, peak_pss=10**8, cpu=(0.1, 0))
    # a ranged GET reads other bytes than an epoch (the ratio is of MB/s), beside faster local epochs than the row above
    ranged = remote.row("s3", "ranged GETs", 0.05, 100_000_000, requests=200) | {
        "local_seconds": 0.1, "local_mb_per_s": 350.0}
    cached = remote.row("s3", "this loader (2 workers, cache_dir)", 0.093, 35_000_000, requests=0, peak_pss=10**8,
                        cpu=(0.12, 0.0)) | {"local_seconds": 0.15, "local_mb_per_s": 35 / 0.15, "local_cpu_s": 0.15}
    remote.print_table([local, ranged, cached])
    out = capsys.readouterr().out
    assert "| s3 | ranged GETs | 0.05 | 2,000 | 571% | 0.10 |" in out
    assert "| s3 | this loader (2 workers, cache_dir) | 0.09 | 376 | 161% | 0.15 |" in out
    assert out.splitlines()[-1] == ("- s3, this loader (2 workers, cache_dir): loader 0.12 s (local 0.15) + server "
                                    "0.00 s of CPU an epoch: at most 250% of the local loader, reached 161%")
    assert local["vs_local"] is None and cached["cpu_ceiling_vs_local"] == pytest.approx(2.5)


def test_the_main_benchmarks_help_lists_the_remote_source() -> None:
    run = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "--source {http,s3,both}" in run.stdout, run.stderr[-3000:]


def test_the_text_benchmark_reads_both_sets_with_and_without_workers(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(BENCH.with_name("bench_text.py")), "--quick", "--epochs", "1", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads((tmp_path / "bench_text.json").read_text())["rows"]
    assert [row["workers"] for row in rows] == [0, 2]
    assert all(0 < row["ratio"] == row["text"]["samples_per_s"] / row["without"]["samples_per_s"] for row in rows)
    table = [line.split(" | ")[0] for line in run.stdout.splitlines() if line.startswith("| ")]
    assert table == ["| workers", "| 0", "| 2"]


@pytest.mark.parametrize("script", ["bench_index.py", "bench_mixing.py", "bench_text.py"])
def test_a_tmp_folder_that_is_not_there_is_a_usage_error(tmp_path: Path, script: str) -> None:
    missing = tmp_path / "missing"
    run = subprocess.run([sys.executable, str(BENCH.with_name(script)), "--quick", "--tmp", str(missing), "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.splitlines()[-1] == (f"{script}: error: argument --tmp: no folder '{missing}': make it first, "
                                           "or leave --tmp out for the system's temporary folder")
