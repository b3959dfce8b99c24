"""``pipeline tune``'s measuring process: the user's own options (transforms included) reach it,
what it times and counts is the loader's, and it ends leaving nothing behind."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

import pipeline
from pipeline.measure.throughput import GRACE_S, Setting, measure


@pytest.fixture
def shards(tune_shards: Path) -> Path:
    return tune_shards


def run_script(folder: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    script = folder / "job.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parent.parent)


def test_a_transform_defined_in_the_users_script_is_measured(shards: Path, tmp_path: Path) -> None:
    run = run_script(tmp_path, """
        import sys, time
        import pipeline

        def slow(batch):
            time.sleep(0.02)
            return batch

        if __name__ == "__main__":
            result = pipeline.tune(sys.argv[1], workers=[0], batch_size=100, seconds=0.4, warmup=0.1,
                                   options={"batch_transform": slow})
            print(result.rows[0].samples_per_s)
            print(result.call())
        """, str(shards))
    assert run.returncode == 0, run.stderr[-3000:]
    rate, call = run.stdout.splitlines()
    assert 0 < float(rate) < 100 / 0.02  # 20 ms a batch of 100 bounds it (the loader alone: ~100x that)
    assert call == f"pipeline.make_loader({str(shards)!r}, num_workers=0, batch_size=100, batch_transform=slow)"


def test_an_option_that_cannot_be_sent_to_the_measuring_process_is_named_before_it_starts(shards: Path) -> None:
    pickle_says = "Can't (pickle|get) local object"  # (pickle's own words, which Python 3.13 changed)
    with pytest.raises(ValueError, match="^" + re.escape(
            "options['sample_transform'] cannot be sent to the measuring process (each setting runs in a process of "
            "its own): ") + pickle_says + re.escape(
            " 'test_an_option_that_cannot_be_sent_to_the_measuring_process_is_named_before_it_starts.<locals>."
            "<lambda>'; define it at the top level of a module or script, as for DataLoader workers started with "
            "spawn") + "$"):
        pipeline.tune(str(shards), workers=[0], seconds=30, options={"sample_transform": lambda sample: sample})


def test_a_function_of_python_c_is_named_when_the_measuring_process_cannot_load_it(shards: Path,
                                                                                   tmp_path: Path) -> None:
    code = ("import sys, pipeline\ndef double(batch): return batch\n"
            "pipeline.tune(sys.argv[1], workers=[0], seconds=30, options={'batch_transform': double})")
    run = subprocess.run([sys.executable, "-c", code, str(shards)], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parent.parent)
    assert run.returncode == 1
    assert re.fullmatch(re.escape(  # (the module as pickle shows it, which Python 3.13 changed)
        "ValueError: options['batch_transform'] could not be loaded in the measuring process (AttributeError: "
        "Can't get attribute 'double' on <module '__main__' ") + r"\(.*\)>" + re.escape(
        "): a function of an interactive session, a notebook or python -c cannot be; define it in a file (measuring "
        "num_workers=0)"), run.stderr.splitlines()[-1])


@pytest.mark.parametrize("options, message", [
    ({"num_workers": 3}, "options: num_workers is what tune varies: give the values to try as workers=[...]"),
    ({"prefetch_factor": 4}, "options: prefetch_factor is what tune varies: give the values to try as prefetch=[...]"),
])
def test_what_tune_varies_is_refused_as_an_option(shards: Path, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        pipeline.tune(str(shards), workers=[0], seconds=30, options=options)


def test_a_single_number_of_workers_is_refused_with_the_list_it_means(shards: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("workers= takes a list of the numbers of workers to try, e.g. "
                                                   "workers=[1]; got 1")):
        pipeline.tune(str(shards), workers=1, seconds=30)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("prefetch= takes a list of the prefetch factors to try, e.g. "
                                                   "prefetch=[4]; got 4")):
        pipeline.tune(str(shards), prefetch=4, seconds=30)  # type: ignore[arg-type]


def tell_start_method(batch: dict) -> dict:
    raise LookupError(f"this worker was started with {multiprocessing.get_start_method()}")


def test_the_workers_start_as_the_callers_would(shards: Path) -> None:
    """Spawn's child would start its DataLoader workers with spawn too: slower to start, and each with
    its own copy of torch, unlike the job's workers (forked on Linux)."""
    ours = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    with pytest.raises(ValueError, match=f"^LookupError: this worker was started with {ours}"):
        measure(str(shards), Setting(1, 2), {"batch_size": 100, "batch_transform": tell_start_method}, seconds=0.3,
                warmup=0.1)


def test_the_first_batch_is_timed_before_the_simulated_step(shards: Path) -> None:
    row = measure(str(shards), Setting(0, None), {"batch_size": 100}, seconds=0.1, warmup=0, step_ms=3000)
    assert row.first_batch_s is not None and row.first_batch_s < 3  # (about 0.05 s: a busy machine stalls)


def test_the_bytes_counted_are_those_of_the_batches_delivered(shards: Path, tmp_path: Path) -> None:
    row = measure(str(shards), Setting(0, None), {"batch_size": 100}, seconds=0.3, warmup=0.1)
    assert row.samples > 0 and row.batch_bytes == (16 * 4 + 8) * row.samples  # x: 16 float32, y: an int64
    assert row.mb_per_s == pytest.approx(row.batch_bytes / row.seconds / 1e6)
    only_y = measure(str(shards), Setting(0, None), {"batch_size": 100, "fields": ["y"]}, seconds=0.3, warmup=0.1)
    assert only_y.samples > 0 and only_y.batch_bytes == 8 * only_y.samples
    with wds.TarWriter(str(tmp_path / "w.tar")) as sink:  # no index: the bytes are still counted as delivered
        for i in range(400):
            sink.write({"__key__": f"k{i}", "npy": np.full(3, i, np.float32), "cls": i, "txt": "hello"})
    foreign = measure(str(tmp_path / "w.tar"), Setting(0, None), {"batch_size": 50}, seconds=0.3, warmup=0.1)
    assert foreign.samples > 0 and foreign.batch_bytes == (3 * 4 + 8 + 5) * foreign.samples


def test_measuring_leaves_no_temporary_files(shards: Path, short_tmp: Path, monkeypatch) -> None:
    private = short_tmp
    monkeypatch.setenv("TMPDIR", str(private))
    row = measure(str(shards), Setting(1, 2), {"batch_size": 100}, seconds=0.3, warmup=0.1)
    assert not row.stopped_early and row.samples > 0
    stopped = measure(str(shards), Setting(1, 2), {"batch_size": 100}, seconds=30, warmup=0.1, give_up_below=1e12)
    assert stopped.stopped_early and GRACE_S <= stopped.seconds < 15  # of the 30 asked for (a busy machine stalls)
    assert stopped.samples > 0 and stopped.peak_rss_mb > 0 and stopped.first_batch_s is not None
    assert sorted(os.listdir(private)) == []
