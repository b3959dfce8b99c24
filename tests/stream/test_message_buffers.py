"""Workers' messages in reused shared memory: reused only once the main process lets go of it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pipeline
from pipeline.stream import message_buffers
from pipeline.stream.batching import shared_empty
from pipeline.stream.message_buffers import SLOTS, Lent, ReleaseTable, WorkerBuffers

from .shardsets import uneven_shards


def shm_file(tensor: torch.Tensor) -> int:
    """The inode of the shared-memory file under ``tensor``."""
    return os.fstat(tensor.untyped_storage()._share_fd_cpu_()[0]).st_ino


def test_worker_messages_reuse_memory_the_main_process_let_go_and_no_other(tmp_path: Path) -> None:
    shards = uneven_shards(tmp_path, [700, 1300, 900, 1100, 1000, 1000], pack=16)
    loader = pipeline.make_loader(shards, num_workers=2, batch_size=64, shuffle_buffer=512, seed=3)
    held: list[tuple[dict, torch.Tensor, torch.Tensor]] = []  # batches kept past several later messages
    files, messages, changed = set(), set(), 0
    for _ in range(6):
        ids = []
        for batch in loader:
            ids.append(batch["i"].numpy().copy())
            storage = batch["x"].untyped_storage()
            if storage.data_ptr() not in messages:  # the first batch of a message
                messages.add(storage.data_ptr())
                files.add(shm_file(batch["x"]))
            held.append((batch, batch["x"].clone(), batch["i"].clone()))
            if len(held) > 20:  # 2-3 messages' batches held while the workers gather on
                old, x, i = held.pop(0)
                changed += not (torch.equal(old["x"], x) and torch.equal(old["i"], i))
        assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(6000))  # exactly once
        messages.clear()  # a freed message's address may come again: count per epoch
    changed += sum(not (torch.equal(b["x"], x) and torch.equal(b["i"], i)) for b, x, i in held)
    assert changed == 0  # no buffer was written while a batch of it was held
    assert len(files) <= 24  # 6 epochs of 12 messages each came in a few files, again and again


class KeepsBatches:
    """A batch transform that keeps its last 40 batches (a memory bank, say) and checks that
    none of them changes meanwhile."""

    def __init__(self) -> None:
        self.kept: list[tuple[dict, dict]] = []

    def __call__(self, batch: dict) -> dict:
        self.kept.append((batch, {name: value.clone() for name, value in batch.items()}))
        if len(self.kept) > 40:
            old, copy = self.kept.pop(0)
            if not all(torch.equal(old[name], copy[name]) for name in copy):
                raise AssertionError("a batch the transform kept changed")
        return batch


def test_batches_a_transform_keeps_in_the_worker_never_change(tmp_path: Path) -> None:
    shards = uneven_shards(tmp_path, [1500, 1500], pack=16)
    loader = pipeline.make_loader(shards, num_workers=1, batch_size=64, shuffle_buffer=256, seed=0,
                                  batch_transform=KeepsBatches())
    for _ in range(2):
        ids = np.concatenate([batch["i"].numpy() for batch in loader])
        assert np.array_equal(np.sort(ids), np.arange(3000))


def test_more_workers_than_the_loader_was_made_with(tmp_path: Path) -> None:
    loader = pipeline.make_loader(uneven_shards(tmp_path, [600, 600]), num_workers=1, batch_size=50,
                                  persistent_workers=False)
    loader.num_workers = 2
    assert np.array_equal(np.sort(np.concatenate([batch["i"].numpy() for batch in loader])), np.arange(1200))


def received(lent: Lent) -> Lent:
    """``lent`` as the main process gets it: its tensors on storages of their own (the main
    process maps the worker's memory anew; in one process the worker's storage would be kept)."""
    return lent._replace(message={name: tensor.clone() for name, tensor in lent.message.items()})


def test_a_buffer_is_reused_only_after_its_release() -> None:
    table = ReleaseTable(1)
    buffers = WorkerBuffers(table, 0)
    first = buffers.empty((1000,), torch.float32)
    lent = buffers.lend({"x": first})
    assert isinstance(lent, Lent) and lent.slots[0][0] == ("x",)
    address = first.untyped_storage().data_ptr()
    sent = received(lent)
    del first, lent  # sent: the worker holds it no more
    second = buffers.empty((1000,), torch.float32)  # the first is still out
    assert second.untyped_storage().data_ptr() != address
    buffers.lend({"x": second})
    del second
    batch = table.watch(sent)["x"][:10]  # a view keeps its storage, and the buffer, out
    del sent
    assert buffers.empty((1000,), torch.float32).untyped_storage().data_ptr() != address
    buffers.lend({})  # taken, not sent: forgotten
    del batch  # the last view of it gone: released
    assert buffers.empty((990,), torch.float32).untyped_storage().data_ptr() == address


def test_a_buffer_a_tensor_of_the_worker_is_on_is_not_reused() -> None:
    table = ReleaseTable(1)
    buffers = WorkerBuffers(table, 0)
    kept = buffers.empty((100,), torch.int32)[:5]  # a view the worker keeps (a transform's, say)
    del table.watch(received(buffers.lend({"x": kept})))["x"]  # released by the main process
    assert buffers.empty((100,), torch.int32).untyped_storage().data_ptr() != kept.untyped_storage().data_ptr()


def test_a_late_release_from_a_dead_worker_frees_nothing_of_its_replacement() -> None:
    table = ReleaseTable(1)
    old = WorkerBuffers(table, 0)
    stale = table.watch(received(old.lend({"x": old.empty((100,), torch.int64)})))
    new = WorkerBuffers(table, 0)  # the replacement of a worker that died with a message out
    tensor = new.empty((100,), torch.int64)
    address = tensor.untyped_storage().data_ptr()
    new.lend({"x": tensor})
    del tensor, stale  # released after the replacement started: its ticket is not the new one's
    assert new.empty((100,), torch.int64).untyped_storage().data_ptr() != address


def test_a_buffer_the_message_hides_is_never_reused() -> None:
    class Opaque:  # a batch transform's object of its own: its tensors cannot be found
        def __init__(self, tensor: torch.Tensor) -> None:
            self.tensor = tensor

    buffers = WorkerBuffers(ReleaseTable(1), 0)
    hidden = buffers.empty((100,), torch.uint8)
    message = Opaque(hidden)
    assert buffers.lend(message) is message  # sent as it is, nothing to release
    assert buffers.empty((100,), torch.uint8).untyped_storage().data_ptr() != hidden.untyped_storage().data_ptr()


@pytest.mark.parametrize("extra", [0, 3])
def test_a_message_of_more_tensors_than_slots_gets_memory_of_its_own(extra: int) -> None:
    buffers = WorkerBuffers(ReleaseTable(1), 0)
    message_buffers.install(buffers)  # as a worker's: shared_empty takes the buffers
    try:
        tensors = [shared_empty((8,), np.dtype(np.float64)) for _ in range(SLOTS + extra)]
    finally:
        message_buffers._installed.clear()
    for n, tensor in enumerate(tensors):
        tensor.fill_(n)
    lent = buffers.lend(tensors)
    assert len(lent.slots) == SLOTS and [float(t[0]) for t in lent.message] == list(range(SLOTS + extra))


def test_a_released_buffer_no_message_needs_lately_is_let_go() -> None:
    table = ReleaseTable(1)
    buffers = WorkerBuffers(table, 0)
    large = table.watch(received(buffers.lend({"x": buffers.empty((1 << 20,), torch.uint8)})))
    del large  # released, then only small messages come
    for _ in range(SLOTS + 1):
        small = table.watch(received(buffers.lend({"y": buffers.empty((16,), torch.int64)})))
        del small
    made = buffers.allocations
    buffers.empty((1 << 20,), torch.uint8)
    assert buffers.allocations == made + 1  # the large one was let go meanwhile, not kept idle


def test_trim_lets_go_of_the_buffers_not_out() -> None:
    table = ReleaseTable(1)
    buffers = WorkerBuffers(table, 0)
    released = table.watch(received(buffers.lend({"x": buffers.empty((1000,), torch.uint8)})))
    out = table.watch(received(buffers.lend({"x": buffers.empty((1000,), torch.uint8)})))
    del released
    buffers.trim()
    made = buffers.allocations
    buffers.empty((1000,), torch.uint8)  # the released one is gone, the other still out
    assert buffers.allocations == made + 1 and out["x"].shape == (1000,)


def test_a_message_in_reused_buffers_is_converted_as_a_plain_one_its_text_handed_over_as_it_is() -> None:
    """DataLoader's conversion in the worker took the message for a tuple of anything and visited
    every string of a text field: half a worker's time over a set with file names beside arrays."""
    from pipeline.stream.conversion import convert_keeping_tuples

    names, x = [f"sample-{i}.jpg" for i in range(1000)], torch.zeros(1000)
    lent = Lent({"x": x, "name": names}, 1, ((("x",), 0, 7),))
    converted = convert_keeping_tuples(lent)
    assert type(converted) is Lent and converted[1:] == lent[1:]
    assert converted.message["name"] is names and converted.message["x"] is x
    as_tuple = convert_keeping_tuples(Lent((x, names), 0, ()))
    assert type(as_tuple.message) is tuple and as_tuple.message[1] is names


FILE_SYSTEM_EPOCHS = """
import multiprocessing, os, sys, torch, pipeline
torch.multiprocessing.set_sharing_strategy("file_system")
loader = pipeline.make_loader(sys.argv[1], num_workers=2, batch_size=50, persistent_workers=False)
workers = set()
for epoch in range(3):
    for batch in loader:
        workers.update(p.pid for p in multiprocessing.active_children())
    del batch
left = [name for name in os.listdir("/dev/shm") if name.split("_")[:2] in [["torch", str(p)] for p in workers]]
print(len(workers), len(left))
"""


def test_workers_that_end_leave_no_shared_memory_under_the_file_system_strategy(tmp_path: Path) -> None:
    """Under the strategy PyTorch's "Too many open files" error advises, each worker that ended
    left its message buffers in /dev/shm until the training process exited: ~110 MB an epoch
    without persistent workers, in a container's 64 MB /dev/shm."""
    shards = tmp_path / "s"
    pipeline.write_shards(shards, {"x": np.ones((1000, 256), np.float32)}, shard_samples=500, quiet=True)
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", FILE_SYSTEM_EPOCHS, str(shards)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    workers, left = map(int, run.stdout.split())
    assert workers >= 6 and left == 0  # (segments are named torch_<pid of their maker>_...)
