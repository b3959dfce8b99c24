"""Ranks that read the same shards must plan alike: a check through torch.distributed's store.

Each rank cuts its span out of the epoch's shuffled sequence, so the ranks' spans are disjoint only
if every rank draws the same sequence: the same seed, batch size, shuffle buffer, ... A rank
seeded ``seed + rank`` (a common habit, right for augmentation) draws its own order instead, and
the spans overlap: some samples come twice in an epoch, a quarter of them never, and nothing
fails. So a dataset whose rank and world size are those of the initialised default process group
records its plan in that group's store under a key made of its sources' digests, and compares
its own with the first one recorded there (``compare_set`` sets the key only if absent and returns
what it holds: one request a rank, no waiting, so a rank alone cannot hang on it). The rank that
finds another plan raises; torchrun then stops the job.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

import torch

from .loader_state import plan_values

if TYPE_CHECKING:
    from .dataset import ShardDataset

log = logging.getLogger("pipeline.stream")
#: Datasets this process made of each set of sources: the n-th of one rank pairs with the n-th of another.
_MADE: Counter[str] = Counter()


def check_ranks_agree(dataset: ShardDataset) -> None:
    """Raise ``ValueError`` if another rank of the default process group reads the same sources
    with another plan (seed, batch size, ...); nothing without an initialised group of 2 ranks
    or more, a dataset whose world size is another, or shards without an index."""
    group = torch.distributed
    if not (group.is_available() and group.is_initialized()) or not dataset.exact or dataset.world_size < 2:
        return
    if dataset.world_size != group.get_world_size():
        return  # its own world (an evaluation on rank 0 alone, say): no peers in this group
    plan = plan_values(dataset)
    sources = hashlib.sha256(json.dumps(plan.pop("sources")).encode()).hexdigest()[:16]
    _MADE[sources] += 1
    key = f"pipeline/plan/{sources}/{_MADE[sources]}"
    mine = json.dumps({"rank": dataset.rank, "plan": plan}, sort_keys=True)
    try:
        first = json.loads(group.distributed_c10d._get_default_store().compare_set(key, "", mine))
    except Exception as exc:  # noqa: BLE001 - a store that cannot answer: the check is a help, not a need
        log.debug("the ranks' plans were not compared (%s: %s)", type(exc).__name__, exc)
        return
    differ = [name for name in plan if first["plan"].get(name) != plan[name]]
    if differ:
        raise ValueError(_disagreement(dataset.rank, plan, first["rank"], first["plan"], differ))


def _disagreement(rank: int, plan: dict[str, Any], other: int, theirs: dict[str, Any], differ: list[str]) -> str:
    settings = ", ".join(f"{name}={plan[name]!r}" for name in differ)
    others = ", ".join(f"{name}={theirs.get(name)!r}" for name in differ)
    return (f"rank {rank} reads these shards with {settings}, rank {other} with {others}: every rank must plan the "
            f"epoch alike, or their parts of it overlap (samples twice in an epoch, others never). Pass the same "
            f"values on every rank (seed=base, not base + rank; seed augmentation per rank in your transforms)")
