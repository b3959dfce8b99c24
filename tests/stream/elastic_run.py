"""One rank of an elastic job, run by test_elastic.py under torchrun (or as a plain process with
RANK and WORLD_SIZE set): stream the epoch from a checkpoint (or its start), stop after a number
of batches (or at the epoch's end), and write the sample numbers of the batches received to
OUT/rank-<r>.json; rank 0 also writes the loader's state there.

    elastic_run.py SOURCES OUT WORKERS STOP [STATE]

SOURCES is a shard set, or a JSON mapping {name: shard set} mixed by the mixing tests' weights."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from pipeline import make_loader
from tests.stream.mixes import WEIGHTS


def main() -> None:
    sources, out, workers, stop = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    distributed = "MASTER_ADDR" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    mix = json.loads(sources) if sources.startswith("{") else None
    options = {"weights": {n: WEIGHTS[n] for n in mix}} if mix else {}
    loader = make_loader(mix or sources, num_workers=workers, batch_size=64, seed=11, shuffle_buffer=1000, **options)
    rank = loader.dataset.rank
    if len(sys.argv) > 5:
        loader.load_state_dict(torch.load(sys.argv[5], weights_only=True))
    length = loader.batches_left()  # (len() is the whole epoch on this world size)
    batches = []
    for batch in loader:
        batches.append(batch["i"].tolist())
        if len(batches) == stop:
            break
    if distributed:
        dist.barrier()  # every rank gets here: none waits for batches that never come
    if rank == 0:
        torch.save(loader.state_dict(), out / "state.pt")
    (out / f"rank-{rank}.json").write_text(json.dumps({"batches": batches, "len": length}))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
