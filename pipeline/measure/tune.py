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

import ast
import math
import os
import types
from dataclasses import dataclass, field, fields
from numbers import Integral
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..storage import redact
from ..stream.loader_defaults import make_loader
from ..stream.shards import resolve_shards
from ..stream.sources import Sources
from ..stream.stats import STAGES
from .throughput import Measured, Setting, measure, pickled_options

NEAR = 0.05
GIVE_UP = 0.5  # a setting below this fraction of the best rate so far is stopped
DEFAULT_PREFETCH = 2
VARIED = {"num_workers": "workers", "prefetch_factor": "prefetch"}  # make_loader's options tune varies: its own names


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
    """The settings measured, in the order they ran, which is recommended, and what was not
    tried and why (``skipped``)."""

    data: Sources  # (paths as their text: see __post_init__)
    options: dict[str, Any]
    rows: list[Measured]
    memory_mb: float | None = None
    step_ms: float = 0.0  # the simulated step: without one, the loop only waits, and input-bound says nothing
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.data = _plain(self.data)  # (a result made of paths shows them as the call writes them)

    def __repr__(self) -> str:
        """A dataclass's, but with each URL's credentials left out: a notebook shows it."""
        shown = (f"{item.name}={_redacted(self.data) if item.name == 'data' else getattr(self, item.name)!r}"
                 for item in fields(self))
        return f"{type(self).__name__}({', '.join(shown)})"

    def fits(self, row: Measured) -> bool:
        """Whether ``row`` may be recommended: it ran its full time, within the memory budget."""
        return not row.stopped_early and (self.memory_mb is None or row.peak_mb <= self.memory_mb)

    def _pick(self) -> Measured | None:
        fitting = [r for r in self.rows if self.fits(r)]
        if not fitting:
            return None
        top = max(r.samples_per_s for r in fitting)
        near = [r for r in fitting if r.samples_per_s >= (1 - NEAR) * top]
        return min(near, key=_preference)

    @property
    def best(self) -> Measured:
        """The recommended setting (see the module docstring)."""
        best = self._pick()
        if best is None:
            raise ValueError(f"no setting ran within {self.memory_mb:,.0f} MB: raise memory_mb (--memory-mb), "
                             f"or give a smaller shuffle_buffer")
        return best

    def call(self) -> str:
        """The ``make_loader(...)`` call that the recommendation comes down to. A URL is shown
        without its user, password and query (which may hold a signature), as in every message;
        a comment then says that they were left out, to be put back."""
        setting = self.best.setting
        options = "".join(f", {key}={_source(key, value)}" for key, value in self.options.items())
        prefetch = f", prefetch_factor={setting.prefetch_factor}" if setting.num_workers else ""
        shown = _redacted(self.data)
        left_out = "  # credentials (user, password, query) left out of the URL: put them back" if shown != self.data \
            else ""
        return f"pipeline.make_loader({shown!r}, num_workers={setting.num_workers}{prefetch}{options}){left_out}"

    def note(self, row: Measured, best: Measured | None) -> str:
        """Why a row is or is not the recommended one, where the table would not say."""
        if row.stopped_early:
            return "stopped early: clearly slower"
        if not self.fits(row):
            return f"over the {self.memory_mb:,.0f} MB budget"
        if row is best:
            return "recommended"
        if best is not None and row.samples_per_s > best.samples_per_s:  # near the fastest, lost on the tie-break
            mine, theirs = _preference(row), _preference(best)
            more = "holds more memory" if mine[0] > theirs[0] else "more workers" if mine[1] > theirs[1] else \
                "prefetches more"
            return f"within {NEAR:.0%} of the fastest, but {more}"
        return ""

    def table(self) -> str:
        """The settings measured, as a Markdown table, then what was not tried and why."""
        best = self._pick()
        stages = " / ".join(key.removesuffix("_s") for key in STAGES.values())
        header = ["num_workers", "prefetch_factor", "samples/s", "batch MB/s", "first batch s", "peak PSS MB",
                  "input-bound", f"workers' time: {stages}", "choice"]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in self.rows:
            cells = [str(r.setting.num_workers), str(r.setting.prefetch_factor or "-"), f"{r.samples_per_s:,.0f}",
                     "-" if r.mb_per_s is None else f"{r.mb_per_s:,.1f}",
                     "-" if r.first_batch_s is None else f"{r.first_batch_s:.2f}",
                     f"{r.peak_mb:,.0f}", f"{r.profile.get('input_bound', 0):.0%}" if self.step_ms else "-",
                     stage_shares(r.profile), self.note(r, best)]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines + ([""] + self.skipped if self.skipped else []))

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Save a chart of each setting's samples/s and peak memory as an image (PNG, or another
        kind that matplotlib saves, by the extension): the recommended bar green, those stopped
        early grey, those over the memory budget orange, the budget a dashed line."""
        plt = check_plot(path)
        labels = [f"w={r.setting.num_workers}" + (f"\np={r.setting.prefetch_factor}" if r.setting.num_workers else "")
                  for r in self.rows]
        figure, rate_axis = plt.subplots(figsize=(max(4, 1.2 * len(self.rows)), 4))
        best = self._pick()
        colours = ["tab:green" if r is best else "tab:grey" if r.stopped_early else
                   "tab:blue" if self.fits(r) else "tab:orange" for r in self.rows]
        rate_axis.bar(range(len(self.rows)), [r.samples_per_s for r in self.rows], color=colours)
        rate_axis.set_xticks(range(len(self.rows)), labels)
        rate_axis.set_ylabel("samples/s")
        memory_axis = rate_axis.twinx()
        memory_axis.plot(range(len(self.rows)), [r.peak_mb for r in self.rows], "o-", color="tab:red")
        if self.memory_mb is not None:
            memory_axis.axhline(self.memory_mb, linestyle="--", color="tab:red")
        memory_axis.set_ylabel("peak PSS MB", color="tab:red")
        memory_axis.set_ylim(bottom=0)
        shown = _redacted(self.data)
        rate_axis.set_title(f"{shown}: " + (f"recommended {best.setting}" if best else
                                            f"none within {self.memory_mb:,.0f} MB"))
        figure.tight_layout()
        figure.savefig(path)
        plt.close(figure)


def _preference(row: Measured) -> tuple[float, int, int]:
    """Among settings near the fastest, the least memory, then the fewest workers, then prefetch."""
    return row.peak_mb, row.setting.num_workers, row.setting.prefetch_factor or 0


def _source(key: str, value: Any) -> str:
    """Option ``key``'s value as the call would be written: a function by its name, else its
    repr where that is Python (a path's text: see :func:`_plain`); else (an object of the user's,
    a ``functools.partial``) the option's name, as the name of the user's variable that holds it."""
    name = getattr(value, "__qualname__", None)
    bound = not isinstance(getattr(value, "__self__", None), (type(None), types.ModuleType))  # (``d.get`` too)
    if callable(value) and not bound and isinstance(name, str) and \
            all(part.isidentifier() for part in name.split(".")):  # a function, or a class's (``Steps.scale``)
        return name
    value = _plain(value)
    try:
        tree = ast.parse(repr(value), mode="eval")
    except SyntaxError:
        return key
    if any(isinstance(node, ast.Constant) and node.value is Ellipsis for node in ast.walk(tree)):
        return key  # an elided repr (a long array's ``[0, 1, ..., 999]``) is Python, but not the value
    return repr(value)


def check_plot(path: str | os.PathLike[str]) -> Any:
    """matplotlib's pyplot, once it is known that a chart can be saved at ``path`` (its folder
    exists, matplotlib saves its kind): checked before measuring, so that a typo costs no run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("a plot needs matplotlib: pip install 'pipeline[plot]'") from exc
    folder = Path(path).parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{path}: no folder {folder}")
    kinds = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    suffix = Path(path).suffix
    if suffix[1:].lower() not in kinds:
        raise ValueError(f"{path}: matplotlib cannot save {suffix or 'no extension'}; give one of "
                         f"{', '.join('.' + kind for kind in sorted(kinds))}")
    return plt


def stage_shares(profile: Mapping[str, float]) -> str:
    """The workers' time (or, without workers, the loader's) split between the stages, in %."""
    stages = [profile.get(key, 0.0) for key in STAGES.values()]
    total = sum(stages)
    return " / ".join(f"{s / total:.0%}" for s in stages) if total else "-"


def tune(data: Sources, *, batch_size: int = 256, workers: Sequence[int] | None = None,
         prefetch: Sequence[int] | None = None, step_ms: float = 0.0, seconds: float = 3.0, warmup: float = 0.5,
         memory_mb: float | None = None, options: Mapping[str, Any] | None = None,
         progress: Callable[[str], None] | None = None) -> TuneResult:
    """Measure loader settings on ``data`` (what ``make_loader`` takes) and recommend one.

    ``workers``: a list of the numbers of workers to try (default: 0, 1, 2, 4, ... up to the usable
    cores); ``prefetch``: a list of the prefetch factors to try at the best of them (default: 1 and
    4, besides 2);
    ``step_ms``: a simulated training step per batch (a sleep: the CPU stays free, as while a GPU
    computes); ``seconds``/``warmup``: how long each setting is measured, after how long a warm-up
    from its first batch; ``memory_mb``: leave out settings whose peak memory (PSS of the process
    tree) is above it; ``options``: other ``make_loader`` options (``shuffle_buffer``,
    ``fields``, ``cache_dir``, ``batch_transform``...; not ``num_workers`` or ``prefetch_factor``,
    which are what is tried). Each setting runs in a process started with spawn, which gets the
    options pickled: a transform must be a function defined at the top level of a module or of the
    script (whose ``tune`` call then sits under ``if __name__ == "__main__":``), as for DataLoader
    workers started with spawn. ``progress`` is told of each setting as it is measured, and of
    settings not tried."""
    if not (math.isfinite(seconds) and seconds > 0 and math.isfinite(warmup) and warmup >= 0
            and math.isfinite(step_ms) and step_ms >= 0):
        raise ValueError(f"seconds must be finite and > 0, warmup and step_ms finite and >= 0; got seconds={seconds}, "
                         f"warmup={warmup}, step_ms={step_ms}")
    if memory_mb is not None and not (math.isfinite(memory_mb) and memory_mb > 0):
        raise ValueError(f"memory_mb must be finite and > 0; got {memory_mb}")
    _check_grid("workers", "the numbers of workers", workers, 0)
    _check_grid("prefetch", "the prefetch factors", prefetch, 1)
    for key, name in VARIED.items():
        if key in (options or {}):
            raise ValueError(f"options: {key} is what tune varies: give the values to try as {name}=[...]")
    for location in data.values() if isinstance(data, Mapping) else [data]:  # a mix: each of its sources
        resolve_shards(location)  # data that is not there is told as itself, before a measuring process starts
    if "batch_size" in (options or {}):
        raise ValueError("options: batch_size is an argument of tune's own: give it as batch_size=")
    options = {"batch_size": batch_size, **(options or {})}
    pickled_options(options)  # one that cannot reach the measuring process is named before any starts
    make_loader(data, num_workers=0, **options)  # (bad options are told here, each as itself, not by each setting)
    result = TuneResult(data, dict(options), [], memory_mb, step_ms)
    rows = result.rows

    def run(setting: Setting) -> Measured:
        best = max((r.samples_per_s for r in rows if result.fits(r)), default=0.0)
        row = measure(data, setting, options, seconds=seconds, warmup=warmup, step_ms=step_ms,
                      give_up_below=GIVE_UP * best if best else None)
        rows.append(row)
        if progress is not None:
            progress(f"{setting}: {row.samples_per_s:,.0f} samples/s, peak {row.peak_mb:,.0f} MB"
                     + (" (stopped early: clearly slower)" if row.stopped_early else ""))
        return row

    counts = worker_counts(usable_cores()) if workers is None else sorted({int(n) for n in workers})
    swept = [run(Setting(n, DEFAULT_PREFETCH if n else None)) for n in counts]
    factors = [1, 4] if prefetch is None else sorted({int(n) for n in prefetch} - {DEFAULT_PREFETCH})
    with_workers = [r for r in swept if r.setting.num_workers and result.fits(r)]
    if with_workers:
        top = max(with_workers, key=lambda r: r.samples_per_s).setting
        for factor in factors:
            run(Setting(top.num_workers, factor))
    elif factors and any(r.setting.num_workers for r in swept):  # said, not silent: the table lacks their rows
        result.skipped.append(f"prefetch_factor {' and '.join(map(str, factors))} not tried: "
                              f"{_none_fitted([r for r in swept if r.setting.num_workers], memory_mb)}")
        if progress is not None:
            progress(result.skipped[-1])
    return result


def _none_fitted(rows: list[Measured], memory_mb: float | None) -> str:
    """Why none of ``rows`` (settings with workers) could be recommended."""
    if memory_mb is not None and all(r.peak_mb > memory_mb for r in rows):
        return f"no setting with workers ran within {memory_mb:,.0f} MB"
    if all(r.stopped_early for r in rows):
        return "every setting with workers was stopped early"
    return f"every setting with workers was stopped early or over the {memory_mb:,.0f} MB budget"


def _check_grid(name: str, what: str, values: Any, least: int) -> None:
    """A list of values to try. A single number is refused, not taken as a list of one: ``workers=4``
    could as well mean up to 4."""
    if values is None:
        return
    if isinstance(values, (int, float, str)):
        raise ValueError(f"{name}= takes a list of {what} to try, e.g. {name}=[{values}]; got {values!r}")
    if name == "workers" and not values:  # (no other prefetch factors than 2 is a choice; no workers none)
        raise ValueError("workers= is empty: give the numbers of workers to try, e.g. workers=[0, 2], or leave it "
                         "out for 0, 1, 2, 4, ... up to the cores you may use")
    if any(isinstance(n, bool) or not isinstance(n, Integral) or n < least for n in values):
        raise ValueError(f"{what} must be whole numbers >= {least}, got {list(values)}")


def _redacted(data: Any) -> Any:
    """``data`` (a location, a list of them, or a mix's mapping of them) with each URL redacted."""
    return _each_location(data, lambda location: redact(location) if isinstance(location, str) else location)


def _plain(data: Any) -> Any:
    """``data`` as a call writes it: a path as its text, also in a dict, list or tuple (its repr,
    ``PosixPath('...')``, names nothing after ``import pipeline``)."""
    return _each_location(data, lambda location: os.fspath(location) if isinstance(location, os.PathLike) else location)


def _each_location(data: Any, change: Callable[[Any], Any]) -> Any:
    """``data`` with ``change`` applied to each location in it: ``data`` itself, or the values of a
    mix's mapping, or the items of a list or tuple (of the types they were)."""
    if isinstance(data, Mapping):
        return {name: _each_location(location, change) for name, location in data.items()}
    if isinstance(data, list) or type(data) is tuple:
        return type(data)(_each_location(location, change) for location in data)
    return change(data)
