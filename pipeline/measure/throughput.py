"""One loader setting measured in a process of its own: samples/s after a warm-up, the time to
the first batch, the peak memory of the process tree (the loader and its workers) and the
per-stage profile, optionally under a simulated training step.

Why a process of its own: a setting's memory is then its own (not what an earlier one left
behind), its workers start as a training job's would, and a setting clearly worse than the
best so far can be stopped at once, workers and all (the child leads a process group of its own).
The child reports its progress as JSON lines on stdout, a few times a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .memory import MB, TreeMemory

TICK_S = 0.25  # how often the child reports its progress
GRACE_S = 1.0  # a setting is judged only after this much of its measuring time
START_LIMIT_S = 120.0  # beyond its measuring time, how long a setting may take before it counts as hung


@dataclass(frozen=True)
class Setting:
    """The loader settings one run tries."""

    num_workers: int
    prefetch_factor: int | None  # None without workers

    def __str__(self) -> str:
        return f"num_workers={self.num_workers}" + (
            f", prefetch_factor={self.prefetch_factor}" if self.num_workers else "")


@dataclass
class Measured:
    """What one setting did. ``stopped_early``: it was stopped as clearly worse than the best
    so far, its figures are those of the time it ran."""

    setting: Setting
    samples: int
    seconds: float
    sample_bytes: int
    first_batch_s: float | None
    peak_rss_mb: float
    peak_pss_mb: float
    profile: dict[str, float] = field(default_factory=dict)
    stopped_early: bool = False

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.samples_per_s * self.sample_bytes / MB

    @property
    def peak_mb(self) -> float:
        """The peak memory to budget with: PSS where the kernel reports it, else RSS."""
        return self.peak_pss_mb or self.peak_rss_mb


def measure(data: str, setting: Setting, options: Mapping[str, Any], *, seconds: float = 3.0, warmup: float = 0.5,
            step_ms: float = 0.0, give_up_below: float | None = None) -> Measured:
    """Run ``make_loader(data, **setting, **options)`` in a fresh process for ``warmup`` seconds
    after its first batch, then ``seconds`` more, measured (over as many epochs as that takes),
    sleeping ``step_ms`` per batch. Stopped once it has measured ``GRACE_S`` at under
    ``give_up_below`` samples/s."""
    spec = {"data": data, "workers": setting.num_workers, "prefetch": setting.prefetch_factor,
            "options": _json_options(options), "seconds": seconds, "warmup": warmup, "step_ms": step_ms}
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.measure.throughput", json.dumps(spec)],
                                stdout=subprocess.PIPE, stderr=errors, text=True, start_new_session=True)
        monitor = TreeMemory(proc.pid, pss=True)
        monitor.start()
        limit = START_LIMIT_S + warmup + seconds
        hung = threading.Event()
        watchdog = threading.Timer(limit, lambda: (hung.set(), _stop_group(proc, wait=False)))
        watchdog.start()
        last: dict[str, Any] = {}
        stopped = False
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                last = json.loads(line)
                if "error" in last:
                    raise ValueError(f"{last['error']} (measuring {setting})")
                if last.get("done"):
                    break  # the result is in: what the child does while it exits is not measured
                rate = last["samples"] / last["seconds"] if last["seconds"] else 0.0
                if give_up_below is not None and last["seconds"] >= GRACE_S and rate < give_up_below:
                    stopped = True
                    break
        finally:
            watchdog.cancel()
            _stop_group(proc)
            monitor.stop()
        if hung.is_set():
            raise RuntimeError(f"measuring {setting} on {data}: no result within {limit:.0f} s (storage that does "
                               f"not answer? a reader that hangs?); it was stopped")
        if not stopped and not last.get("done"):
            errors.seek(0)
            raise RuntimeError(f"measuring {setting} on {data} failed (exit {proc.returncode}) before a result:\n"
                               f"{errors.read()[-3000:]}")
    return Measured(setting, last.get("samples", 0), last.get("seconds", 0.0), last.get("sample_bytes", 0),
                    last.get("first_batch_s"), monitor.peak_rss / MB, monitor.peak_pss / MB,
                    last.get("profile", {}), stopped)


def _stop_group(proc: subprocess.Popen, wait: bool = True) -> None:
    """End the child and what is left of its process group (its DataLoader workers), then reap it.
    The group is killed even when the child has exited: its workers may outlive it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child is not reaped yet, so its pid is not reused
    except ProcessLookupError:
        pass
    if wait:
        proc.wait()


def _rows(batch: Any) -> int:
    first = next(iter(batch.values())) if isinstance(batch, Mapping) else batch[0]
    return len(first)


def _report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _play(loader: Any, spec: Mapping[str, Any]) -> Iterable[tuple[float, int]]:
    """``(time, rows)`` of every batch, epoch after epoch, each after the simulated step."""
    step = spec["step_ms"] / 1000
    while True:
        batches = 0
        for batch in loader:
            batches += 1
            if step:
                time.sleep(step)
            yield time.perf_counter(), _rows(batch)
        if not batches:
            raise SystemExit(f"{spec['data']}: an epoch without a batch (fewer samples than batch_size?)")


def _json_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``make_loader`` options as JSON for the child: ``images``' specs as their fields."""
    images = options.get("images")
    if not images:
        return dict(options)
    return {**options, "images": {name: spec.to_json() for name, spec in images.items()}}


def child_main(spec: Mapping[str, Any]) -> None:
    """Measure the loader of ``spec``, reporting progress as JSON lines (``done`` on the last)."""
    from ..stream.images import Images
    from ..stream.loader import make_loader

    started = time.perf_counter()
    options = dict(spec["options"])
    if options.get("images"):
        options["images"] = {name: Images.from_json(fields) for name, fields in options["images"].items()}
    loader = make_loader(spec["data"], num_workers=spec["workers"], prefetch_factor=spec["prefetch"], **options)
    sample_bytes = loader.dataset.sample_bytes()
    first = measuring_from = None
    before: dict[str, float] = {}
    samples, ticked = 0, started
    for now, rows in _play(loader, spec):
        if first is None:
            first = now - started
        if measuring_from is None:
            if now - started - first >= spec["warmup"]:
                measuring_from, before = now, loader.stats()
            continue
        samples += rows
        done = now - measuring_from >= spec["seconds"]
        if done or now - ticked >= TICK_S:
            ticked = now
            stats = loader.stats()
            profile = {key: value - before[key] for key, value in stats.items() if key.endswith("_s")}
            looped = profile["wait_s"] + profile["step_s"]
            profile["input_bound"] = profile["wait_s"] / looped if looped else 0.0
            _report(samples=samples, seconds=now - measuring_from, first_batch_s=first, sample_bytes=sample_bytes,
                    profile=profile, done=done)
        if done:
            return


if __name__ == "__main__":
    try:
        child_main(json.loads(sys.argv[1]))
    except Exception as exc:  # noqa: BLE001 - the parent shows it as the setting's error
        _report(error=f"{type(exc).__name__}: {exc}")
        raise
