"""Train the example model on shards: one linear layer from the features to the outputs.

This is the classic "streaming from disk" recipe, corrected. It trains on what users have:
the features ``x`` (any numeric dtype and shape) are flattened and cast to float32; labels
``y`` that are integers (or floats holding whole numbers, as the joblib batch recipe stores
them, or one-hot rows) are classes (``CrossEntropyLoss``, validation accuracy), other real-valued labels a
regression (``MSELoss``, validation RMSE); it says which it chose. Each epoch trains on
``DATA/train`` and evaluates on ``DATA/validation`` (``--train-split``, ``--validation-split``
for other names), printing loss, the validation metric, samples/s and the input-bound
fraction (the share of time the loop waited for data). CUDA is used when present (pinned
memory, copies on a side stream), DDP when started by ``torchrun`` (gloo on CPU, NCCL on GPUs).

    python scripts/train.py --data shards --epochs 3
    torchrun --nproc-per-node 2 scripts/train.py --data shards
    python scripts/train.py --data shards --checkpoint ckpt.pt            # save every epoch
    python scripts/train.py --data shards --checkpoint ckpt.pt --resume   # continue it
    python scripts/train.py --data s3://bucket/shards --cache-dir /scratch/cache  # epochs 2+ from disk
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm
from train_checkpoint import CannotResume, resume, save_checkpoint  # scripts/, beside this file
from train_task import Task, UnusableData, choose_task, split_location

from pipeline import DevicePrefetcher, FormatError, SourceError, WorkerError, make_loader


def whole_number(least: int):
    """An argparse type: a whole number of at least ``least``."""
    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least {least}")
        return value
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="train.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="shards",
                        help="folder or URL (s3://..., https://...) holding one shard set per split")
    parser.add_argument("--train-split", default="train", help="the split to train on (default: train)")
    parser.add_argument("--validation-split", default="validation",
                        help="the split to evaluate on (default: validation)")
    parser.add_argument("--epochs", type=whole_number(1), default=3)
    parser.add_argument("--batch-size", type=whole_number(1), default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--workers", type=whole_number(0), default=2, help="DataLoader workers per rank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--classes", type=whole_number(1),
                        help="number of classes (default: the largest label of both splits + 1)")
    parser.add_argument("--task", choices=("auto", "classification", "regression"), default="auto",
                        help="what to train; auto (default) chooses from the labels (see above)")
    parser.add_argument("--checkpoint", type=Path, help="save model, optimizer and loader state here")
    parser.add_argument("--checkpoint-every", type=whole_number(1), help="also save every N batches")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--stop-after", type=whole_number(1),
                        help="stop after N training batches (after saving a checkpoint): simulates a crash")
    parser.add_argument("--cache-dir", type=Path,
                        help="keep remote shards in this folder after their first read (epochs 2+ read it)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when present)")
    parser.add_argument("--threads", type=whole_number(1), default=1,
                        help="torch threads on CPU (the example model is tiny: more threads only add overhead)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--result", type=Path, help="write the final metrics here as JSON")
    args = parser.parse_args(argv)
    if args.checkpoint is None:
        for option, given in (("--resume", args.resume), ("--checkpoint-every", args.checkpoint_every),
                              ("--stop-after", args.stop_after)):
            if given:
                parser.error(f"{option} needs --checkpoint FILE: the checkpoint to "
                             f"{'continue from' if option == '--resume' else 'save'}")
    elif args.resume and not args.checkpoint.is_file():
        parser.error(f"--resume: no checkpoint at {args.checkpoint}; leave out --resume to start afresh "
                     f"(--checkpoint {args.checkpoint} saves one there)")
    elif not args.checkpoint.parent.is_dir():  # (found at the first save, the epoch trained would be lost)
        parser.error(f"--checkpoint {args.checkpoint}: no folder {args.checkpoint.parent} to save it in; make it "
                     f"first, or give a path in a folder that exists")
    return args


def setup_distributed(device: torch.device) -> tuple[int, int]:
    """Join the process group when started by torchrun; return (rank, world size)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def evaluate(model: nn.Module, loader: Iterable[dict], task: Task, split: str,
             device: torch.device) -> tuple[float, int]:
    """The sum of the validation metric's terms (correct predictions, or squared errors) over
    ``split`` and the samples seen on this rank."""
    model.eval()
    total, seen = 0.0, 0
    with torch.no_grad():
        for batch in DevicePrefetcher(loader, device):
            total += task.score(model(task.inputs(batch)), task.targets(batch))
            seen += len(batch["x"])
    model.train()
    return total, seen


# The tensors all_sum reduces, one per length, kept for the whole run (see all_sum).
_REDUCED: dict[int, torch.Tensor] = {}


def all_sum(values: list[float], device: torch.device) -> list[float]:
    """The sums of ``values`` over the ranks.

    The tensor reduced lives on after the call. A temporary one, dropped here while a gloo thread
    still held it, would be freed on that thread, which then makes itself a Python thread state;
    a DataLoader worker forked at that instant (the evaluation's loader starts its workers right
    after) hangs before it runs a line, on Python 3.11.0-3.11.7 and 3.12.0 (CPython gh-112275)."""
    if not (dist.is_available() and dist.is_initialized()):
        return values
    if len(values) not in _REDUCED:
        _REDUCED[len(values)] = torch.zeros(len(values), dtype=torch.float64, device=device)
    tensor = _REDUCED[len(values)]
    tensor.copy_(torch.tensor(values, dtype=torch.float64))
    dist.all_reduce(tensor)
    return tensor.tolist()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    rank, world = setup_distributed(device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)

    train_data = split_location(args.data, args.train_split, "--train-split")
    val_data = split_location(args.data, args.validation_split, "--validation-split")
    task = choose_task(train_data, val_data, args.classes, args.task)
    if rank == 0:
        print(f"task: {task.description}", file=sys.stderr)
    module = nn.Linear(task.features, task.outputs).to(device)
    model = nn.parallel.DistributedDataParallel(module) if world > 1 else module
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    cache = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    train_loader = make_loader(train_data, num_workers=args.workers, batch_size=args.batch_size,
                               seed=args.seed, fields=["x", "y"],
                               batch_transform=functools.partial(task.checked, split=args.train_split), **cache)
    val_loader = make_loader(val_data, num_workers=args.workers, batch_size=4096,
                             shuffle=False, remainder="keep", fields=["x", "y"],
                             batch_transform=functools.partial(task.checked, split=args.validation_split), **cache)
    epoch_so_far = (0.0, 0.0)  # the loss summed over the samples a resumed epoch trained on, and their number
    if args.resume:
        epoch_so_far = resume(args.checkpoint, module, optimizer, train_loader, device)
        if rank != 0:  # (the checkpoint holds the sums of every rank: counted once)
            epoch_so_far = (0.0, 0.0)
        if rank == 0:
            print(f"resumed from {args.checkpoint} at epoch {train_loader.epoch}", file=sys.stderr)
            if train_loader.epoch >= args.epochs:
                done = f"{train_loader.epoch} epoch{'s' if train_loader.epoch != 1 else ''}"
                print(f"{args.checkpoint} has trained {done} already: nothing to do; give "
                      f"--epochs {train_loader.epoch + 1} or more to train on", file=sys.stderr)

    metrics: dict[str, float] = {}
    batches_run = 0
    while train_loader.epoch < args.epochs:
        epoch = train_loader.epoch
        prefetcher = DevicePrefetcher(train_loader, device)
        profile_before = train_loader.stats()
        started = time.perf_counter()
        loss_sum, samples = epoch_so_far
        epoch_so_far, samples_before = (0.0, 0.0), samples
        stop = False
        bar = tqdm(total=len(train_loader), initial=len(train_loader) - train_loader.batches_left(),
                   desc=f"epoch {epoch}", unit=" batches", file=sys.stderr,
                   disable=args.quiet or rank != 0 or not sys.stderr.isatty())
        for batch in prefetcher:
            optimizer.zero_grad(set_to_none=True)
            loss = task.loss(model(task.inputs(batch)), task.targets(batch))
            loss.backward()
            optimizer.step()
            loss_sum += float(loss.detach()) * len(batch["x"])
            samples += len(batch["x"])
            batches_run += 1
            bar.update(1)
            stop = bool(args.stop_after and batches_run >= args.stop_after)
            if not prefetcher.batches_left():
                continue  # the epoch's last batch: the epoch's end (evaluation, its line, its checkpoint) comes first
            if stop or (args.checkpoint_every and batches_run % args.checkpoint_every == 0):
                so_far = all_sum([loss_sum, samples], device)  # (every rank is here: the same batches_run)
                if rank == 0:
                    save_checkpoint(args.checkpoint, module, optimizer, prefetcher.state_dict(), so_far)
            if stop:
                bar.close()
                return stopped(batches_run, args.checkpoint, rank, world)
        bar.close()
        elapsed = time.perf_counter() - started
        loss_sum, samples, samples_run = all_sum([loss_sum, samples, samples - samples_before], device)
        score, seen = all_sum(list(evaluate(model, val_loader, task, args.validation_split, device)), device)
        stats = prefetcher.stats()
        profile = {key: value - profile_before[key] for key, value in train_loader.stats().items()
                   if key.endswith("_s")}
        metrics = {"epoch": epoch, "train_loss": loss_sum / max(samples, 1), "val_samples": seen,
                   "train_samples": samples, "samples_per_s": samples_run / elapsed, "input_bound": stats["input_bound"],
                   "profile": profile}
        if task.classes:
            metrics["val_accuracy"] = score / max(seen, 1)
            shown = f"validation accuracy {metrics['val_accuracy']:.2%}"
        else:
            metrics["val_rmse"] = math.sqrt(score / max(seen * task.outputs, 1))
            shown = f"validation RMSE {metrics['val_rmse']:.4f}"
        if rank == 0:
            print(f"epoch {epoch}: train loss {metrics['train_loss']:.4f}, {shown} ({int(seen)} samples), "
                  f"{metrics['samples_per_s']:,.0f} samples/s, input-bound {metrics['input_bound']:.0%}")
            print(f"  input stages (s, summed over workers): {profile_line(profile)}", file=sys.stderr)
        if args.checkpoint and rank == 0:
            save_checkpoint(args.checkpoint, module, optimizer, train_loader.state_dict())
        if stop:
            return stopped(batches_run, args.checkpoint, rank, world)
    if rank == 0 and args.result:
        args.result.write_text(json.dumps({**metrics, "task": "classification" if task.classes else "regression",
                                           "weights_sum": float(sum(p.detach().double().sum() for p in module.parameters()))}))
    if world > 1:
        dist.destroy_process_group()
    return 0


def stopped(batches_run: int, checkpoint: Path, rank: int, world: int) -> int:
    """End a run that --stop-after cut short, its checkpoint saved."""
    if rank == 0:
        print(f"stopped after {batches_run} batches, checkpoint in {checkpoint}", file=sys.stderr)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def profile_line(profile: dict[str, float]) -> str:
    """An epoch's per-stage profile (``loader.stats()``'s seconds) in a line."""
    names = {"storage_s": "storage", "decode_s": "decode", "gather_s": "gather", "transform_s": "transform",
             "handover_s": "handover", "wait_s": "loop waited", "step_s": "loop ran"}
    return ", ".join(f"{label} {profile[key]:.2f}" for key, label in names.items())


if __name__ == "__main__":
    # ``kill -USR1 PID`` prints every thread's stack (DataLoader workers inherit it): where a stuck job waits
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        sys.exit(main())
    except WorkerError as exc:  # a dead DataLoader worker: a message, not a traceback from wherever it surfaced
        sys.exit(f"train.py: {exc}\nWith --checkpoint, --resume continues from the last checkpoint exactly.")
    except (UnusableData, FormatError, SourceError, CannotResume) as exc:  # data it cannot train on, a split
        # not there, a checkpoint it cannot continue
        sys.exit(f"train.py: {exc}")
