"""Run under torchrun by test_distributed.py: each rank streams one epoch and writes the sample
numbers of each batch it received to OUT/rank-<r>.json."""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from pipeline import make_loader


def main() -> None:
    shards, out, workers = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = make_loader(shards, num_workers=workers, batch_size=32, seed=5, shuffle_buffer=300)
    batches = [batch["i"].tolist() for batch in loader]
    dist.barrier()  # every rank must get here: no rank waits for batches that never come
    (out / f"rank-{rank}.json").write_text(json.dumps({"batches": batches, "len": len(loader)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
