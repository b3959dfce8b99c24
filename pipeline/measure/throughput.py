"""One loader setting measured in a process of its own: samples/s after a warm-up, the bytes of
the batches delivered, the time to the first batch, the peak memory of the process tree (the
loader and its workers) and the per-stage profile, optionally under a simulated training step.

Why a process of its own: a setting's memory is then its own (not what an earlier one left
behind), its workers start as a training job's would, and a setting clearly worse than the
best so far can be stopped at once, workers and all (the child leads a process group of its own).

The process is started with multiprocessing's spawn, and the ``make_loader`` options reach it
pickled, as they reach DataLoader workers started with spawn: transforms are the user's own
functions (a function at the top level of their script pickles by name, and spawn imports the
script again in the child), so what is measured is their loader, not one without its most
costly part. The child reports its progress through a pipe, a few times a second. It ends as a
Python process ends, after its result or when an event asks it to (a setting stopped early), so
that its loader stops its workers and multiprocessing's exit handlers remove its temporary files
(``pymp-*``), which a kill leaves behind; a child that hangs gets SIGTERM, SIGKILL being the last
resort.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Iterator, Mapping

from .memory import MB, TreeMemory

TICK_S = 0.25  # how often the child reports its progress
GRACE_S = 1.0  # a setting is judged only after this much of its measuring time
START_LIMIT_S = 120.0  # beyond its measuring time, how long a setting may take before it counts as hung
EXIT_LIMIT_S = 10.0  # how long the child may take to stop its workers and exit before it is killed
_SILENT = ("(it wrote nothing: it failed as it started, before its output was kept; the lines above say why, e.g. "
           "a script that calls tune outside `if __name__ == \"__main__\":`, which spawn runs again)")


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
    """What one setting did. ``batch_bytes``: the bytes of the batches delivered in the measured
    time (the fields read, as the training loop gets them: images decoded), ``None`` where a
    batch held values of no known size. ``stopped_early``: it was stopped as clearly worse than
    the best so far, its figures are those of the time it ran."""

    setting: Setting
    samples: int
    seconds: float
    batch_bytes: int | None
    first_batch_s: float | None
    peak_rss_mb: float
    peak_pss_mb: float
    profile: dict[str, float] = field(default_factory=dict)
    stopped_early: bool = False

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float | None:
        """MB of batches delivered a second (``None`` when their size is not known)."""
        if self.batch_bytes is None:
            return None
        return self.batch_bytes / self.seconds / MB if self.seconds else 0.0

    @property
    def peak_mb(self) -> float:
        """The peak memory to budget with: PSS where the kernel reports it, else RSS."""
        return self.peak_pss_mb or self.peak_rss_mb


def pickled_options(options: Mapping[str, Any]) -> dict[str, bytes]:
    """Each option pickled on its own, so that one that cannot be is named (before any process
    starts) rather than reported as a pickling error somewhere in the mapping."""
    sent = {}
    for key, value in options.items():
        try:
            sent[key] = pickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - PicklingError, or a TypeError/AttributeError of the object
            raise ValueError(f"options[{key!r}] cannot be sent to the measuring process (each setting runs in a "
                             f"process of its own): {exc}; define it at the top level of a module or script, as for "
                             f"DataLoader workers started with spawn") from None
    return sent


def measure(data: Any, setting: Setting, options: Mapping[str, Any], *, seconds: float = 3.0, warmup: float = 0.5,
            step_ms: float = 0.0, give_up_below: float | None = None) -> Measured:
    """Run ``make_loader(data, **setting, **options)`` in a fresh process for ``warmup`` seconds
    after its first batch, then ``seconds`` more, measured (over as many epochs as that takes),
    sleeping ``step_ms`` per batch. Stopped once it has measured ``GRACE_S`` at under
    ``give_up_below`` samples/s."""
    spec = {"data": data, "workers": setting.num_workers, "prefetch": setting.prefetch_factor,
            "seconds": seconds, "warmup": warmup, "step_ms": step_ms,
            # how this process would start DataLoader workers (read without fixing it; spawn's child
            # would use spawn): fork on Linux, unless set otherwise
            "start_method": multiprocessing.get_start_method(allow_none=True)
            or multiprocessing.get_all_start_methods()[0]}
    sent = pickled_options(options)
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    with tempfile.NamedTemporaryFile("w+") as output:  # the child's stdout and stderr, told when it fails
        stop = context.Event()
        child = context.Process(target=child_main, args=(spec, sent, sender, stop, output.name),
                                name=f"tune {setting}")
        child.start()
        sender.close()  # the child's end: once the child is gone, reading finds the end of the pipe
        monitor = TreeMemory(child.pid, pss=True)  # type: ignore[arg-type]
        monitor.start()
        limit = START_LIMIT_S + warmup + seconds
        last: dict[str, Any] = {}
        stopped = hung = False
        try:
            deadline = time.monotonic() + limit
            while True:
                if not receiver.poll(TICK_S):
                    if time.monotonic() > deadline:
                        hung = True
                        break
                    if child.exitcode is not None and not receiver.poll(0):  # (its last words may just have come)
                        break  # it ended without a word (its workers may still hold the pipe open)
                    continue
                try:
                    last = receiver.recv()
                except EOFError:
                    break
                if "error" in last:
                    raise ValueError(f"{last['error']} (measuring {setting})")
                if last.get("done"):
                    break  # the result is in: what the child does while it exits is not measured
                rate = last["samples"] / last["seconds"] if last["seconds"] else 0.0
                if give_up_below is not None and last["seconds"] >= GRACE_S and rate < give_up_below:
                    stopped = True
                    break
        finally:
            monitor.stop()
            exitcode = _stop(child, stop, patience=0.0 if hung else EXIT_LIMIT_S)
            receiver.close()
        if hung:
            raise RuntimeError(f"measuring {setting} on {data}: no result within {limit:.0f} s (storage that does "
                               f"not answer? a reader that hangs?); it was stopped")
        if not stopped and not last.get("done"):
            output.seek(0)
            said = output.read()[-3000:] or _SILENT
            raise RuntimeError(f"measuring {setting} on {data} failed (exit {exitcode}) before a result:\n{said}")
    return Measured(setting, last.get("samples", 0), last.get("seconds", 0.0), last.get("batch_bytes"),
                    last.get("first_batch_s"), monitor.peak_rss / MB, monitor.peak_pss / MB,
                    last.get("profile", {}), stopped)


def _stop(child: Any, stop: Any, patience: float) -> int:
    """Ask the child to end (``stop``), and give it ``patience`` seconds to, as a Python process
    ends (see the module docstring); then SIGTERM, which it turns into ``SystemExit``; then,
    ``EXIT_LIMIT_S`` later, SIGKILL. Whatever is left of its process group (DataLoader workers of
    a child that was killed) is killed too. Returns its exit status."""
    stop.set()
    child.join(patience)
    if child.exitcode is None:
        child.terminate()
        child.join(EXIT_LIMIT_S)
    try:  # (a group outlives its leader: the kernel reuses no group's id while a member is left)
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # no group left (or none yet: it had not called setsid)
        pass
    if child.exitcode is None:
        child.kill()
    child.join()
    exitcode = child.exitcode
    child.close()
    return exitcode


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM in the child: end as after an error, through ``finally`` and the exit handlers."""
    raise SystemExit(128 + signum)


def _default_sigterm() -> None:
    """In a DataLoader worker forked by the child: SIGTERM as usual (the child's exit handlers
    end workers still running with it; a ``SystemExit`` in their own exit handlers would cut
    those short)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _size(value: Any) -> int | None:
    """Bytes of a batch as the training loop gets it: its tensors' and arrays' data, its bytes and
    strings (UTF-8); ``None`` where it holds something else, whose size is not known."""
    if value is None:
        return 0
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, str):
        return len(value.encode())
    if hasattr(value, "nbytes"):  # a tensor, an array, a memoryview
        return int(value.nbytes)
    parts = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else None
    if parts is None:
        return None
    total = 0
    for part in parts:
        size = _size(part)
        if size is None:
            return None
        total += size
    return total


def _rows(batch: Any) -> int:
    first = next(iter(batch.values())) if isinstance(batch, Mapping) else batch[0]
    return len(first)


def _play(loader: Any, spec: Mapping[str, Any]) -> Iterator[tuple[float, Any]]:
    """``(time it arrived, batch)`` of every batch, epoch after epoch, the simulated step taken
    after each (while the caller counts it, the loader counts it as the loop's)."""
    step = spec["step_ms"] / 1000
    while True:
        batches = 0
        for batch in loader:
            batches += 1
            yield time.perf_counter(), batch
            if step:
                time.sleep(step)
        if not batches:
            raise SystemExit(f"{spec['data']}: an epoch without a batch (fewer samples than batch_size?)")


class _Unloadable(ValueError):
    """An option the measuring process could not unpickle (its message names it)."""


def _load_options(sent: Mapping[str, bytes]) -> dict[str, Any]:
    """The options unpickled one by one, so that one this process cannot load is named."""
    options = {}
    for key, data in sent.items():
        try:
            options[key] = pickle.loads(data)
        except Exception as exc:  # noqa: BLE001 - AttributeError, ImportError...: told with the option's name
            raise _Unloadable(f"options[{key!r}] could not be loaded in the measuring process ({type(exc).__name__}: "
                             f"{exc}): a function of an interactive session, a notebook or python -c cannot be; "
                             f"define it in a file") from None
    return options


def child_main(spec: Mapping[str, Any], sent: Mapping[str, bytes], report: Connection, stop: Any,
               output: str) -> None:
    """Measure the loader of ``spec`` with the options ``sent``, reporting progress as dicts on
    ``report`` (``done`` on the last, or ``error``) until done or ``stop`` is set. Runs in the
    spawned process."""
    os.setsid()  # a process group of its own, which the parent can end with its workers
    multiprocessing.set_start_method(spec["start_method"], force=True)  # workers start as in the caller's job
    signal.signal(signal.SIGTERM, _terminated)
    os.register_at_fork(after_in_child=_default_sigterm)
    with open(output, "w") as sink:  # the parent keeps the terminal's output for its table
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    try:
        _measure_here(spec, _load_options(sent), report, stop)
    except Exception as exc:  # noqa: BLE001 - the parent shows it as the setting's error
        report.send({"error": str(exc) if isinstance(exc, _Unloadable) else f"{type(exc).__name__}: {exc}"})
        raise


def _measure_here(spec: Mapping[str, Any], options: dict[str, Any], report: Connection, stop: Any) -> None:
    """The measuring itself: the time to the first batch counts from making the loader (reading
    the index, starting workers) to its arrival; samples and bytes count from the end of the
    warm-up."""
    from ..stream.loader_defaults import make_loader

    started = time.perf_counter()
    loader = make_loader(spec["data"], num_workers=spec["workers"], prefetch_factor=spec["prefetch"], **options)
    first = measuring_from = None
    before: dict[str, float] = {}
    samples, ticked = 0, started
    delivered: int | None = 0
    batches = _play(loader, spec)
    try:
        for now, batch in batches:
            if stop.is_set():
                return
            if first is None:
                first = now - started
            if measuring_from is None:
                if now - started - first >= spec["warmup"]:
                    measuring_from, before = now, loader.stats()
                continue
            samples += _rows(batch)
            if delivered is not None:
                size = _size(batch)
                delivered = None if size is None else delivered + size
            done = now - measuring_from >= spec["seconds"]
            if done or now - ticked >= TICK_S:
                ticked = now
                stats = loader.stats()
                profile = {key: value - before[key] for key, value in stats.items() if key.endswith("_s")}
                looped = profile["wait_s"] + profile["step_s"]
                profile["input_bound"] = profile["wait_s"] / looped if looped else 0.0
                report.send({"samples": samples, "seconds": now - measuring_from, "first_batch_s": first,
                             "batch_bytes": delivered, "profile": profile, "done": done})
            if done:
                return
    finally:
        batches.close()  # the loader's loop ends, and with it its workers, before this process exits
