#!/usr/bin/env python
"""Soak benchmark: stream a shard set over HTTP, through a proxy that breaks a few percent of the
connections, epoch after epoch for a fixed time, and watch the loader's process tree for leaks.

Why: a training job reads the same shards for days. It must neither lose nor repeat a sample
when a connection breaks, nor grow its memory, descriptors or threads with each epoch or each
retried request. Unit tests run for seconds and see neither slow leaks nor rare races; this
runs long enough for a slope to show.

What runs:

- data: ``--samples`` samples in ``--shards`` shards (``pack=16``) written by ``write_shards``:
  an int64 ``id`` and a row ``x`` of ``--dim`` int32 derived from it (``x[j] = id * dim + j``),
  so that every delivered byte can be checked, not only the ids;
- nginx on 127.0.0.1 serves them, and ``FaultProxy`` (``tests/storage/servers.py``), in this
  process, stands in front of it: every request gets a connection of its own and ``--faults``
  of them are broken (``cut``: closed after some bytes; ``stall``: silent for
  ``--stall-seconds``, longer than the loader's read timeout; ``trickle``: a byte every 0.1 s;
  ``503``: refused);
- the loader runs in a child process (this script with ``--child``): ``make_loader`` over the
  proxy's index URL, ``--workers`` persistent DataLoader workers, one rank,
  ``remainder="keep"`` and ``drop_last=False``, so every epoch must deliver every id exactly
  once (and ``len(loader)`` batches). ``set_epoch(e)`` opens each epoch; none starts after the
  deadline, so the last one ends a little after it;
- this process samples, every second, the RSS (``/proc/PID/statm``, as ``VmRSS``), open file
  descriptors (``/proc/PID/fd``) and threads (``/proc/PID/status``) of the loader's process
  tree (the child and its workers, summed), and nginx's RSS and descriptors.

Reported: epochs completed, samples/s, exactness of every epoch (duplicates, missing and wrong
rows), the proxy's fault counts and the loader's retry counter (``loader.stats()``), and per
resource its value at the end of the warm-up and at the end, its range after the warm-up, its
peak over the whole run, and its least-squares slope per hour after the warm-up (the first
epoch, and at least ``--warmup-minutes``). Workers start, buffers fill and request threads
start during the warm-up; after it, a leak is a slope well above the noise of the range.

Exit status 1 when an epoch was not exactly once or held a wrong row, or when the loader failed
or hung (its stacks are then dumped into its log).

Usage::

    python scripts/bench_soak.py --minutes 1               # a check, about two minutes
    python scripts/bench_soak.py --out soak.json           # 30 minutes, samples saved
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # for tests/; last, so that the library snapshot on PYTHONPATH wins

from benchlib.common import log, markdown_table, process_tree, pss_bytes, rss_bytes, rss_parts  # noqa: E402
from benchlib.library import snapshot_library  # noqa: E402

from tests.storage.servers import FaultProxy, start_nginx, stop  # noqa: E402

MB = 1e6
PACK = 16
SAMPLE_INTERVAL_S = 1.0
DEFAULT_FAULTS = "cut=0.02,stall=0.005,trickle=0.005,503=0.01"
RESOURCES = {  # what the sampler records, as the report names it
    "rss_mb": "loader tree RSS (MB)", "anon_mb": "of which anonymous", "file_mb": "of which file-backed",
    "shmem_mb": "of which shared memory", "pss_mb": "loader tree PSS (MB)", "main_rss_mb": "the main process's RSS",
    "fds": "loader tree open fds", "threads": "loader tree threads", "processes": "loader tree processes",
    "nginx_rss_mb": "nginx RSS (MB)", "nginx_fds": "nginx open fds"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30, help="how long to stream (default 30)")
    p.add_argument("--warmup-minutes", type=float,
                   help="left out of the slopes, besides the first epoch (default: a fifth of the run, at most 2)")
    p.add_argument("--samples", type=int, default=60_001,
                   help="samples (default 60,001: not a multiple of the batch size, so the last batch is short)")
    p.add_argument("--dim", type=int, default=512, help="int32 values per sample (default 512: 2 KB)")
    p.add_argument("--shards", type=int, default=48, help="shards (default 48)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--faults", default=DEFAULT_FAULTS,
                   help=f"probability of each fault per request (default {DEFAULT_FAULTS})")
    p.add_argument("--stall-seconds", type=float, default=6.0, help="how long a stalled response is silent")
    p.add_argument("--read-timeout", type=float, default=3.0,
                   help="PIPELINE_READ_TIMEOUT of the loader: how soon it gives up on a silent connection")
    p.add_argument("--hang-minutes", type=float, default=10,
                   help="an epoch longer than this counts as a hang: the loader is stopped (default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write the run, its epochs and its per-second samples as JSON")
    p.add_argument("--quick", action="store_true",
                   help="6 seconds on 5,001 samples in 6 shards: a smoke run (a test runs it)")
    args = p.parse_args(argv)
    if args.quick:
        args.minutes, args.warmup_minutes, args.samples, args.shards = 0.1, 0.03, 5001, 6
    args.faults = {name: float(p) for name, p in (item.split("=") for item in args.faults.split(",") if item)}
    if args.warmup_minutes is None:
        args.warmup_minutes = min(2.0, args.minutes / 5)
    return args


# -- the data ----------------------------------------------------------------------------------


def build_dataset(folder: Path, samples: int, dim: int, shards: int) -> int:
    """Shards whose rows can be checked: ``x[i] = i * dim + arange(dim)``. Returns the bytes of
    one sample's payload."""
    import pipeline

    ids = np.arange(samples, dtype=np.int64)
    x = (ids[:, None] * dim + np.arange(dim)).astype(np.int32)
    pipeline.write_shards(folder, {"id": ids, "x": x}, prefix="soak", pack=PACK, shard_bytes=None,
                          shard_samples=-(-samples // shards), quiet=True)
    return x.itemsize * dim + ids.itemsize


# -- the loader, in the child process ----------------------------------------------------------


def check_epoch(ids: np.ndarray, samples: int) -> dict[str, int]:
    """How far the ids delivered in an epoch are from ``0..samples-1``, each once."""
    inside = ids[(ids >= 0) & (ids < samples)]
    counts = np.bincount(inside, minlength=samples)
    return {"samples": len(ids), "out_of_range": len(ids) - len(inside), "missing": int((counts == 0).sum()),
            "duplicates": int(np.maximum(counts - 1, 0).sum())}


def child_main(spec: dict[str, Any]) -> None:
    """Play epochs until the deadline; print one JSON line per epoch."""
    faulthandler.register(signal.SIGUSR1)  # the parent asks for our stacks before stopping a hang
    import pipeline

    loader = pipeline.make_loader(spec["url"], num_workers=spec["workers"], batch_size=spec["batch_size"],
                                  seed=spec["seed"], remainder="keep", drop_last=False)
    samples, dim = loader.dataset.samples, spec["dim"]
    columns = np.arange(dim)
    deadline = time.time() + spec["seconds"]
    epoch = 0
    while time.time() < deadline:
        loader.set_epoch(epoch)
        expected = len(loader)
        started = time.time()
        ids, batches, wrong_rows = [], 0, 0
        for batch in loader:
            got = batch["id"].numpy()
            wrong_rows += int((batch["x"].numpy() != got[:, None] * dim + columns).any(axis=1).sum())
            ids.append(got.copy())  # a copy: a view would keep the worker's shared memory open
            batches += 1
        report = {"epoch": epoch, "started": started, "ended": time.time(), "batches": batches,
                  "expected_batches": expected, "wrong_rows": wrong_rows,
                  **check_epoch(np.concatenate(ids) if ids else np.empty(0, np.int64), samples), **loader.stats()}
        report["exact"] = (batches == expected and report["samples"] == samples and wrong_rows == 0
                           and report["out_of_range"] == report["missing"] == report["duplicates"] == 0)
        print(json.dumps(report), flush=True)
        epoch += 1


# -- sampling the process tree -----------------------------------------------------------------


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def thread_count(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeSampler(threading.Thread):
    """Every second: summed RSS, open descriptors and threads of the loader's process tree,
    its RSS by kind (anonymous, file-backed, shared memory: a worker faults in the pages of
    library code as it first runs it, which is not memory it holds) and its PSS, the main
    process's RSS apart (growth there or in the workers has different causes), and nginx's RSS
    and descriptors (a server-side leak of connections would show there)."""

    def __init__(self, root: int, nginx: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.nginx = nginx
        self.samples: list[dict[str, float]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            pids = process_tree(self.root)
            parts = [rss_parts(p) for p in pids]
            self.samples.append({
                "t": time.time(), "rss_mb": round(sum(rss_bytes(p) for p in pids) / MB, 2),
                **{f"{kind}_mb": round(sum(p[kind] for p in parts) / MB, 2) for kind in ("anon", "file", "shmem")},
                "pss_mb": round(sum(pss_bytes(p) for p in pids) / MB, 2),
                "fds": sum(fd_count(p) for p in pids), "threads": sum(thread_count(p) for p in pids),
                "processes": len(pids), "main_rss_mb": round(rss_bytes(self.root) / MB, 2),
                "nginx_rss_mb": round(rss_bytes(self.nginx) / MB, 2),
                "nginx_fds": fd_count(self.nginx)})
            self._stop_event.wait(SAMPLE_INTERVAL_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


# -- the run -----------------------------------------------------------------------------------


def read_lines(stream: IO[str], into: queue.Queue) -> None:
    """Forward the child's output lines to ``into``; ``None`` when it closes."""
    for line in stream:
        into.put(line)
    into.put(None)


def progress(report: dict[str, Any], sample: dict[str, float] | None) -> str:
    seconds = report["ended"] - report["started"]
    state = "exact" if report["exact"] else (
        f"NOT EXACT: {report['missing']} missing, {report['duplicates']} repeated, {report['out_of_range']} "
        f"out of range, {report['wrong_rows']} wrong rows, {report['batches']}/{report['expected_batches']} batches")
    tree = "" if sample is None else \
        f", RSS {sample['rss_mb']:.0f} MB, {sample['fds']} fds, {sample['threads']} threads"
    return (f"epoch {report['epoch']}: {report['samples']:,} samples in {seconds:.1f} s "
            f"({report['samples'] / seconds:,.0f}/s), {state}, {report['retries']} retries so far{tree}")


def run_loader(args: argparse.Namespace, url: str, nginx: int, log_path: Path) -> dict[str, Any]:
    """Run the child until its deadline while sampling it; stop it if an epoch hangs."""
    spec = {"url": url, "workers": args.workers, "batch_size": args.batch_size, "seed": args.seed,
            "dim": args.dim, "seconds": args.minutes * 60}
    env = {**os.environ, "PIPELINE_READ_TIMEOUT": str(args.read_timeout)}
    with open(log_path, "w") as child_log:
        proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)], stdout=subprocess.PIPE,
                                stderr=child_log, text=True, env=env, start_new_session=True)
        sampler = TreeSampler(proc.pid, nginx)
        sampler.start()
        lines: queue.Queue = queue.Queue()
        assert proc.stdout is not None
        threading.Thread(target=read_lines, args=(proc.stdout, lines), daemon=True).start()
        epochs: list[dict[str, Any]] = []
        failure = None
        while True:
            try:
                line = lines.get(timeout=args.hang_minutes * 60)
            except queue.Empty:
                failure = f"no epoch ended in {args.hang_minutes} minutes: the loader hung (stacks in its log)"
                os.kill(proc.pid, signal.SIGUSR1)
                time.sleep(2)
                os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own group: it and its workers
                break
            if line is None:
                break
            if line.startswith("{"):
                epochs.append(json.loads(line))
                log(progress(epochs[-1], sampler.samples[-1] if sampler.samples else None))
        status = proc.wait()
        sampler.stop()
    if failure is None and status != 0:
        failure = f"the loader exited with status {status}"
    if failure:
        log(f"{failure}; the end of its log ({log_path}):\n" + log_path.read_text()[-6000:])
    return {"epochs": epochs, "samples": sampler.samples, "failure": failure, "started": sampler.samples[0]["t"]}


# -- the report --------------------------------------------------------------------------------


def trend(samples: list[dict[str, float]], key: str, since: float, until: float) -> dict[str, float | None]:
    """``key`` at the end of the warm-up (``since``) and at the end of the last epoch
    (``until``), its range and least-squares slope per hour between the two, and its peak over
    the whole run."""
    steady = [s for s in samples if since <= s["t"] <= until]
    if not steady:
        return {"start": None, "end": None, "min": None, "max": None, "peak": None, "slope_per_h": None}
    values = np.array([s[key] for s in steady], dtype=float)
    hours = (np.array([s["t"] for s in steady]) - steady[0]["t"]) / 3600
    slope = float(np.polyfit(hours, values, 1)[0]) if len(steady) > 2 else None
    return {"start": steady[0][key], "end": steady[-1][key], "min": float(values.min()),
            "max": float(values.max()), "peak": max(s[key] for s in samples), "slope_per_h": slope}


def summarise(args: argparse.Namespace, run: dict[str, Any], proxy: FaultProxy, sample_bytes: int) -> dict[str, Any]:
    epochs, samples = run["epochs"], run["samples"]
    warmup_end = run["started"] + args.warmup_minutes * 60
    steady_end = samples[-1]["t"]  # without epochs; with them, the end of the last (not the teardown)
    if epochs:
        warmup_end, steady_end = max(warmup_end, epochs[0]["ended"]), epochs[-1]["ended"]
    seconds = sum(e["ended"] - e["started"] for e in epochs)
    delivered = sum(e["samples"] for e in epochs)
    return {
        "minutes": (samples[-1]["t"] - run["started"]) / 60 if samples else 0.0,
        "warmup_minutes": (warmup_end - run["started"]) / 60,
        "epochs": len(epochs),
        "exact_epochs": sum(e["exact"] for e in epochs),
        "samples_per_s": delivered / seconds if seconds else 0.0,
        "mb_per_s": delivered * sample_bytes / seconds / MB if seconds else 0.0,
        "retries": epochs[-1]["retries"] if epochs else 0,
        "proxy": dict(proxy.counts),
        "failure": run["failure"],
        "trends": {key: trend(samples, key, warmup_end, steady_end)
                   for key in RESOURCES},
    }


def fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else f"{value:{spec}}"


def report(args: argparse.Namespace, summary: dict[str, Any], epochs: list[dict[str, Any]]) -> None:
    proxy = summary["proxy"]
    requests = sum(proxy.values())
    faults = ", ".join(f"{name} {count}" for name, count in sorted(proxy.items()) if name != "ok")
    bad = [e for e in epochs if not e["exact"]]
    print(f"\n### Soak: {summary['minutes']:.1f} minutes over HTTP through a fault proxy, "
          f"{args.workers} workers, {args.samples:,} samples in {args.shards} shards\n")
    print(markdown_table(["", ""], [
        ["epochs completed", f"{summary['epochs']}"],
        ["exactly once", f"{summary['exact_epochs']}/{summary['epochs']} epochs"
                         + ("" if not bad else " — **FAILED: " + ", ".join(str(e["epoch"]) for e in bad) + "**")],
        ["samples/s", f"{summary['samples_per_s']:,.0f} ({summary['mb_per_s']:,.1f} MB/s of payload)"],
        ["requests through the proxy", f"{requests:,} ({faults}: {(requests - proxy.get('ok', 0)) / max(requests, 1):.1%})"],
        ["loader retries (`loader.stats()`)", f"{summary['retries']:,}"],
        ["failure", summary["failure"] or "none"],
    ]))
    print(f"\n### Resources (from the end of a warm-up of {summary['warmup_minutes']:.1f} minutes to the end "
          "of the last epoch; peak over the whole run)\n")
    print(markdown_table(["", "start", "end", "min", "max", "peak", "slope per hour"], [
        [RESOURCES[key], fmt(t["start"]), fmt(t["end"]), fmt(t["min"]), fmt(t["max"]), fmt(t["peak"]),
         fmt(t["slope_per_h"], "+.1f")] for key, t in summary["trends"].items()]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        work = Path(tmp)
        revision = snapshot_library(work, None)
        log(f"pipeline at {revision}; writing {args.samples:,} samples in {args.shards} shards")
        sample_bytes = build_dataset(work / "data", args.samples, args.dim, args.shards)
        base, nginx = start_nginx(work / "nginx", work)
        proxy = FaultProxy(int(base.rsplit(":", 1)[1]), args.faults, seed=args.seed,
                           stall_seconds=args.stall_seconds)
        try:
            log(f"streaming for {args.minutes} minutes from {proxy.url}/data/ (nginx at {base})")
            run = run_loader(args, f"{proxy.url}/data/index.json", nginx.pid, work / "loader.log")
        finally:
            proxy.close()
            stop(nginx)
    summary = summarise(args, run, proxy, sample_bytes)
    report(args, summary, run["epochs"])
    if args.out:
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        args.out.write_text(json.dumps({"command": " ".join([Path(sys.executable).name, *sys.argv]),
                                        "revision": revision, "config": config, "summary": summary,
                                        "epochs": run["epochs"], "samples": run["samples"]}, indent=1) + "\n")
        print(f"\nwritten to {args.out}")
    failed = run["failure"] or not run["epochs"] or summary["exact_epochs"] < summary["epochs"]
    if failed:
        print("\n**SOAK FAILED**: " + (run["failure"] or "an epoch was not exactly once, or none completed"))
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child_main(json.loads(sys.argv[2]))
    else:
        # a plain ``kill`` unwinds like Ctrl-C, so that nginx stops and the data is removed
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        sys.exit(main())
