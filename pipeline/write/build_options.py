"""What a build refuses before it touches its output.

A split build checks them for every split before it retires the old splits (an ``--overwrite``
that a mistyped ``--dtype`` or engine stopped then would have removed the set it was to replace,
on S3 for good), and :func:`~pipeline.write.run.build_shards` before it writes anything.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor
from typing import Any, Mapping

from ..storage.opener import scheme
from .casting import parse_dtypes
from .engines import check_engine
from .output import check_prefix
from .part import Part
from .source import DEFAULT_SHARD_BYTES, check_limits, check_pack


def check_build_options(out_dir: str | os.PathLike[str], prefix: str = "shard", *, shard_samples: int | None = None,
                        shard_bytes: int | None = DEFAULT_SHARD_BYTES, pack: int | str = "auto",
                        dtypes: Mapping[str, str] | None = None, workers: int = 1, part: Part | None = None,
                        overwrite: bool = False, resume: bool = False, executor: Executor | None = None,
                        engine: str = "local", scheduler: str | None = None, **_: Any) -> None:
    """Raise for options :func:`~pipeline.write.run.build_shards` cannot build with (the others,
    ``quiet``, are no matter here)."""
    check_prefix(prefix)
    if part is not None and not isinstance(part, Part):
        raise TypeError(f"part takes pipeline.Part(I, N), part I of N counting from 0, e.g. Part(0, 4); got {part!r}")
    check_limits(shard_samples, shard_bytes, workers)
    check_engine(engine, scheduler, executor)
    check_pack(pack)
    if dtypes:
        parse_dtypes(dtypes)
    if resume and overwrite:
        raise ValueError("resume keeps what a killed build wrote, overwrite replaces it: give one of them")
    if resume and scheme(os.fspath(out_dir)) != "file":
        raise ValueError(f"{os.fspath(out_dir)}: resume works on local folders; build again with "
                         f"overwrite=True (--overwrite) instead, which writes every shard")
