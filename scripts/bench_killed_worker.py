"""Kill a DataLoader worker with SIGKILL, many times over: is it a WorkerError every time?

Each run streams a small shard set with 2 workers, kills one of them (alternately while the
main thread waits for data and while it runs a "training step") and checks that:

- the error is a :class:`pipeline.WorkerError` (never a ``ConnectionResetError`` or a bare
  ``RuntimeError``) and arrives within 5 seconds of the kill;
- the other worker is stopped too;
- the batches before the error are those of an uninterrupted run, and the loader's state
  resumes the rest of the epoch exactly.

With ``--text`` each sample also holds 1,800 characters of text, so that a worker's message (a
unit of 300 samples, 540 KB) is larger than the pipe to the main process holds, and every other
run kills the worker that is blocked writing one, in the middle of it (found through ``/proc``).

    python scripts/bench_killed_worker.py --runs 100     # prints "100/100 runs ..." or the failures
    python scripts/bench_killed_worker.py --quick        # 4 runs
    python scripts/bench_killed_worker.py --text --runs 100
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

import pipeline
from pipeline.stream.loader import ShardLoader

warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")
#: A run takes about a second; one still going after this long hangs.
RUN_LIMIT_S = 60


def build(folder: Path, text: bool) -> Path:
    numbers = np.arange(4000)
    arrays = {"i": numbers, "x": np.zeros((4000, 16), np.float32)}
    if text:
        arrays["name"] = np.array([f"{i:06d}" * 300 for i in numbers])
    pipeline.write_shards(folder, arrays, prefix="k", pack=8, shard_samples=700, quiet=True)
    return folder


def writing_worker(workers: list[int]) -> int | None:
    """The one of ``workers`` a thread of which is blocked writing to a pipe (its message to the
    main process), waiting up to 10 s for one to be (the main process reads nothing meanwhile)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in workers:
            for wchan in Path(f"/proc/{pid}/task").glob("*/wchan"):
                with contextlib.suppress(FileNotFoundError):
                    if "pipe_write" in wchan.read_text():
                        return pid
        time.sleep(0.02)
    return None


def children() -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            found.update(int(c) for c in (task / "children").read_text().split())
        except FileNotFoundError:
            continue
    return found


def describe(pid: int, workers: list[int]) -> str:
    """A child process in a few words: which it is, and its state (R running, S sleeping, T
    stopped, Z exited and not waited for)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        state = "gone"
    which = f"worker {workers.index(pid)}" if pid in workers else "not a worker"
    return f"pid {pid} ({which}, state {state})"


def new_loader(shards: Path) -> ShardLoader:
    # (no pinning thread, on a GPU machine: it would take every message off the pipe as it comes)
    return pipeline.make_loader(shards, num_workers=2, batch_size=32, seed=7, shuffle_buffer=300, pin_memory=False)


def ids(batches) -> list[list[int]]:
    return [batch["i"].tolist() for batch in batches]


def kill_and_resume(workers: list[int]) -> None:
    """Kill the first of ``workers`` and resume the others, each signal sent whatever became of
    the others (an error on one would leave the rest stopped, and the run waiting for ever)."""
    for pid, how in [(workers[0], signal.SIGKILL), *((p, signal.SIGCONT) for p in workers[1:])]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, how)


def one_run(shards: Path, reference: list[list[int]], during_step: bool, mid_message: bool) -> str:
    """One kill (while the main process runs a step, waits for data, or, ``mid_message``, of the
    worker blocked sending a message); returns ``"ok"`` or what went wrong."""
    before = children()
    loader = new_loader(shards)
    delivered: list[list[int]] = []
    killed_at, workers = None, []
    try:
        for batch in loader:
            delivered.append(batch["i"].tolist())
            if len(delivered) == 20:
                workers = sorted(children() - before)
                # timed before the kill: its SIGCHLD can raise the WorkerError as soon as os.kill returns
                killed_at = time.monotonic()
                if mid_message:
                    writing = writing_worker(workers)
                    if writing is None:
                        return "no worker blocked writing a message within 10 s"
                    killed_at = time.monotonic()
                    os.kill(writing, signal.SIGKILL)
                elif during_step:
                    os.kill(workers[0], signal.SIGKILL)
                else:  # pause the others so that the main thread drains their batches and waits
                    for pid in workers:
                        os.kill(pid, signal.SIGSTOP)
                    threading.Timer(0.3, kill_and_resume, (workers,)).start()
            if during_step:
                time.sleep(0.005)
    except pipeline.WorkerError:
        pass
    except BaseException as exc:  # noqa: BLE001 - what we count
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    else:
        return "no error"
    if killed_at is None:
        return f"a WorkerError before any worker was killed, after {len(delivered)} batches"
    if time.monotonic() - killed_at > 5:
        return "slow (> 5 s)"
    deadline = time.monotonic() + 5  # (gone, and reaped by the loader: a loaded machine ends a process in a while)
    while children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    if children() - before:
        return f"workers left running: {', '.join(describe(pid, workers) for pid in sorted(children() - before))}"
    if delivered != reference[:len(delivered)]:
        return "wrong batches before the error"
    state = loader.state_dict()
    resumed = new_loader(shards)
    resumed.load_state_dict(state)
    done = state["batches"]
    if ids(resumed) != reference[done:]:
        return "resume not exact"
    return "ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="4 runs")
    parser.add_argument("--out", type=Path, help="write the outcome counts here as JSON")
    parser.add_argument("--text", action="store_true",
                        help="messages larger than a pipe holds; every other run kills a worker in the middle of one")
    args = parser.parse_args(argv)
    runs = 4 if args.quick else args.runs
    outcomes: Counter[str] = Counter()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pipeline-kill-") as tmp:
        shards = build(Path(tmp) / "shards", args.text)
        reference = ids(new_loader(shards))
        for run in range(runs):
            # a run that hangs ends the benchmark with every thread's stack, not a silent wait
            faulthandler.dump_traceback_later(RUN_LIMIT_S, exit=True)
            outcome = one_run(shards, reference, during_step=run % 2 == 1, mid_message=args.text and run % 2 == 0)
            faulthandler.cancel_dump_traceback_later()
            outcomes[outcome] += 1
            if outcome != "ok":
                print(f"run {run}: {outcome}", file=sys.stderr)
    ok = outcomes["ok"]
    print(f"{ok}/{runs} runs: a WorkerError within 5 s, the other worker stopped, an exact resume "
          f"({time.perf_counter() - started:.0f} s)")
    if args.out:
        args.out.write_text(json.dumps(dict(outcomes)))
    return 0 if ok == runs else 1


if __name__ == "__main__":
    sys.exit(main())
