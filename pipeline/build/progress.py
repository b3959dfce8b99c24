"""Progress bar and final summary of a build (samples/s and MB/s), silent when ``quiet``."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class BuildProgress:
    """A tqdm bar counting samples, with the bytes written as MB/s beside it."""

    def __init__(self, total_samples: int | None, description: str, quiet: bool = False) -> None:
        self.quiet = quiet
        self.started = time.perf_counter()
        self.samples = 0
        self.bytes = 0
        self.shards = 0
        self._bar = tqdm(total=total_samples, desc=description, unit=" samples", unit_scale=True,
                         disable=quiet, file=sys.stderr, dynamic_ncols=True)

    def update(self, samples: int, nbytes: int, shards: int = 1) -> None:
        self.samples += samples
        self.bytes += nbytes
        self.shards += shards
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        self._bar.set_postfix_str(f"{self.bytes / elapsed / 1e6:.1f} MB/s, {self.shards} shards", refresh=False)
        self._bar.update(samples)

    def close(self, destination: str) -> str:
        """Close the bar; return (and unless quiet, print) a one-line summary."""
        self._bar.close()
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        line = (f"wrote {self.samples} samples in {self.shards} shards, {self.bytes / 1e6:.1f} MB, "
                f"in {elapsed:.2f} s ({self.samples / elapsed:,.0f} samples/s, "
                f"{self.bytes / elapsed / 1e6:.1f} MB/s) -> {destination}")
        if not self.quiet:
            print(line, file=sys.stderr)
        return line
