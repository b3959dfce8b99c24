"""Shard names kept as numbered runs, so a million names cost a few bytes.

Builds name shards ``<prefix>-000000.tar``, ``<prefix>-000001.tar``... so the index stores the
names as brace ranges (``train-{000000..999999}.tar``, the notation webdataset users already
know) and expands one name at a time on demand. Names that do not form a run (a merge of
folders, hand-made lists) are kept literally, one entry each.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence, TypeVar, overload

from .errors import IndexFormatError

T = TypeVar("T")
_NUMBERED = re.compile(r"^(.*?)(\d+)([^\d]*)$")
_RANGE = re.compile(r"^(.*)\{(\d+)\.\.(\d+)\}(.*)$")


@dataclass(frozen=True)
class NameRun:
    """``count`` names ``prefix + str(start + i).zfill(width) + suffix`` (``width=0``: one
    literal name, ``prefix``)."""

    prefix: str
    start: int = 0
    width: int = 0
    suffix: str = ""
    count: int = 1

    def name(self, i: int) -> str:
        if not self.width:
            return self.prefix
        return f"{self.prefix}{self.start + i:0{self.width}d}{self.suffix}"

    def follows(self, other: "NameRun") -> bool:
        """Whether this run continues ``other`` (same pattern, next number)."""
        return (bool(self.width) and self.width == other.width and self.prefix == other.prefix
                and self.suffix == other.suffix and other.start + other.count == self.start)

    def to_json(self) -> str:
        if self.count == 1:
            return self.name(0)
        last = self.start + self.count - 1
        return f"{self.prefix}{{{self.start:0{self.width}d}..{last:0{self.width}d}}}{self.suffix}"

    @classmethod
    def from_json(cls, text: str, where: str) -> "NameRun":
        match = _RANGE.match(text)
        if match is None:
            return cls.literal(text)
        prefix, first, last, suffix = match.groups()
        if len(first) != len(last) or int(last) < int(first):
            raise IndexFormatError(f"{where}: bad shard name range {text!r}")
        return cls(prefix, int(first), len(first), suffix, int(last) - int(first) + 1)

    @classmethod
    def literal(cls, name: str) -> "NameRun":
        """One name, as a run of one when it ends in a number (so that it can join others)."""
        if "{" in name or "}" in name:
            raise IndexFormatError(f"shard name {name!r}: braces are reserved for name ranges")
        match = _NUMBERED.match(name)
        if match is None:
            return cls(name)
        prefix, digits, suffix = match.groups()
        return cls(prefix, int(digits), len(digits), suffix, 1)

    def renamed(self, change: Callable[[str], str]) -> "NameRun":
        """The run with ``change`` applied to its folder part (e.g. made relative elsewhere)."""
        if not self.width:
            return NameRun(change(self.prefix))
        folder, _, stem = self.prefix.rpartition("/")
        new_folder = change(folder or ".")
        prefix = stem if new_folder in ("", ".") else f"{new_folder}/{stem}"
        return NameRun(prefix, self.start, self.width, self.suffix, self.count)


class LazySequence(Sequence[T]):
    """A sequence whose items are made on demand by :meth:`item` (a valid, non-negative index)."""

    def item(self, i: int) -> T:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> list[T]: ...

    def __getitem__(self, i: int | slice) -> T | list[T]:
        if isinstance(i, slice):
            return [self.item(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"shard {i} of {len(self)}")
        return self.item(i)

    def __iter__(self) -> Iterator[T]:
        return (self.item(i) for i in range(len(self)))


class ShardNames(LazySequence[str]):
    """A sequence of shard names stored as runs."""

    def __init__(self, runs: Iterable[NameRun]) -> None:
        self.runs: list[NameRun] = []
        for run in runs:  # adjoining runs are joined (e.g. the parts of one build)
            if self.runs and run.follows(self.runs[-1]):
                last = self.runs[-1]
                self.runs[-1] = NameRun(last.prefix, last.start, last.width, last.suffix, last.count + run.count)
            else:
                self.runs.append(run)
        self._ends: list[int] = []
        total = 0
        for run in self.runs:
            total += run.count
            self._ends.append(total)

    @classmethod
    def of(cls, names: Iterable[str]) -> "ShardNames":
        """Compress explicit names into runs of consecutive, equally padded numbers."""
        return cls(NameRun.literal(name) for name in names)

    @classmethod
    def concat(cls, parts: Iterable["ShardNames"]) -> "ShardNames":
        """The names of several shard sets, in order."""
        return cls(run for names in parts for run in names.runs)

    @classmethod
    def from_json(cls, data: object, count: int, where: str) -> "ShardNames":
        if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
            raise IndexFormatError(f"{where}: 'names' must be a list of shard names or name ranges")
        names = cls(NameRun.from_json(text, where) for text in data)
        if len(names) != count:
            raise IndexFormatError(f"{where}: {len(names)} shard names for {count} shards")
        return names

    def to_json(self) -> list[str]:
        return [run.to_json() for run in self.runs]

    def renamed(self, change: Callable[[str], str]) -> "ShardNames":
        """The names with ``change`` applied to their folder part."""
        return ShardNames(run.renamed(change) for run in self.runs)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def item(self, i: int) -> str:
        run = bisect.bisect_right(self._ends, i)
        return self.runs[run].name(i - (self._ends[run] - self.runs[run].count))
