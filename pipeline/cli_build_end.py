"""What the command line says when a local build ends before its index: how to finish it
(``--resume`` keeps the shards it finished) and, where ``--overwrite`` removed a set that was
there, that it is gone (a user may take overwrite to keep the old set until the new one is
done). It looks at the output folder (and its split folders) before and after the run, so that
it speaks of what this run did, not of a plan an earlier run left."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .format.index import INDEX_NAME
from .storage import is_remote

_CLOCK_TICK_NS = 10_000_000  # (file times come from a coarser clock than time.time_ns)


class BuildEnd:
    """The output folder of a build command, seen as the command starts."""

    def __init__(self, args: argparse.Namespace) -> None:
        build = hasattr(args, "resume") and not is_remote(str(args.out))
        self.out = Path(args.out) if build else None
        self.overwrite = bool(getattr(args, "overwrite", False))
        self.started_ns = time.time_ns() - _CLOCK_TICK_NS
        self.indexes = self._indexes()

    def _indexes(self) -> set[Path]:
        if self.out is None or not self.out.is_dir():
            return set()
        return {*self.out.glob(INDEX_NAME), *self.out.glob(f"*/{INDEX_NAME}")}

    def _plans(self) -> list[Path]:
        if self.out is None or not self.out.is_dir():
            return []
        return [*self.out.glob(".index*.plan.json"), *self.out.glob("*/.index*.plan.json")]

    def after_failure(self) -> str:
        """For a build that planned its shards in this run and then failed (an input to mend, say):
        how to finish it, on a line of its own; else nothing."""
        if not any(plan.stat().st_mtime_ns >= self.started_ns for plan in self._plans()):
            return ""
        removed = sorted(str(index.parent) for index in self.indexes - self._indexes())
        replaced = (f" (the set in {', '.join(removed)} was removed as this build began: --overwrite replaces it)"
                    if removed else "")
        return (f"\nthe build stopped part way{replaced}; once the cause is mended (an input, or an option the "
                f"error names), run the command again with --resume{self._instead()} to finish it, keeping the "
                f"shards it finished")

    def after_interrupt(self) -> str:
        """What finishes an interrupted build, in words to follow "interrupted"; nothing for other
        commands."""
        if self.out is None:
            return ""
        if not self._plans():  # stopped before its plan (and its first shard): an
            return ": run the same command again"  # old index may still be there, which --resume would take as done
        return f": run the same command with --resume{self._instead()} to finish the build, keeping the shards it finished"

    def _instead(self) -> str:
        return " in place of --overwrite" if self.overwrite else ""
