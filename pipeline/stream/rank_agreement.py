"""Ranks that read the same shards must draw the same order and cut it alike: a check through
torch.distributed's store.

Each rank cuts its span out of the epoch's shuffled sequence, so the ranks' spans are disjoint only
if every rank draws the same sequence from the same seed. A rank seeded ``seed + rank`` (a common
habit, right for augmentation) draws its own order instead, and the spans overlap: some samples
come twice in an epoch, a quarter of them never, and nothing fails. Ranks that batch differently
(a batch size, ``drop_last``, ``remainder`` of their own) or shuffle on one rank only yield other
numbers of batches, or overlap, and a DDP job then dies in its collective calls with a message
about a peer's connection, naming nothing. So a dataset whose world is that of the initialised
default process group records its settings in that group's store, under a key made of its
sources' digests (and a mix's names), world size and launch attempt (an elastic restart may
change them), and the line of the script that made it, and compares them with the first
recorded there (``compare_set`` sets the key only if absent and returns what it holds: one
request a rank, no waiting, so a rank alone cannot hang on it). The n-th such dataset of a rank
pairs with the n-th of another. The rank that finds other
settings raises; torchrun then stops the job. ``shuffle_buffer`` beyond the chunking cannot make
spans overlap and is not compared, nor is the seed when ``shuffle=False`` (no seed is used).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from typing import TYPE_CHECKING

import torch

from ..caller_warning import user_line
from .loader_state import plan_values

if TYPE_CHECKING:
    from .dataset import ShardDataset

log = logging.getLogger("pipeline.stream")
#: Datasets this process made of each key: the n-th of one rank pairs with the n-th of another.
_MADE: Counter[str] = Counter()
#: What every rank must agree on besides the seed: what shapes a rank's span, and its batches
#: (``mix``: the samples each source of a mix gives an epoch, from ``weights`` and ``epoch_samples``).
_AGREED_KEYS = ("shuffle", "samples", "mix", "chunk_samples", "remainder", "batch_size", "drop_last")


def check_ranks_agree(dataset: ShardDataset) -> None:
    """Raise ``ValueError`` if another rank of the default process group reads the same shards
    with other settings (see :data:`_AGREED_KEYS`) or, shuffled, from another seed, of the
    datasets made at the same line of the script, so that one a rank makes alone
    elsewhere (a look at a few batches on rank 0) pairs with none of the others; nothing
    without an initialised group of 2 ranks or more, a dataset whose world size is another, or
    shards without an index."""
    group = torch.distributed
    if not (group.is_available() and group.is_initialized()) or not dataset.exact \
            or dataset.world_size < 2 or dataset.world_size != group.get_world_size():
        return  # (a world of its own: an evaluation on rank 0 alone, say; no peers in this group)
    try:
        plan = plan_values(dataset)
        data = [plan.get("sources"), list(plan.get("mix") or ())]  # (a mix's names, not its shares: compared)
        attempt = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '')}"
        digest = hashlib.sha256(json.dumps([attempt, dataset.world_size, data, user_line()], default=str).encode())
        key = digest.hexdigest()[:24]
        _MADE[key] += 1
        mine = json.loads(json.dumps({"rank": dataset.rank, "seed": int(dataset.seed),
                                      **{name: plan.get(name) for name in _AGREED_KEYS}}, default=str))
        first = json.loads(group.distributed_c10d._get_default_store().compare_set(
            f"pipeline/plan/{key}/{_MADE[key]}", "", json.dumps(mine)))
    except Exception as exc:  # noqa: BLE001 - a store that cannot answer: the check is a help, not a need
        log.debug("the ranks' settings were not compared (%s: %s)", type(exc).__name__, exc)
        return
    differ = [name for name in _AGREED_KEYS if first.get(name) != mine[name]]
    if differ:
        shown = ", ".join(f"{name}={mine[name]!r}" for name in differ)
        theirs = ", ".join(f"{name}={first.get(name)!r}" for name in differ)
        mix = " (mix: the samples each source gives an epoch, from weights= and epoch_samples=)" if "mix" in differ \
            else ""
        raise ValueError(f"rank {dataset.rank} reads these shards with {shown}, rank {first['rank']} with {theirs}{mix}: "
                         f"every rank must read them alike, or ranks yield other numbers of batches (a DDP job then "
                         f"stops in its collective calls) or overlapping samples. Pass the same settings on every "
                         f"rank")
    if dataset.shuffle and first["seed"] != int(dataset.seed):
        raise ValueError(f"rank {dataset.rank} shuffles these shards with seed={int(dataset.seed)}, rank "
                         f"{first['rank']} with seed={first['seed']}: every rank must draw the same epoch order, or "
                         f"their parts of it overlap (samples twice in an epoch, others never). Pass the same seed "
                         f"on every rank (seed=base, not base + rank; seed augmentation per rank in your transforms)")
