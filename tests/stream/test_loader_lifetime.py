"""A loader's workers stop, cleanly and at once, when the loader is freed: by its last reference,
or by a garbage collection of a reference cycle that holds it (an exception's traceback holding
the training loop's frame makes one). A collection used to run the loader's shutdown after its
queues had stopped sending, and the shutdown then waited 5 s per worker and killed them."""

from __future__ import annotations

import functools
import gc
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import pipeline
from pipeline import ShardDataset
from pipeline.stream.loader import ShardLoader
from tests.helpers import child_pids, started_since, wait_for
from tests.stream.shardsets import random_sizes, uneven_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return uneven_shards(tmp_path_factory.mktemp("lifetime"), random_sizes(4, 200, 400, seed=3), pack=4)


def note_termination(folder: Path, worker_id: int) -> None:
    """A worker's ``worker_init_fn``: a SIGTERM (the shutdown's last resort for a worker that did
    not stop when asked) leaves a file in ``folder`` before the worker exits."""
    def terminated(signum: int, frame: Any) -> None:
        (folder / f"terminated-{os.getpid()}").touch()
        os._exit(1)
    signal.signal(signal.SIGTERM, terminated)


def loader_noting_terminations(shards: Path, folder: Path, persistent: bool) -> ShardLoader:
    return ShardLoader(ShardDataset(shards, batch_size=32, seed=1, shuffle_buffer=100), num_workers=2,
                       persistent_workers=persistent, worker_init_fn=functools.partial(note_termination, folder))


@pytest.mark.parametrize("how", ["after an epoch", "mid-epoch", "mid-epoch, workers not persistent",
                                 "interrupted while waiting for a batch"])
@pytest.mark.parametrize("freed_by", ["its last reference", "a collection of its cycle"])
def test_a_freed_loader_stops_its_workers_without_killing_them(shards: Path, tmp_path: Path, how: str,
                                                               freed_by: str) -> None:
    before = set(child_pids(os.getpid()))
    gc.collect()
    gc.disable()  # the collection happens where the test says
    try:
        loader = loader_noting_terminations(shards, tmp_path, persistent="not persistent" not in how)
        loop = iter(loader)
        if how == "after an epoch":
            assert sum(len(batch["i"]) for batch in loop) == loader.dataset.samples
        else:
            next(loop)
        workers = started_since(before)
        assert len(workers) == 2
        if how == "interrupted while waiting for a batch":
            with pytest.raises(KeyboardInterrupt):
                loop.throw(KeyboardInterrupt)  # (Ctrl-C in the loader's wait ends its loop so)
            assert started_since(before) == []  # and stops its workers, which may hold the rest of a batch
            workers = []
        if freed_by == "a collection of its cycle":
            held = [loader, loop]
            held.append(held)
            del held
        del loader, loop
        if freed_by == "a collection of its cycle":
            assert started_since(before) == workers  # the cycle holds them
            gc.collect()
    finally:
        gc.enable()
    assert started_since(before) == []
    assert list(tmp_path.glob("terminated-*")) == []  # each stopped when asked, none killed


def test_an_interrupted_loop_lets_its_workers_go_while_the_loader_stays(shards: Path, tmp_path: Path) -> None:
    """Workers that do not persist belong to their loop: Ctrl-C while it waits for a batch, the
    loop let go, and they stop, however long the loader is kept (in a notebook, say)."""
    before = set(child_pids(os.getpid()))
    loader = loader_noting_terminations(shards, tmp_path, persistent=False)
    loop = iter(loader)
    head = next(loop)["i"].tolist()
    assert len(started_since(before)) == 2
    with pytest.raises(KeyboardInterrupt):
        loop.throw(KeyboardInterrupt)
    del loop
    assert started_since(before) == []
    assert list(tmp_path.glob("terminated-*")) == []
    rest = [i for batch in loader for i in batch["i"].tolist()]  # and the loader goes on with new workers
    assert sorted(head + rest) == list(range(loader.dataset.samples))


LEFT_AT_EXIT = """
import sys
import pipeline
loader = pipeline.make_loader(sys.argv[1], num_workers={workers}, batch_size=32, persistent_workers={persistent})
{ending}
"""
ENDINGS = {"a loop under way": "loop = iter(loader)\nnext(loop)", "an epoch done": "for batch in loader:\n    pass",
           "a prefetched loop under way": "loop = iter(pipeline.DevicePrefetcher(loader))\nnext(loop)"}


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_a_script_that_ends_with_its_loader_alive_exits_without_a_word_or_a_file(shards: Path, short_tmp: Path,
                                                                                workers: int, persistent: bool,
                                                                                ending: str) -> None:
    """The loader, and a loop's generator, go as the interpreter finalizes, when the loader's
    modules have lost their names: stopping the workers is the exit handlers' work by then, and
    what the worker iterator runs then must need no module name. Workers still running are
    stopped, as a loader stops them, before multiprocessing's exit handler would terminate them:
    terminated, each left its temporary folder (``pymp-*``) behind, every run."""
    script = LEFT_AT_EXIT.format(workers=workers, persistent=persistent, ending=ENDINGS[ending])
    temporary = short_tmp
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", script, str(shards)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "TMPDIR": str(temporary)})
    assert (run.returncode, run.stderr) == (0, "")
    assert list(temporary.iterdir()) == []


ENDED_BADLY = """
import multiprocessing, os, signal, sys, time
import pipeline
def stuck_after_the_first(batch):
    if os.environ.get("STUCK") and os.path.exists(sys.argv[2]):
        time.sleep(60)  # past PyTorch's 5 s wait for a worker to stop: it is terminated
    open(sys.argv[2], "a").close()
    return batch
loader = pipeline.make_loader(sys.argv[1], num_workers=2, batch_size=32, shuffle_buffer=32,
                              batch_transform=stuck_after_the_first)
loop = iter(loader)
next(loop)
if not os.environ.get("STUCK"):
    os.kill(multiprocessing.active_children()[0].pid, signal.SIGKILL)
    try:
        for batch in loop:
            pass
    except pipeline.WorkerError:
        print("WorkerError")
"""


@pytest.mark.parametrize("how", ["killed", "terminated by the shutdown"])
def test_a_worker_that_ends_badly_leaves_no_temporary_folder(shards: Path, short_tmp: Path, tmp_path: Path,
                                                             how: str) -> None:
    """A worker made its own folder (pymp-*) as it first sent a batch, and removed it as it exited:
    one killed (the out-of-memory killer), or terminated because it took longer than PyTorch's
    5 s to stop (a loaded machine), left it behind. The loader makes the folders and removes them."""
    env = {**os.environ, "TMPDIR": str(short_tmp), **({"STUCK": "1"} if how != "killed" else {})}
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", ENDED_BADLY, str(shards), str(tmp_path / "sent")],
                         capture_output=True, text=True, timeout=120, env=env)
    assert (run.returncode, run.stdout, run.stderr) == (0, "WorkerError\n" if how == "killed" else "", "")
    assert list(short_tmp.iterdir()) == []


FORKED_AND_ENDED = """
import os, sys
import pipeline
def train():
    samples = 0
    for step, batch in enumerate(pipeline.make_loader(sys.argv[1], num_workers=2, batch_size=50, shuffle_buffer=100)):
        samples += len(batch["i"])
        if step == 1:
            child = os.fork()
            if child == 0:  # a child that writes a checkpoint in the background, say, then ends as a script
                sys.exit(0)  # ends (its copy of the loop unwound: gone before the exit handlers run)
            os.waitpid(child, 0)
    print(samples)
train()
"""

LOOP_BEGUN_AT_EXIT = """
import atexit, sys
held = []
def evaluate_at_exit():  # registered before the library's exit handler: run after it
    import pipeline
    loop = iter(pipeline.make_loader(sys.argv[1], num_workers=2, batch_size=50, shuffle_buffer=100))
    next(loop)
    held.append(loop)  # left under way
atexit.register(evaluate_at_exit)
import pipeline
"""


@pytest.mark.parametrize("script", ["a forked child that ends", "a loop begun after the exit handlers"])
def test_a_loader_outlived_by_its_process_ends_quietly(shards: Path, short_tmp: Path, script: str) -> None:
    """A child forked from the training process ran multiprocessing's exit handler as it ended,
    which terminated its parent's workers (a WorkerError in the parent's loop). A loop begun in
    an exit handler that runs after the library's is stopped as the interpreter finalizes: the
    removal of its workers' folders raised there, and left them (a loader made so late is rare)."""
    code = FORKED_AND_ENDED if script == "a forked child that ends" else LOOP_BEGUN_AT_EXIT
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", code, str(shards)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "TMPDIR": str(short_tmp)})
    expected = f"{pipeline.load_index(shards).samples}\n" if script == "a forked child that ends" else ""
    assert (run.returncode, run.stdout) == (0, expected), run.stderr[-3000:]
    if script == "a forked child that ends":
        assert run.stderr == ""
    else:  # (PyTorch's and multiprocessing's own finalizers say what fails them by then: none of the library's)
        assert f"{os.sep}pipeline{os.sep}" not in run.stderr, run.stderr[-3000:]
    assert list(short_tmp.iterdir()) == []


def test_workers_whose_temporary_folder_leaves_no_room_for_their_socket_are_refused_not_waited_for(
        shards: Path, short_tmp: Path) -> None:
    """Every handover failed in the workers' feeder threads, unseen, and the loop waited for its
    first batch for ever."""
    deep = short_tmp / ("d" * 90)
    deep.mkdir()
    script = LEFT_AT_EXIT.format(workers=2, persistent=False, ending=ENDINGS["an epoch done"])
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", script, str(shards)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "TMPDIR": str(deep)})
    assert run.returncode == 1 and re.search(r"RuntimeError: DataLoader workers hand batches over through a Unix "
                                             r"socket in the temporary folder .*/pymp-\w+, whose path leaves no room "
                                             r"for one \(\d+ bytes with the socket's name, at most 107\): set TMPDIR "
                                             r"to a shorter folder \(TMPDIR=/tmp\), or pass num_workers=0", run.stderr)


OUTLIVING_CHILD = """
import os, sys, time
import pipeline
data, out = sys.argv[1], sys.argv[2]
print(sum(1 for _ in pipeline.make_loader(data, num_workers=2, batch_size=64)))
if os.fork() == 0:
    for stream in (1, 2):  # (the test's pipes: not held open past the parent)
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream)
    parent = os.getppid()
    while os.getppid() == parent:  # (until the parent has exited)
        time.sleep(0.05)
    try:
        samples = sum(len(batch["i"]) for batch in pipeline.make_loader(data, num_workers=2, batch_size=64, timeout=60))
        open(out, "w").write(str(samples))
    except BaseException as exc:
        open(out, "w").write(f"{type(exc).__name__}: {exc}")
    os._exit(0)
"""


def test_a_forked_child_that_outlives_its_parent_streams_with_workers_of_its_own(shards: Path, tmp_path: Path) -> None:
    """The loader made multiprocessing's temporary folder in the training process, which a forked
    child shares and the parent's exit deletes: every handover of the child's workers failed
    unseen, and it waited for its first batch for ever."""
    out = tmp_path / "child.out"
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", OUTLIVING_CHILD, str(shards), str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert wait_for(lambda: out.exists() and bool(out.read_text()), seconds=120)
    assert out.read_text() == str(pipeline.load_index(shards).samples)


def test_the_socket_room_is_measured_with_the_name_the_python_gives_it(monkeypatch, short_tmp: Path) -> None:
    """Pythons that pick a shorter temporary folder where needed (3.14) name a socket sock-XXXXXXXX:
    measured as listener-XXXXXXXX, a folder with room for it was refused."""
    import multiprocessing.util

    from pipeline.stream import socket_folder

    base = short_tmp / ("d" * (socket_folder.SOCKET_PATH_MAX - len(str(short_tmp)) - 1 - 28))  # room for 28 more
    base.mkdir()
    monkeypatch.setattr(multiprocessing.util, "_get_base_temp_dir", lambda tempfile: str(base), raising=False)
    socket_folder.make_worker_folders(0)  # pymp-XXXXXXXX/sock-XXXXXXXX: 28 bytes
    monkeypatch.delattr(multiprocessing.util, "_get_base_temp_dir")
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.setattr(socket_folder.tempfile, "tempdir", None)
    with pytest.raises(RuntimeError, match="leaves no room for one"):
        socket_folder.make_worker_folders(0)  # pymp-XXXXXXXX/listener-XXXXXXXX: 32 bytes

def _slow(sample: dict) -> dict:
    time.sleep(0.01)
    return sample


@pytest.mark.parametrize("persistent", [True, False])
def test_a_loop_begun_in_another_thread_is_refused_and_the_position_stays_right(shards: Path, persistent: bool) -> None:
    """With persistent workers the later loop stopped the workers the first one waited on: the
    first got a WorkerError that blamed memory. Without, the first loop's own workers ran on,
    and it delivered one more batch, counted: a batch twice, and a checkpoint one batch ahead."""
    options = dict(batch_size=16, shuffle_buffer=64, seed=2)
    reference = [b["i"].tolist() for b in pipeline.make_loader(shards, num_workers=0, **options)]
    loader = pipeline.make_loader(shards, num_workers=2, persistent_workers=persistent, sample_transform=_slow,
                                  **options)
    got: queue.Queue = queue.Queue()

    def train() -> None:
        try:
            for batch in loader:
                got.put(batch["i"].tolist())
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            got.put(exc)

    threading.Thread(target=train, daemon=True).start()
    seen = [got.get(timeout=60) for _ in range(5)]
    time.sleep(0.05)  # the thread waits for the workers' next unit
    main = iter(loader)
    seen += [next(main)["i"].tolist() for _ in range(3)]  # the main thread takes over
    while not isinstance(item := got.get(timeout=60), BaseException):
        seen.insert(-3, item)  # (delivered by the thread before the main thread's loop began)
    assert type(item) is RuntimeError and "iterated again while this loop over it ran" in str(item)
    assert seen == reference[:len(seen)] and loader.state_dict()["batches"] == len(seen)


MARKER = Path(os.environ.get("TMPDIR", "/tmp"), f"slow-transform-{os.getpid()}")


def _slow_while_marked(sample: dict) -> dict:
    if MARKER.exists():
        time.sleep(0.2)  # a heavy sample transform: a unit of 64 samples takes 12.8 s
    return sample


def test_a_loop_broken_off_stops_workers_busy_in_a_transform_at_once_and_the_next_goes_on(shards: Path) -> None:
    """PyTorch waits for each worker in turn to finish its unit, up to 5 s each: every break
    (evaluate every N steps, then go on) cost 10 s with 2 workers."""
    reference = [b["i"].tolist() for b in pipeline.make_loader(shards, num_workers=0, batch_size=16, shuffle_buffer=64,
                                                                 seed=2)]
    loader = pipeline.make_loader(shards, num_workers=2, batch_size=16, shuffle_buffer=64, seed=2,
                                  sample_transform=_slow_while_marked)
    MARKER.touch()
    try:
        seen = []
        for batch in loader:
            seen.append(batch["i"].tolist())
            if len(seen) == 2:
                started = time.monotonic()
                break
        stopped = time.monotonic() - started
    finally:
        MARKER.unlink()
    assert stopped < 3
    seen += [b["i"].tolist() for b in loader]
    assert seen == reference
