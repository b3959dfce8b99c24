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
