"""Run under torchrun by test_distributed.py: each rank streams one epoch and writes the sample
numbers of each batch it received (field ``i``, or the one given) to OUT/rank-<r>.json. A fifth
argument ``seed-per-rank`` seeds each rank's loader ``5 + rank``, ``batch-per-rank`` gives it batches of
``32 + 16 * rank`` (mistakes the loader catches)."""

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
    seed = 5 + rank if sys.argv[5:] == ["seed-per-rank"] else 5
    batch_size = 32 + 16 * rank if sys.argv[5:] == ["batch-per-rank"] else 32
    loader = make_loader(shards, num_workers=workers, batch_size=batch_size, seed=seed, shuffle_buffer=300)
    batches = [batch[field].tolist() for batch in loader]
    dist.barrier()  # every rank must get here: no rank waits for batches that never come
    (out / f"rank-{rank}.json").write_text(json.dumps({"batches": batches, "len": len(loader)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
