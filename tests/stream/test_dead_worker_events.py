"""A worker killed while it held the lock of an Event it shares with the loader, or while it slept
on one, must not keep the loader's shutdown waiting for ever.

A multiprocessing Event's ``set()`` takes a lock shared by every process that holds the Event,
then waits for each process asleep in its ``wait()`` to say it woke. PyTorch's workers take that
lock each time they look at their stop Event; a read backing off before a retry sleeps on the
loader's abandon Event. Killed there (the out-of-memory killer strikes anywhere), a worker left
the loader's stop waiting for ever: a test run hung so, once in many, where its tests kill workers.
Here worker 0 dies so on purpose, at its 5th batch."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from tests.helpers import run_script
from tests.stream.shardsets import random_sizes, uneven_shards

SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, time
    from torch.utils.data import get_worker_info
    from pipeline import WorkerError, make_loader

    class DieWithEvents:
        '''Worker 0, at its 5th batch, dies holding the lock of every Event it shares (how="holding"),
        or while a thread of it sleeps on each (how="sleeping"); once (it leaves ``marker``).'''

        def __init__(self, how, marker):
            self.how, self.marker, self.calls = how, marker, 0

        def __call__(self, batch):
            info = get_worker_info()
            self.calls += 1
            if info is not None and info.id == 0 and self.calls == 5 and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                frame = sys._getframe()
                while frame.f_code.co_name != "_worker_loop":
                    frame = frame.f_back
                # PyTorch's stop Event, and the loader's abandon Event (its worker_init_fn's)
                for event in (frame.f_locals["done_event"], frame.f_locals["init_fn"].shutdown):
                    if self.how == "holding":
                        event._cond.acquire()
                    else:
                        threading.Thread(target=event.wait, args=(600,), daemon=True).start()
                        deadline = time.monotonic() + 30
                        while event._cond._sleeping_count.get_value() < 1 and time.monotonic() < deadline:
                            time.sleep(0.01)  # (until it sleeps)
                os.kill(os.getpid(), signal.SIGKILL)
            return batch

    def ids(batches):
        return [batch["i"].tolist() for batch in batches]

    if __name__ == "__main__":
        options = dict(num_workers=2, batch_size=32, seed=7, shuffle_buffer=300)
        reference = ids(make_loader(sys.argv[1], **options))
        loader = make_loader(sys.argv[1], batch_transform=DieWithEvents(sys.argv[2], sys.argv[3]), **options)
        head = []
        try:
            for batch in loader:
                head.append(batch["i"].tolist())
        except WorkerError as error:  # (the loader stops its workers before it raises)
            print("WorkerError:", str(error))
        print("then exact:", head + ids(loader) == reference)  # new workers go on with the epoch
""")


@pytest.mark.parametrize("how", ["holding", "sleeping"])
def test_a_worker_killed_holding_or_sleeping_on_a_shared_event_does_not_hang_the_loader(tmp_path: Path,
                                                                                        how: str) -> None:
    shards = uneven_shards(tmp_path / "shards", random_sizes(6, 400, 1000, seed=5), pack=8)
    status, out, err = run_script(tmp_path, SCRIPT, shards, how, tmp_path / "died")  # (a hang leaves no worker behind)
    assert status == 0, err[-3000:]
    assert re.fullmatch(r"WorkerError: DataLoader worker \(pid(\(s\))? \d+\) [^\n]*\nthen exact: True\n", out), out
