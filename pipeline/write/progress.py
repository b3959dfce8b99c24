"""Progress and the final summary of a build (samples/s and MB/s), silent when ``quiet``.

On a terminal: a tqdm bar. Anywhere else (a log file, a cluster job's output): a plain line
every ``LOG_EVERY_S`` seconds, since a bar redrawn with carriage returns makes a log
unreadable. Either way the last line is a one-line summary, after a warning when there were no
samples at all: an empty input builds a valid, empty set, which a loader reads as nothing at
all, silently, so the build is where to notice.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

LOG_EVERY_S = 30.0


def on_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class BuildProgress:
    """Counts the samples and bytes of finished shards (and of shards a resumed build kept)."""

    def __init__(self, total_samples: int | None, description: str, quiet: bool = False,
                 stream: TextIO | None = None, verb: str = "wrote") -> None:
        self.quiet = quiet
        self.verb = verb  # what the summary says was done to the samples
        self.stream = stream or sys.stderr
        self.description = description
        self.total = total_samples
        self.started = self._logged = time.perf_counter()
        self.samples = self.bytes = self.shards = 0
        self.kept_samples = self.kept_shards = 0
        self._unfinished = 0  # samples of the shard being written, shown before it is counted
        self._bar = tqdm(total=total_samples, desc=description, unit=" samples", unit_scale=True,
                         file=self.stream, dynamic_ncols=True) if not quiet and on_terminal(self.stream) else None

    def update(self, samples: int, nbytes: int, shards: int = 1, kept: bool = False) -> None:
        """Count a finished shard (``kept``: one a resumed build found complete)."""
        if kept:
            self.kept_samples += samples
            self.kept_shards += shards
        else:
            self.samples += samples
            self.bytes += nbytes
            self.shards += shards
        shown, self._unfinished = samples - (0 if kept else self._unfinished), 0
        self._show(shown)

    def advance(self, samples: int) -> None:
        """Count samples of a shard still being written (by a build without workers), so that a
        long shard (15,000 files, say) moves the bar as it is read, not all at its end; the
        shard's :meth:`update` counts the rest of it."""
        self._unfinished += samples
        self._show(samples)

    def _show(self, samples: int) -> None:
        now = time.perf_counter()
        rate = f"{self.bytes / max(now - self.started, 1e-9) / 1e6:.1f} MB/s"
        if self._bar is not None:
            self._bar.set_postfix_str(f"{rate}, {self.shards + self.kept_shards} shards", refresh=False)
            self._bar.update(samples)
        elif not self.quiet and now - self._logged >= LOG_EVERY_S:
            self._logged = now
            done = self.samples + self.kept_samples + self._unfinished
            share = f" ({done / self.total:.0%})" if self.total else ""
            print(f"{self.description}: {done:,}{'/' + format(self.total, ',') if self.total else ''} samples"
                  f"{share}, {self.shards + self.kept_shards} shards, {rate}", file=self.stream, flush=True)

    def say(self, line: str) -> None:
        """Print ``line`` (unless quiet) on a line of its own, above the bar if there is one."""
        if self._bar is not None:
            tqdm.write(line, file=self.stream)
        elif not self.quiet:
            print(line, file=self.stream)

    def close(self, destination: str, whole: bool = True, note: str = "") -> str:
        """End the bar (so that what is printed next starts a line of its own); return (and
        unless quiet, print) a one-line summary ending with ``note`` (what else the build did),
        after a warning if there were no samples in a ``whole`` build (a part of one may fall on
        no shard)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        kept = (f" and kept {self.kept_shards} shards ({self.kept_samples} samples) that an earlier run finished"
                if self.kept_shards else "")
        line = (f"{self.verb} {self.samples} samples in {self.shards} shards{kept}, {self.bytes / 1e6:.1f} MB, "
                f"in {elapsed:.2f} s ({self.samples / elapsed:,.0f} samples/s, "
                f"{self.bytes / elapsed / 1e6:.1f} MB/s) -> {destination}")
        if self.kept_shards and not self.shards:  # (rates of nothing written say nothing)
            line = (f"kept {self.kept_shards} shards ({self.kept_samples} samples) that an earlier run finished; "
                    f"{self.verb} none -> {destination}")
        line += note
        if not self.quiet:
            if not self.samples + self.kept_samples and whole:  # (a part of a build may fall on no shard)
                print(f"warning: {self.verb} 0 samples ({self.description}): the set is empty, and a loader reading "
                      f"it yields nothing; is the input empty?", file=self.stream)
            print(line, file=self.stream)
        return line

    def abandon(self) -> None:
        """End the bar after a failure, so that the error is printed on a line of its own."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
