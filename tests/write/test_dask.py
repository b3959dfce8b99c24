"""Builds on Dask write the very shards and index a single process writes, even when a task
fails or its worker dies on the way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pipeline
from pipeline.cli import main
from pipeline.write.rows import RowBlock
from pipeline.write.source import Source

distributed = pytest.importorskip("distributed")

OPTIONS = dict(pack=32, shard_bytes=40 << 10, quiet=True)


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes of one thread each, on loopback, shared by the tests of this module."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as local:
        yield local


def files(folder: Path) -> dict[str, bytes]:
    """Every file of a build (shards, index and what is saved beside it), by name."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


class FailsOnceInAWorker(Source):
    """The rows of ``inner``, read a record at a time; the first read in a Dask worker past the
    start of its task fails (``crash``: the worker process dies), once per ``marker`` file."""

    description = "fails once"

    def __init__(self, inner: Source, marker: Path, crash: bool) -> None:
        self.inner, self.marker, self.crash = inner, marker, crash

    def __len__(self) -> int:
        return len(self.inner)

    def approx_row_bytes(self) -> int:
        return 1 << 20  # reads of one record: the failure comes with a shard half written

    def read(self, start: int, stop: int) -> RowBlock:
        if start > 0 and _in_a_worker() and _first_time(self.marker):
            if self.crash:
                os._exit(1)
            raise RuntimeError("injected failure")
        return self.inner.read(start, stop)


def _in_a_worker() -> bool:
    try:
        distributed.get_worker()
    except ValueError:
        return False
    return True


def _first_time(marker: Path) -> bool:
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def test_a_dask_cluster_writes_the_shards_and_index_of_a_single_process(tmp_path: Path, npy_inputs, cluster) -> None:
    single = pipeline.write_shards(tmp_path / "one", npy_inputs, **OPTIONS)
    pipeline.write_shards(tmp_path / "dask", npy_inputs, engine="dask", scheduler=cluster.scheduler_address,
                          **OPTIONS)
    assert len(single.shards) > 8
    assert files(tmp_path / "dask") == files(tmp_path / "one")


@pytest.mark.parametrize("crash", [False, True], ids=["task-raises", "worker-dies"])
def test_a_task_that_fails_once_is_run_again_and_the_build_is_complete(tmp_path: Path, npy_inputs, cluster,
                                                                       crash: bool) -> None:
    pipeline.write_shards(tmp_path / "one", npy_inputs, **OPTIONS)
    source = FailsOnceInAWorker(pipeline.ArraySource(npy_inputs), tmp_path / "failed", crash)
    pipeline.build_shards(source, tmp_path / "dask", engine="dask", scheduler=cluster.scheduler_address, **OPTIONS)
    assert (tmp_path / "failed").exists()
    assert files(tmp_path / "dask") == files(tmp_path / "one")  # no temporary file left either
    assert pipeline.verify(tmp_path / "dask") == []


class BadRowsPastHalf(Source):
    """The rows of ``inner``, but a read in a Dask worker past half of them meets a bad value,
    as a data error does: the same on every try. Each such read is logged in ``log``."""

    description = "bad rows"

    def __init__(self, inner: Source, log: Path) -> None:
        self.inner, self.log = inner, log

    def __len__(self) -> int:
        return len(self.inner)

    def approx_row_bytes(self) -> int:
        return self.inner.approx_row_bytes()

    def read(self, start: int, stop: int) -> RowBlock:
        if stop > len(self) // 2 and _in_a_worker():
            with open(self.log, "a") as log:
                log.write(f"{start}\n")
            raise pipeline.SampleError(f"rows {start}..{stop}: a bad value")
        return self.inner.read(start, stop)


def test_a_data_error_fails_the_build_at_once_and_is_not_run_again(tmp_path: Path, npy_inputs, cluster) -> None:
    log = tmp_path / "reads"
    with pytest.raises(pipeline.SampleError, match=r"rows \d+\.\.\d+: a bad value"):
        pipeline.build_shards(BadRowsPastHalf(pipeline.ArraySource(npy_inputs), log), tmp_path / "dask",
                              engine="dask", scheduler=cluster.scheduler_address, **OPTIONS)
    tries = log.read_text().split()
    assert tries and len(tries) == len(set(tries))  # no task ran again (a retry would read the same rows)
    assert not (tmp_path / "dask" / "index.json").exists()


def test_cli_engine_dask_starts_a_local_cluster(tmp_path: Path, npy_inputs) -> None:
    result = subprocess.run([sys.executable, "-m", "pipeline", "build", "arrays", str(tmp_path / "dask"),
                             "--array", f"x={npy_inputs['x']}", "--array", f"y={npy_inputs['y']}",
                             "--pack", "32", "--shard-bytes", "40KiB", "--engine", "dask", "--workers", "2"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "wrote 5000 samples" in result.stderr
    pipeline.write_shards(tmp_path / "one", npy_inputs, **OPTIONS)
    assert files(tmp_path / "dask") == files(tmp_path / "one")


CUT_AS_WORKERS_START = """
import os, signal, sys
if __name__ == "__mp_main__":  # a worker process of the cluster, importing this file as it starts
    os.killpg(0, signal.SIGINT)  # a terminal's Ctrl-C: to the build and every process of its group
if __name__ == "__main__":
    from pipeline.cli import main
    sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_while_the_local_cluster_starts_is_one_line_not_distributeds_tracebacks(tmp_path: Path,
                                                                                      npy_inputs) -> None:
    """Cut as it started, the cluster was left half-started, which distributed's exit handler failed
    to close: some 30 lines of its traceback ("AssertionError: Status.init") after the build's. And
    the worker processes, which a terminal's Ctrl-C reaches too, printed tracebacks of their own
    (KeyboardInterrupt in multiprocessing's spawn_main). The workers are stopped with the build."""
    (tmp_path / "cut.py").write_text(CUT_AS_WORKERS_START)
    build = subprocess.Popen([sys.executable, str(tmp_path / "cut.py"), "build", "arrays", str(tmp_path / "out"),
                              "--array", f"x={npy_inputs['x']}", "--engine", "dask", "--workers", "1", "--quiet"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = build.communicate(timeout=60)
    finally:
        left = _left_in_group(build.pid)
        if left:
            os.killpg(build.pid, signal.SIGKILL)
    assert (build.returncode, err) == (130, "interrupted: run the same command with --resume to finish "
                                            "the build, keeping the shards it finished\n")
    assert left == []


STOPPED_WHILE_WRITING = """
import sys, time
from pathlib import Path
import distributed, numpy as np, pipeline
from pipeline.write.source import Source

class SlowInWorkers(Source):
    description = "slow rows"

    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def approx_row_bytes(self):
        return self.inner.approx_row_bytes()

    def read(self, start, stop):
        try:
            distributed.get_worker()
        except ValueError:  # the build's own process
            return self.inner.read(start, stop)
        Path(sys.argv[2], f"writing-{start}").touch()
        time.sleep(60)

if __name__ == "__main__":
    try:
        source = SlowInWorkers(pipeline.ArraySource({"x": np.arange(4000)}))
        pipeline.build_shards(source, sys.argv[1], engine="dask", workers=2, shard_samples=1000, quiet=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
"""


def test_ctrl_c_while_the_local_clusters_workers_write_says_nothing_of_their_cancelled_tasks(
        tmp_path: Path) -> None:
    """Stopped by Ctrl-C while its workers were writing shards, the build closed its cluster, and
    each worker logged a WARNING of distributed's that its task "ended with CancelledError", a
    line per task after the build's own."""
    (tmp_path / "stop.py").write_text(STOPPED_WHILE_WRITING)
    (tmp_path / "tasks").mkdir()
    build = subprocess.Popen([sys.executable, str(tmp_path / "stop.py"), str(tmp_path / "out"),
                              str(tmp_path / "tasks")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(list((tmp_path / "tasks").iterdir())) < 2 and build.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(build.pid, signal.SIGINT)  # a terminal's Ctrl-C: to the build and every process of its group
        _, err = build.communicate(timeout=60)
    finally:
        left = _left_in_group(build.pid)
        if left:
            os.killpg(build.pid, signal.SIGKILL)
    assert len(list((tmp_path / "tasks").iterdir())) == 2  # both workers were writing a shard when it was cut
    assert (build.returncode, err) == (130, "interrupted\n")
    assert left == []


def _left_in_group(group: int, wait_s: float = 5) -> list[str]:
    """The processes of ``group`` still running ``wait_s`` after its leader ended (multiprocessing's
    resource tracker ends as it sees the build gone: a moment later)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True).stdout.split()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_without_distributed_the_error_says_what_to_install(tmp_path: Path, npy_inputs, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"pip install 'pipeline\[dask\]'"):
        pipeline.write_shards(tmp_path / "out", npy_inputs, engine="dask", **OPTIONS)


def test_a_scheduler_needs_the_dask_engine(tmp_path: Path, npy_inputs, capsys) -> None:
    code = main(["build", "arrays", str(tmp_path / "out"), "--array", f"x={npy_inputs['x']}",
                              "--scheduler", "tcp://127.0.0.1:8786"])
    assert code == 1
    assert "needs engine='dask' (--engine dask)" in capsys.readouterr().err
    assert not (tmp_path / "out" / "index.json").exists()


def test_indexing_on_dask_gives_the_index_of_one_process(tmp_path: Path) -> None:
    from tests.helpers import index_content
    from tests.write.test_indexing import webdataset_shards

    urls = webdataset_shards(tmp_path / "wds", [40, 7, 90, 33])
    local = pipeline.index_shards(urls, tmp_path / "one", quiet=True)
    on_dask = pipeline.index_shards(urls, tmp_path / "dask", engine="dask", workers=2, quiet=True)
    assert index_content(on_dask) == index_content(local)


def test_the_dask_benchmark_runs_and_leaves_nothing_in_the_temporary_folder(short_tmp: Path) -> None:
    """Not Dask's dask-scratch-space either."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_dask.py"
    result = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300,
                            cwd=script.parent, env={**os.environ, "TMPDIR": str(short_tmp)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dask, cluster of 2 already running | 5,000 |" in result.stdout
    assert not list(short_tmp.iterdir())


CLUSTER_ELSEWHERE = """
import sys, distributed
with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                              dashboard_address=":0") as cluster:
    print(cluster.scheduler_address, flush=True)
    sys.stdin.read()  # until the test is done with it
"""


SOURCE_IN_A_SCRIPT = """
import numpy as np, pipeline

class Squares(pipeline.Source):
    def __len__(self):
        return 100

    def read(self, start, stop):
        i = np.arange(start, stop)
        return pipeline.RowBlock({{"i": i, "square": i * i}})

if __name__ == "__main__":
    index = pipeline.build_shards(Squares(), "squares", engine="dask", scheduler="{address}", quiet=True)
    print(index.samples, "samples")
"""


def test_a_running_cluster_whose_workers_work_in_another_folder_reads_the_files_named_here(
        tmp_path: Path, monkeypatch) -> None:
    """Relative paths name this process's files, not the ones of the same name in the folder the
    cluster's workers run in (which the build read, without a word, before)."""
    import numpy as np

    from tests.helpers import index_content
    from tests.write.test_indexing import webdataset_shards

    here, there = tmp_path / "here", tmp_path / "there"
    for folder, value in ((here, 1), (there, 0)):  # the same names, other data
        folder.mkdir()
        np.save(folder / "x.npy", np.full((300, 4), value, np.float32))
        np.save(folder / "y.npy", np.full(300, value))
    webdataset_shards(here / "wds", [40, 7])
    cluster = subprocess.Popen([sys.executable, "-c", CLUSTER_ELSEWHERE], cwd=there, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        address = cluster.stdout.readline().strip()
        monkeypatch.chdir(here)
        assert main(["build", "arrays", "out", "--array", "x=x.npy", "--array", "y=y.npy", "--quiet",
                     "--engine", "dask", "--scheduler", address]) == 0
        batch = next(iter(pipeline.ShardDataset("out", batch_size=300, shuffle=False)))
        assert batch["x"].sum() == 1200 and batch["y"].sum() == 300
        assert not (there / "out").exists()
        pipeline.write_shards("one", {"x": "x.npy", "y": "y.npy"}, quiet=True)
        assert files(here / "out") == files(here / "one")
        script = here / "squares.py"  # a Source of the user's own, in the script that builds: sent by value
        script.write_text(SOURCE_IN_A_SCRIPT.format(address=address))
        run = subprocess.run([sys.executable, str(script)], cwd=here, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout == "100 samples\n", run.stderr[-3000:]
        squares = next(iter(pipeline.ShardDataset(here / "squares", batch_size=100, shuffle=False)))
        assert squares["square"].tolist() == [i * i for i in range(100)]
        wds = [f"wds/{name.name}" for name in sorted((here / "wds").glob("*.tar"))]
        on_cluster = pipeline.index_shards(wds, "indexed", engine="dask", scheduler=address, quiet=True)
        assert index_content(on_cluster) == index_content(pipeline.index_shards(wds, "indexed-here", quiet=True))
    finally:
        cluster.stdin.close()
        cluster.wait(timeout=60)


@pytest.mark.parametrize("address, message", [
    ("tcp://127.0.0.1:1", "no Dask scheduler answers at tcp://127.0.0.1:1 (Connection refused): start one there "
                          "(dask scheduler), or give the address it prints; nothing was written"),
    ("notaurl", "scheduler 'notaurl' is not a Dask scheduler's address (missing port number in address 'notaurl'): "
                "give it as tcp://HOST:PORT (8786 by default)"),
])
def test_a_scheduler_nothing_answers_at_is_refused_at_once_before_the_output_is_touched(
        tmp_path: Path, npy_inputs, capsys, address: str, message: str) -> None:
    for command in (["build", "arrays", str(tmp_path / "out"), "--array", f"x={npy_inputs['x']}"],
                    ["index", str(tmp_path / "none.tar"), "--output", str(tmp_path / "out")]):
        assert main([*command, "--engine", "dask", "--scheduler", address]) == 1  # at once: Dask's client waits 30 s
        assert capsys.readouterr().err == f"error: {message}\n"
        assert not (tmp_path / "out").exists()
