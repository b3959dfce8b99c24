"""A part of a build split across machines: which block of the planned shards it writes."""

from __future__ import annotations

from dataclasses import dataclass

from ..format.index import part_shard_range


@dataclass(frozen=True)
class Part:
    """Part ``index`` of ``count`` of a build split across machines (``--part index/count``)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        shown = f"{self.index}/{self.count}"
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (self.index, self.count)):
            raise TypeError(f"a part is two whole numbers, Part(I, N) (--part I/N), got Part({self.index!r}, "
                            f"{self.count!r})")
        if self.count < 1:
            raise ValueError(f"part {shown}: N is the number of parts, at least 1 (e.g. 0/4 to 3/4 for 4 parts)")
        if not 0 <= self.index < self.count:
            raise ValueError(f"part {shown}: parts count from 0, so the parts of {self.count} are 0/{self.count} to "
                             f"{self.count - 1}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> "Part":
        try:
            index, count = (int(v) for v in text.split("/"))
        except ValueError:
            raise ValueError(f"--part takes I/N (e.g. 0/4), got {text!r}") from None
        return cls(index, count)

    def shard_range(self, total: int) -> range:
        """The contiguous block of the ``total`` planned shards that this part writes."""
        return part_shard_range(total, self.index, self.count)
