"""``pipeline tune``: which ``num_workers`` and ``prefetch_factor`` suit these shards on this
machine, measured rather than guessed.

The search is small on purpose, so that it takes well under a minute: first each number of
workers (0, 1, 2, 4, ... up to the cores this process may use) with the default prefetch, then,
at the best of them, a prefetch of 1 and of 4. A setting is stopped as soon as it is clearly
worse (under half the best rate so far, after a second of measuring). What is recommended is
the fastest setting, or, among those within ``NEAR`` of it (the noise of a shared machine), the
one that holds least memory, then the one with fewest workers (cores left to the training).

There is no "batches per message" knob: a worker hands a whole unit of the plan (about
``shuffle_buffer`` samples) over as one message, so the per-message cost of a DataLoader is
paid once per unit already; the unit's size is the shuffle buffer's, a setting of shuffle
quality and memory that ``tune`` keeps as given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..stream.shards import resolve_shards
from .throughput import Measured, Setting, measure

NEAR = 0.05
GIVE_UP = 0.5  # a setting below this fraction of the best rate so far is stopped
DEFAULT_PREFETCH = 2


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def worker_counts(cores: int) -> list[int]:
    """0, 1, 2, 4, ... and ``cores`` itself."""
    counts, n = [0], 1
    while n < cores:
        counts.append(n)
        n *= 2
    return sorted({*counts, cores})


@dataclass
class TuneResult:
    """The settings measured, in the order they ran, and which is recommended."""

    data: str
    options: dict[str, Any]
    rows: list[Measured]
    memory_mb: float | None = None
    step_ms: float = 0.0  # the simulated step: without one, the loop only waits, and input-bound says nothing

    @property
    def best(self) -> Measured:
        """The recommended setting (see the module docstring)."""
        fitting = [r for r in self.rows if not r.stopped_early and (self.memory_mb is None or r.peak_mb <= self.memory_mb)]
        if not fitting:
            raise ValueError(f"no setting ran within {self.memory_mb:,.0f} MB: raise --memory-mb, or give a smaller "
                             f"shuffle_buffer")
        top = max(r.samples_per_s for r in fitting)
        near = [r for r in fitting if r.samples_per_s >= (1 - NEAR) * top]
        return min(near, key=lambda r: (r.peak_mb, r.setting.num_workers, r.setting.prefetch_factor or 0))

    def call(self) -> str:
        """The ``make_loader(...)`` call that the recommendation comes down to."""
        setting = self.best.setting
        options = "".join(f", {key}={value!r}" for key, value in self.options.items())
        prefetch = f", prefetch_factor={setting.prefetch_factor}" if setting.num_workers else ""
        return f"pipeline.make_loader({self.data!r}, num_workers={setting.num_workers}{prefetch}{options})"

    def table(self) -> str:
        """The settings measured, as a Markdown table."""
        best = self.best.setting
        header = ["num_workers", "prefetch_factor", "samples/s", "MB/s", "first batch s", "peak PSS MB",
                  "input-bound", "workers' time: storage / decode / gather / handover", ""]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in self.rows:
            note = "stopped early: clearly slower" if r.stopped_early else "recommended" if r.setting == best else ""
            cells = [str(r.setting.num_workers), str(r.setting.prefetch_factor or "-"), f"{r.samples_per_s:,.0f}",
                     f"{r.mb_per_s:,.1f}", "-" if r.first_batch_s is None else f"{r.first_batch_s:.2f}",
                     f"{r.peak_mb:,.0f}", f"{r.profile.get('input_bound', 0):.0%}" if self.step_ms else "-",
                     stage_shares(r.profile), note]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Save a chart of each setting's samples/s and peak memory as an image (PNG)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise ImportError("a plot needs matplotlib: pip install 'pipeline[plot]'") from exc
        labels = [f"w={r.setting.num_workers}" + (f"\np={r.setting.prefetch_factor}" if r.setting.num_workers else "")
                  for r in self.rows]
        figure, rate_axis = plt.subplots(figsize=(max(4, 1.2 * len(self.rows)), 4))
        best = self.best
        colours = ["tab:green" if r is best else "tab:grey" if r.stopped_early else "tab:blue" for r in self.rows]
        rate_axis.bar(range(len(self.rows)), [r.samples_per_s for r in self.rows], color=colours)
        rate_axis.set_xticks(range(len(self.rows)), labels)
        rate_axis.set_ylabel("samples/s")
        memory_axis = rate_axis.twinx()
        memory_axis.plot(range(len(self.rows)), [r.peak_mb for r in self.rows], "o-", color="tab:red")
        memory_axis.set_ylabel("peak PSS MB", color="tab:red")
        memory_axis.set_ylim(bottom=0)
        rate_axis.set_title(f"{self.data}: recommended {best.setting}")
        figure.tight_layout()
        figure.savefig(path)
        plt.close(figure)


def stage_shares(profile: Mapping[str, float]) -> str:
    """The workers' time (or, without workers, the loader's) split between the stages, in %."""
    stages = [profile.get(key, 0.0) for key in ("storage_s", "decode_s", "gather_s", "handover_s")]
    total = sum(stages)
    return " / ".join(f"{s / total:.0%}" for s in stages) if total else "-"


def tune(data: str | Mapping[str, Any], *, batch_size: int = 256, workers: Sequence[int] | None = None,
         prefetch: Sequence[int] | None = None, step_ms: float = 0.0, seconds: float = 3.0, warmup: float = 0.5,
         memory_mb: float | None = None, options: Mapping[str, Any] | None = None,
         progress: Callable[[str], None] | None = None) -> TuneResult:
    """Measure loader settings on ``data`` (what ``make_loader`` takes) and recommend one.

    ``workers``: the numbers of workers to try (default: 0, 1, 2, 4, ... up to the usable cores);
    ``prefetch``: the prefetch factors to try at the best of them (default: 1 and 4, besides 2);
    ``step_ms``: a simulated training step per batch (a sleep: the CPU stays free, as while a GPU
    computes); ``seconds``/``warmup``: how long each setting is measured, after how long a warm-up
    from its first batch; ``memory_mb``: leave out settings whose peak memory (PSS of the process
    tree) is above it; ``options``: other ``make_loader`` options (``shuffle_buffer``,
    ``fields``, ``cache_dir``...). ``progress`` is told of each setting as it is measured."""
    if not (seconds > 0 and warmup >= 0 and step_ms >= 0):
        raise ValueError(f"seconds must be > 0, warmup and step_ms >= 0; got seconds={seconds}, warmup={warmup}, "
                         f"step_ms={step_ms}")
    if workers is not None and any(n < 0 for n in workers):
        raise ValueError(f"numbers of workers must be >= 0, got {list(workers)}")
    if prefetch is not None and any(n < 1 for n in prefetch):
        raise ValueError(f"prefetch factors must be >= 1, got {list(prefetch)}")
    for location in data.values() if isinstance(data, Mapping) else [data]:  # a mix: each of its sources
        resolve_shards(location)  # data that is not there is told as itself, before a measuring process starts
    options = {"batch_size": batch_size, **(options or {})}
    rows: list[Measured] = []

    def fits(row: Measured) -> bool:
        return not row.stopped_early and (memory_mb is None or row.peak_mb <= memory_mb)

    def run(setting: Setting) -> Measured:
        best = max((r.samples_per_s for r in rows if fits(r)), default=0.0)
        row = measure(data, setting, options, seconds=seconds, warmup=warmup, step_ms=step_ms,
                      give_up_below=GIVE_UP * best if best else None)
        rows.append(row)
        if progress is not None:
            progress(f"{setting}: {row.samples_per_s:,.0f} samples/s, peak {row.peak_mb:,.0f} MB"
                     + (" (stopped early: clearly slower)" if row.stopped_early else ""))
        return row

    counts = worker_counts(usable_cores()) if workers is None else sorted(set(workers))
    swept = [run(Setting(n, DEFAULT_PREFETCH if n else None)) for n in counts]
    with_workers = [r for r in swept if r.setting.num_workers and fits(r)]
    if with_workers:
        top = max(with_workers, key=lambda r: r.samples_per_s).setting
        factors = [1, 4] if prefetch is None else sorted(set(prefetch))
        for factor in factors:
            if factor != top.prefetch_factor:
                run(Setting(top.num_workers, factor))
    return TuneResult(data, dict(options), rows, memory_mb, step_ms)
