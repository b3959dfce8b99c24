"""Run under torchrun by test_distributed.py: each rank streams one epoch and writes the sample
numbers of each batch it received (field ``i``, or the one given) to OUT/rank-<r>.json. A fifth
argument ``seed-per-rank`` seeds each rank's loader ``5 + rank``, ``batch-per-rank`` gives it batches of
``32 + 16 * rank``, ``weights-per-rank`` mixes the set with itself in shares of its own (mistakes the
loader catches); ``peek-on-rank-0`` makes rank 0 look at a batch of a loader of its own first (no
mistake)."""

import faulthandler
import json
import signal
import sys
from pathlib import Path

import torch.distributed as dist

from pipeline import make_loader


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks a stuck job for its stacks
    shards, out, workers = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    field = sys.argv[4] if len(sys.argv) > 4 else "i"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    variant = sys.argv[5] if len(sys.argv) > 5 else ""
    seed = 5 + rank if variant == "seed-per-rank" else 5
    batch_size = 32 + 16 * rank if variant == "batch-per-rank" else 32
    if variant == "peek-on-rank-0" and rank == 0:
        next(iter(make_loader(shards, num_workers=0, batch_size=4)))
    source, options = shards, {}
    if variant == "weights-per-rank":
        source, options = {"a": shards, "b": shards}, {"weights": {"a": 0.5 + 0.2 * rank, "b": 0.5 - 0.2 * rank}}
    loader = make_loader(source, num_workers=workers, batch_size=batch_size, seed=seed, shuffle_buffer=300, **options)
    batches = [batch[field].tolist() for batch in loader]
    dist.barrier()  # every rank must get here: no rank waits for batches that never come
    (out / f"rank-{rank}.json").write_text(json.dumps({"batches": batches, "len": len(loader)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
