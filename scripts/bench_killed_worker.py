"""Kill a DataLoader worker with SIGKILL, many times over: is it a WorkerError every time?

Each run streams a small shard set with 2 workers, kills one of them (alternately while the
main thread waits for data and while it runs a "training step") and checks that:

- the error is a :class:`pipeline.WorkerError` (never a ``ConnectionResetError`` or a bare
  ``RuntimeError``) and arrives within 5 seconds of the kill;
- the other worker is stopped too;
- the batches before the error are those of an uninterrupted run, and the loader's state
  resumes the rest of the epoch exactly.

    python scripts/bench_killed_worker.py --runs 100     # prints "100/100 runs ..." or the failures
    python scripts/bench_killed_worker.py --quick        # 4 runs
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import multiprocessing.util
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


def build(folder: Path) -> Path:
    numbers = np.arange(4000)
    pipeline.write_shards(folder, {"i": numbers, "x": np.zeros((4000, 16), np.float32)}, prefix="k", pack=8,
                          shard_samples=700, quiet=True)
    return folder


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
    return pipeline.make_loader(shards, num_workers=2, batch_size=32, seed=7, shuffle_buffer=300)


def ids(batches) -> list[list[int]]:
    return [batch["i"].tolist() for batch in batches]


def kill_and_resume(workers: list[int]) -> None:
    """Kill the first of ``workers`` and resume the others, each signal sent whatever became of
    the others (an error on one would leave the rest stopped, and the run waiting for ever)."""
    for pid, how in [(workers[0], signal.SIGKILL), *((p, signal.SIGCONT) for p in workers[1:])]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, how)


def one_run(shards: Path, reference: list[list[int]], during_step: bool) -> str:
    """One kill; returns ``"ok"`` or what went wrong."""
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
                if during_step:
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
    args = parser.parse_args(argv)
    runs = 4 if args.quick else args.runs
    outcomes: Counter[str] = Counter()
    started = time.perf_counter()
    # The workers share this process's multiprocessing folder (pymp-*), which it removes at exit:
    # a worker killed leaves its own behind otherwise
    multiprocessing.util.get_temp_dir()
    with tempfile.TemporaryDirectory(prefix="pipeline-kill-") as tmp:
        shards = build(Path(tmp) / "shards")
        reference = ids(new_loader(shards))
        for run in range(runs):
            # a run that hangs ends the benchmark with every thread's stack, not a silent wait
            faulthandler.dump_traceback_later(RUN_LIMIT_S, exit=True)
            outcome = one_run(shards, reference, during_step=run % 2 == 1)
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
