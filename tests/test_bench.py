"""``scripts/bench.py --quick`` end to end, so that the main benchmark cannot rot: every reader
delivers every sample, and each part of the report is there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench.py"


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
    sys.path.insert(0, str(BENCH.parent))
    try:
        from bench_gpu import overlap
    finally:
        sys.path.remove(str(BENCH.parent))
    assert overlap([(0, 1), (2, 4)], [(0.5, 3)]) == 0.5
    assert overlap([(0, 1)], [(2, 3)]) == 0  # steps run one after another on one stream: they never overlap
    assert abs(overlap([(1, 2)], [(0, 1.5), (1.8, 5)]) - 0.7) < 1e-9
    assert overlap([], [(0, 1)]) == 0


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
