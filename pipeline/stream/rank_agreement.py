"""Ranks that read the same shards must draw the same order: a check through torch.distributed's store.

Each rank cuts its span out of the epoch's shuffled sequence, so the ranks' spans are disjoint only
if every rank draws the same sequence from the same seed. A rank seeded ``seed + rank`` (a common
habit, right for augmentation) draws its own order instead, and the spans overlap: some samples
come twice in an epoch, a quarter of them never, and nothing fails. So a shuffled dataset whose
world is that of the initialised default process group records its seed in that group's store,
under a key made of everything else that shapes its sequence (its sources' digests, chunking,
samples, remainder, shares, world size) and of the launch attempt (an elastic restart may change
them), and compares its seed with the first one recorded there (``compare_set`` sets the key
only if absent and returns what it holds: one request a rank, no waiting, so a rank alone cannot
hang on it). The n-th such dataset of a rank pairs with the n-th of another. The rank that finds
another seed raises; torchrun then stops the job. Settings that cannot make spans overlap (batch
size, ``shuffle_buffer`` beyond the chunking) are not compared, nor is anything when
``shuffle=False`` (no seed is used).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from typing import TYPE_CHECKING

import torch

from .loader_state import plan_values

if TYPE_CHECKING:
    from .dataset import ShardDataset

log = logging.getLogger("pipeline.stream")
#: Datasets this process made of each key: the n-th of one rank pairs with the n-th of another.
_MADE: Counter[str] = Counter()
#: What shapes a rank's span besides the seed.
_SEQUENCE_KEYS = ("sources", "shuffle", "samples", "chunk_samples", "remainder", "mix")


def check_ranks_agree(dataset: ShardDataset) -> None:
    """Raise ``ValueError`` if another rank of the default process group shuffles the same epoch
    sequence from another seed; nothing without an initialised group of 2 ranks or more, a
    dataset whose world size is another, an unshuffled one, or shards without an index."""
    group = torch.distributed
    if not (group.is_available() and group.is_initialized()) or not dataset.exact or not dataset.shuffle \
            or dataset.world_size < 2 or dataset.world_size != group.get_world_size():
        return  # (a world of its own: an evaluation on rank 0 alone, say; no peers in this group)
    try:
        plan = plan_values(dataset)
        sequence = {name: plan.get(name) for name in _SEQUENCE_KEYS}
        attempt = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '')}"
        digest = hashlib.sha256(json.dumps([attempt, dataset.world_size, sequence], default=str).encode())
        key = digest.hexdigest()[:24]
        _MADE[key] += 1
        mine = json.dumps({"rank": dataset.rank, "seed": int(dataset.seed)})
        first = json.loads(group.distributed_c10d._get_default_store().compare_set(
            f"pipeline/plan/{key}/{_MADE[key]}", "", mine))
    except Exception as exc:  # noqa: BLE001 - a store that cannot answer: the check is a help, not a need
        log.debug("the ranks' seeds were not compared (%s: %s)", type(exc).__name__, exc)
        return
    if first["seed"] != int(dataset.seed):
        raise ValueError(f"rank {dataset.rank} shuffles these shards with seed={int(dataset.seed)}, rank "
                         f"{first['rank']} with seed={first['seed']}: every rank must draw the same epoch order, or "
                         f"their parts of it overlap (samples twice in an epoch, others never). Pass the same seed "
                         f"on every rank (seed=base, not base + rank; seed augmentation per rank in your transforms)")
