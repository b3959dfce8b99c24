"""``pipeline tune``: each setting measured in a process of its own, a clearly slower one
stopped early, and the recommendation the table and the call come down to."""

from __future__ import annotations

import ast
import functools
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import cli_values as values
from pipeline.cli import main
from pipeline.measure import throughput
from pipeline.measure import tune as tune_module
from pipeline.measure.throughput import Measured, Setting, measure
from pipeline.measure.tune import TuneResult, worker_counts


@pytest.fixture
def shards(tune_shards: Path) -> Path:
    return tune_shards


def test_the_command_measures_each_setting_and_prints_the_call_to_use(shards: Path, tmp_path: Path) -> None:
    chart = tmp_path / "tune.png"
    run = subprocess.run([sys.executable, "-m", "pipeline", "tune", str(shards), "--workers", "0,1", "--seconds",
                          "0.5", "--batch-size", "100", "--step-ms", "1", "--plot", str(chart)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    # 0 and 1 workers at prefetch 2, then prefetch 1 and 4 at the better of them (1: the only one with workers)
    assert [tuple(cell.strip() for cell in row.split("|")[1:3]) for row in rows] == [
        ("0", "-"), ("1", "2"), ("1", "1"), ("1", "4")]
    assert sum("recommended" in row for row in rows) == 1
    assert all(float(row.split("|")[3].replace(",", "")) > 0 for row in rows)  # samples/s
    call = next(line for line in run.stdout.splitlines() if line.startswith("recommended: "))
    assert call.startswith(f"recommended: pipeline.make_loader({str(shards)!r}, num_workers=")
    assert call.endswith("batch_size=100)")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run.stderr.count("samples/s, peak") == 4  # a line as each setting finishes


def test_a_setting_measures_the_samples_of_its_time_and_its_stages(shards: Path) -> None:
    row = measure(str(shards), Setting(0, None), {"batch_size": 100}, seconds=0.5, warmup=0.1, step_ms=2)
    assert not row.stopped_early and row.seconds >= 0.5 and row.samples % 100 == 0
    assert row.samples_per_s < 100 / 0.002  # the simulated step bounds it
    assert row.profile["decode_s"] > 0 and row.profile["step_s"] >= 0.002 * row.samples / 100


def test_a_mix_is_tuned_and_a_missing_source_of_one_is_named_before_any_measuring(shards: Path,
                                                                                  tmp_path: Path) -> None:
    result = pipeline.tune({"a": str(shards), "b": str(shards)}, workers=[0], batch_size=100, seconds=0.3,
                           warmup=0.1)
    assert [r.setting.num_workers for r in result.rows] == [0] and result.rows[0].samples > 0
    missing = re.escape(f"{tmp_path / 'nowhere'}: no such shard or folder")
    with pytest.raises((pipeline.IndexFormatError, pipeline.SourceError), match=missing):
        pipeline.tune({"a": str(shards), "b": str(tmp_path / "nowhere")}, workers=[0], seconds=30)


def test_the_call_shows_paths_in_a_list_or_a_mix_as_text(shards: Path) -> None:
    """It showed ``PosixPath('...')``, which the printed call cannot run after ``import pipeline``."""
    listed = sorted(shards.glob("*.tar"))[:2]
    call = TuneResult({"a": listed, "b": shards}, {"cache_dir": shards / "cache"}, [row(0, 900, 200)]).call()
    assert call == (f"pipeline.make_loader({{'a': {[str(p) for p in listed]!r}, 'b': {str(shards)!r}}}, num_workers=0, "
                    f"cache_dir={str(shards / 'cache')!r})")


def test_bad_data_is_an_error_that_names_it(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "pipeline", "tune", str(tmp_path / "nowhere"), "--workers", "0"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and f"{tmp_path / 'nowhere'}: no such shard" in run.stderr


def row(workers: int, rate: float, memory: float, prefetch: int | None = 2, stopped: bool = False) -> Measured:
    return Measured(Setting(workers, prefetch if workers else None), int(rate), 1.0, 100 * int(rate), 0.1, memory,
                    memory, stopped_early=stopped)


def test_the_recommendation_prefers_less_memory_then_fewer_workers_among_the_near_fastest() -> None:
    rows = [row(0, 900, 200), row(1, 1000, 260), row(2, 980, 240), row(2, 990, 240, prefetch=1), row(4, 2000, 900, stopped=True)]
    result = TuneResult("data/", {"batch_size": 64}, rows)
    # within 5% of the fastest, the least memory of those, then the fewest units prefetched
    assert result.best.setting == Setting(2, 1)
    assert result.call() == "pipeline.make_loader('data/', num_workers=2, prefetch_factor=1, batch_size=64)"
    assert TuneResult("data/", {}, rows, memory_mb=230).best.setting == Setting(0, None)
    with pytest.raises(ValueError, match="no setting ran within 150 MB"):
        _ = TuneResult("data/", {}, rows, memory_mb=150).best


class Scale:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, batch: dict) -> dict:
        return batch


def test_the_call_names_an_object_of_the_users_by_its_option_where_no_python_writes_it() -> None:
    """A function is written by its name, a value by its repr where that is Python; an object's
    repr (``<...Scale object at 0x...>``), or a partial's, is no Python: the option's name
    stands for the user's variable that holds it."""
    rows = [row(0, 900, 200)]
    options = {"batch_size": 64, "batch_transform": Scale(2.0), "sample_transform": functools.partial(print, end=""),
               "fields": ["x", "y"], "shuffle_buffer": 1000}
    call = TuneResult("data/", options, rows).call()
    assert call == ("pipeline.make_loader('data/', num_workers=0, batch_size=64, batch_transform=batch_transform, "
                    "sample_transform=sample_transform, fields=['x', 'y'], shuffle_buffer=1000)")
    ast.parse(call)
    method = TuneResult("data/", {"batch_transform": Scale(2.0).__call__}, rows).call()  # (a method: no name alone)
    assert method == "pipeline.make_loader('data/', num_workers=0, batch_transform=batch_transform)"
    for bound in ({}.get, np.add.reduce, "abc".upper):  # (bound methods of C types: a dotted name that is not them)
        assert TuneResult("data/", {"batch_transform": bound}, rows).call().endswith("batch_transform=batch_transform)")
    kept = {"batch_transform": Steps.scale, "weights": np.arange(10_000.0)}  # (its repr elides: [0., 1., ..., 9999.])
    assert TuneResult("data/", kept, rows).call() == ("pipeline.make_loader('data/', num_workers=0, "
                                                       "batch_transform=Steps.scale, weights=weights)")


def test_the_call_and_the_chart_leave_a_urls_password_out_and_say_so(tmp_path: Path, monkeypatch) -> None:
    """They showed ``http://user:s3cret@...``, which every message of the project leaves out."""
    rows = [row(0, 900, 200)]
    url = "http://user:s3cret@127.0.0.1:8000/shards/train/"
    told = "  # credentials (user, password, query) left out of the URL: put them back"
    assert TuneResult(url, {}, rows).call() == f"pipeline.make_loader('http://127.0.0.1:8000/shards/train/', " \
                                               f"num_workers=0){told}"
    assert TuneResult({"a": url, "b": "local/set"}, {}, rows).call() == (
        f"pipeline.make_loader({{'a': 'http://127.0.0.1:8000/shards/train/', 'b': 'local/set'}}, num_workers=0){told}")
    assert TuneResult("https://host/set/", {}, rows).call() == "pipeline.make_loader('https://host/set/', num_workers=0)"
    shards = [url + "shard-000000.tar", "local/shard-000001.tar"]  # a list of shards: each URL too
    assert TuneResult(shards, {}, rows).call() == (
        f"pipeline.make_loader(['http://127.0.0.1:8000/shards/train/shard-000000.tar', 'local/shard-000001.tar'], "
        f"num_workers=0){told}")
    assert TuneResult(("a.tar", "b.tar"), {}, rows).call() == "pipeline.make_loader(('a.tar', 'b.tar'), num_workers=0)"
    assert repr(TuneResult(shards, {}, rows)).startswith(
        "TuneResult(data=['http://127.0.0.1:8000/shards/train/shard-000000.tar', 'local/shard-000001.tar'], options={}, ")
    pytest.importorskip("matplotlib")
    import matplotlib

    monkeypatch.setitem(matplotlib.rcParams, "svg.fonttype", "none")  # (the title as text, not as paths)
    TuneResult(url, {}, rows).plot(tmp_path / "tune.svg")
    chart = (tmp_path / "tune.svg").read_text()
    assert "http://127.0.0.1:8000/shards/train/: recommended" in chart and "s3cret" not in chart


def test_the_call_writes_paths_as_text_in_a_mix_and_in_options() -> None:
    """A mix of Paths, or a Path option, was written ``PosixPath('...')``: a NameError when pasted."""
    rows = [row(0, 900, 200)]
    call = TuneResult({"a": Path("one/set"), "b": "two"}, {"cache_dir": Path("/tmp/cache"),
                                                           "fill": {"w": [Path("p"), (Path("q"),)]}}, rows).call()
    assert call == ("pipeline.make_loader({'a': 'one/set', 'b': 'two'}, num_workers=0, cache_dir='/tmp/cache', "
                    "fill={'w': ['p', ('q',)]})")
    assert eval(call.replace("pipeline.make_loader", "dict"))["cache_dir"] == "/tmp/cache"  # (Python, as pasted)


class Steps:
    @staticmethod
    def scale(batch: dict) -> dict:
        return batch


def test_worker_counts_double_up_to_the_cores() -> None:
    assert worker_counts(1) == [0, 1] and worker_counts(2) == [0, 1, 2] and worker_counts(12) == [0, 1, 2, 4, 8, 12]


def test_the_library_function_is_the_commands(shards: Path) -> None:
    result = pipeline.tune(str(shards), batch_size=100, workers=[0], seconds=0.3, warmup=0.1)
    assert [r.setting for r in result.rows] == [Setting(0, None)] and result.best is result.rows[0]


def test_fields_and_fill_are_passed_on_from_the_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An indexed set whose samples lack a field some others have could be tuned from Python only."""
    with pipeline.ShardWriter(tmp_path / "set") as writer:
        for n in range(600):
            writer.write({"x": np.full(4, n, np.float32), "w": None if n % 7 == 0 else float(n), "note": "-"})
    data = str(tmp_path / "set")
    assert main(["tune", data, "--workers", "0", "--seconds", "0.3", "--batch-size", "50", "--fields", "x,w",
                 "--fill", "w=-1.5"]) == 0
    assert capsys.readouterr().out.strip().endswith(
        f"recommended: pipeline.make_loader({data!r}, num_workers=0, batch_size=50, fields=['x', 'w'], "
        f"fill={{'w': -1.5}})")
    assert values.json_or_text("null") is None and values.json_or_text("none") == "none"
    assert values.json_or_text('"7"') == "7" and values.json_or_text("") == ""


def test_the_table_says_why_a_faster_setting_was_not_recommended() -> None:
    rows = [row(0, 900, 200), row(1, 1000, 260), row(2, 980, 240), row(2, 990, 240, prefetch=1),
            row(2, 995, 240, prefetch=4), row(4, 2000, 900, stopped=True)]
    assert notes(TuneResult("data/", {}, rows).table()) == [
        "", "within 5% of the fastest, but holds more memory", "", "recommended",
        "within 5% of the fastest, but prefetches more",
        "stopped early: clearly slower"]
    assert notes(TuneResult("data/", {}, rows, memory_mb=230).table()) == [
        "recommended", *["over the 230 MB budget"] * 4, "stopped early: clearly slower"]
    nothing = TuneResult("data/", {}, rows, memory_mb=150)
    assert notes(nothing.table()) == [*["over the 150 MB budget"] * 5, "stopped early: clearly slower"]
    with pytest.raises(ValueError, match="no setting ran within 150 MB"):
        _ = nothing.best


def notes(table: str) -> list[str]:
    return [line.split("|")[-2].strip() for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]


def test_the_mb_of_batches_of_unknown_size_are_shown_as_unknown() -> None:
    known, unknown = row(0, 1000, 200), row(1, 900, 250)
    unknown.batch_bytes = None
    table = TuneResult("data/", {}, [known, unknown]).table()
    assert [line.split("|")[4].strip() for line in table.splitlines()] == ["batch MB/s", "---", "0.1", "-"]


def test_under_a_memory_budget_nothing_fits_the_table_is_shown_then_the_error(shards: Path, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "pipeline", "tune", str(shards), "--workers", "0,1", "--seconds", "0.3",
                          "--batch-size", "100", "--memory-mb", "1", "--plot", str(tmp_path / "tune.png")],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 1
    assert notes(run.stdout) == ["over the 1 MB budget"] * 2  # no prefetch sweep at 1 worker: said after the table
    assert run.stdout.splitlines()[-3:] == [
        "", "prefetch_factor 1 and 4 not tried: no setting with workers ran within 1 MB",
        f"chart saved to {tmp_path / 'tune.png'}"]
    assert run.stderr.splitlines()[-1] == ("error: no setting ran within 1 MB: raise memory_mb (--memory-mb), or "
                                           "give a smaller shuffle_buffer")
    assert (tmp_path / "tune.png").read_bytes()[:4] == b"\x89PNG"  # the chart of what was measured


def test_a_setting_that_never_reports_is_stopped_and_named(monkeypatch) -> None:
    silent = socket.socket()  # accepts connections (the kernel does) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.setattr(throughput, "START_LIMIT_S", 4.0)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/data/index.json"
    try:
        started = time.perf_counter()
        with pytest.raises(RuntimeError, match=r"num_workers=0 on http://127\.0\.0\.1:\d+/data/index\.json: no result "
                                               r"within 5 s"):
            measure(url, Setting(0, None), {}, seconds=0.5, warmup=0.1)
        assert time.perf_counter() - started < 30
    finally:
        silent.close()


def test_bad_grids_are_refused(shards: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "pipeline", "tune", str(shards), "--prefetch", "0,2"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "expected numbers >= 1, got '0,2'" in run.stderr
    with pytest.raises(ValueError, match=r"^the numbers of workers must be whole numbers >= 0, got \[-1\]$"):
        pipeline.tune(str(shards), workers=[-1])


def test_images_are_tuned_decoded_and_the_call_builds_them(tmp_path: Path) -> None:
    from tests.images import image_folder

    image_folder(tmp_path / "photos", {"a": 40, "b": 40}, size=(60, 80))
    pipeline.build_imagefolder(tmp_path / "photos", tmp_path / "shards", quiet=True)
    run = subprocess.run([sys.executable, "-m", "pipeline", "tune", str(tmp_path / "shards"), "--workers", "0",
                          "--prefetch", "2", "--seconds", "0.3", "--batch-size", "16", "--images", "image=32"],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    call = next(line for line in run.stdout.splitlines() if line.startswith("recommended: "))
    assert call.endswith("batch_size=16, images={'image': pipeline.Images(32)})")
    row = measure(str(tmp_path / "shards"), Setting(0, None),
                  {"batch_size": 16, "images": {"image": pipeline.Images((24, 32), crop="random", flip=True)}},
                  seconds=0.3, warmup=0.1)
    assert row.samples > 0 and row.profile["decode_s"] > 0
    assert repr(pipeline.Images((24, 32), crop="random", flip=True)) == \
        "pipeline.Images((24, 32), crop='random', flip=True)"
    assert subprocess.run([sys.executable, "-m", "pipeline", "tune", "x", "--images", "image=big"],
                          capture_output=True, text=True).stderr.count("not a whole number: 'big'") == 1


def test_damaged_images_are_tuned_past_with_on_error_skip(tmp_path: Path) -> None:
    from tests.images import image_folder

    written = image_folder(tmp_path / "photos", {"a": 30}, size=(60, 80), png_every=1000)
    first = tmp_path / "photos" / next(iter(written))
    first.write_bytes(first.read_bytes()[:300])  # a truncated image: the build checks its magic bytes only
    pipeline.build_imagefolder(tmp_path / "photos", tmp_path / "shards", quiet=True)
    command = [sys.executable, "-m", "pipeline", "tune", str(tmp_path / "shards"), "--workers", "0", "--prefetch", "2",
               "--seconds", "0.3", "--batch-size", "8", "--images", "image=16"]
    failed = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert failed.returncode == 1 and "(300 bytes, it ends before" in failed.stderr
    assert "; add --on-error skip to train on other samples in its place" in failed.stderr and \
        "on_error=" not in failed.stderr
    run = subprocess.run([*command, "--on-error", "skip"], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    call = next(line for line in run.stdout.splitlines() if line.startswith("recommended: "))
    assert "on_error='skip'" in call


@pytest.mark.parametrize("option, value, message", [
    ("--seconds", "0", "argument --seconds: '0' is not a number > 0"),
    ("--seconds", "inf", "argument --seconds: 'inf' is not a number > 0"),
    ("--step-ms", "-5", "argument --step-ms: '-5' is not a number >= 0"),
    ("--step-ms", "inf", "argument --step-ms: 'inf' is not a number >= 0"),
    ("--memory-mb", "nan", "argument --memory-mb: 'nan' is not a number > 0"),
    ("--memory-mb", "0", "argument --memory-mb: '0' is not a number > 0"),
])
def test_bad_measuring_times_are_usage_errors_naming_the_option(shards: Path, option: str, value: str, message: str,
                                                               capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["tune", str(shards), option, value])
    assert exited.value.code == 2  # as argparse's other refusals
    assert capsys.readouterr().err.splitlines()[-1] == f"pipeline tune: error: {message}"


@pytest.mark.parametrize("options, message", [
    ({"seconds": 0}, "seconds must be finite and > 0, warmup and step_ms finite and >= 0; got seconds=0, warmup=0.5, "
                     "step_ms=0.0"),
    ({"step_ms": -5}, "seconds must be finite and > 0, warmup and step_ms finite and >= 0; got seconds=3.0, "
                      "warmup=0.5, step_ms=-5"),
    ({"memory_mb": float("nan")}, "memory_mb must be finite and > 0; got nan"),
    ({"workers": []}, "workers= is empty: give the numbers of workers to try, e.g. workers=[0, 2], or leave it out "
                      "for 0, 1, 2, 4, ... up to the cores you may use"),
])
def test_bad_values_in_python_are_refused_before_measuring(shards: Path, options: dict, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        pipeline.tune(str(shards), **options)
    assert str(refused.value) == message


@pytest.mark.parametrize("options, error, message", [
    ({"batch_size": 0}, ValueError, "batch_size must be an integer >= 1, got 0"),
    ({"options": {"shuffle_bufer": 10}}, TypeError, "unexpected keyword argument 'shuffle_bufer'"),
    ({"options": {"batch_size": 3}}, ValueError, "options: batch_size is an argument of tune's own: give it as "
                                                 "batch_size="),  # was taken over batch_size=, silently
])
def test_bad_loader_options_are_refused_as_themselves_before_measuring(shards: Path, monkeypatch, options: dict,
                                                                        error: type, message: str) -> None:
    monkeypatch.setattr(tune_module, "measure", None)  # (nothing may be measured)
    with pytest.raises(error, match=re.escape(message)):
        pipeline.tune(str(shards), workers=[0], **options)


def test_the_plots_destination_is_checked_before_measuring(shards: Path, tmp_path: Path, capsys) -> None:
    command = ["tune", str(shards), "--workers", "0", "--seconds", "60"]  # a minute, were anything measured
    assert main([*command, "--plot", str(tmp_path / "nowhere" / "tune.png")]) == 1
    assert capsys.readouterr().err == f"error: --plot {tmp_path / 'nowhere' / 'tune.png'}: no folder " \
                                      f"{tmp_path / 'nowhere'}\n"
    for name, kind in (("tune.txt", ".txt"), ("tune", "no extension")):
        assert main([*command, "--plot", str(tmp_path / name)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: --plot {tmp_path / name}: matplotlib cannot save {kind}; give one of ")
        assert ".png" in err and ".svg" in err and err.count("\n") == 1
    code = ("import sys; sys.modules['matplotlib'] = None\nfrom pipeline.cli import main\n"
            "sys.exit(main(['tune', sys.argv[1], '--workers', '0', '--seconds', '60', '--plot', sys.argv[2]]))")
    run = subprocess.run([sys.executable, "-c", code, str(shards), str(tmp_path / "tune.png")], capture_output=True,
                         text=True, timeout=60)
    assert (run.returncode, run.stderr) == (1, "error: a plot needs matplotlib: pip install 'pipeline[plot]'\n")
