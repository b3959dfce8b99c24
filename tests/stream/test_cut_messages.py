"""A worker killed in the middle of sending a message larger than the pipe holds (a unit of text
fields: megabytes) must not leave the loader waiting for the rest for ever: it is a WorkerError,
and the epoch then goes on exactly. Here the worker killed is the one blocked writing to the pipe,
found by its thread's wait channel, while the training loop does not read."""

from __future__ import annotations

import multiprocessing
import os
import re
import textwrap
import types
from pathlib import Path

import pytest

from pipeline.stream.whole_messages import WholeMessages
from tests.helpers import run_script, wchan_names_functions
from tests.stream.shardsets import text_shards

SCRIPT = textwrap.dedent("""
    import multiprocessing, os, signal, sys
    sys.path.insert(0, os.getcwd())
    from pipeline import WorkerError, make_loader
    from tests.helpers import worker_blocked_writing

    def ids(batches):
        return [batch["i"].tolist() for batch in batches]

    if __name__ == "__main__":
        # (no pinning thread: it would take every message off the pipe as it comes, and none would wait)
        options = dict(num_workers=2, batch_size=64, seed=7, shuffle_buffer=1024, pin_memory=False)
        reference = ids(make_loader(sys.argv[1], **options))
        loader = make_loader(sys.argv[1], **options)
        batches = iter(loader)
        head = [next(batches)["i"].tolist()]
        os.kill(worker_blocked_writing([worker.pid for worker in multiprocessing.active_children()]), signal.SIGKILL)
        try:
            for batch in batches:
                head.append(batch["i"].tolist())
        except WorkerError as error:  # (the loader stops its workers before it raises)
            print("WorkerError:", str(error))
        print("then exact:", head + ids(loader) == reference)
""")


@pytest.mark.skipif(not wchan_names_functions(), reason="finds the writing worker by its wait channel in /proc")
def test_a_worker_killed_in_the_middle_of_a_message_is_a_worker_error(tmp_path: Path) -> None:
    text = text_shards(tmp_path / "text")
    status, out, err = run_script(tmp_path, SCRIPT, text)
    assert status == 0, err[-3000:]
    assert re.fullmatch(r"WorkerError: DataLoader worker \(pid(\(s\))? \d+\) [^\n]*\nthen exact: True\n", out), out


@pytest.mark.parametrize("size", [100, 300_000])  # one write of length and body; the length, then the body
def test_a_get_interrupted_in_the_middle_of_a_message_goes_on_with_it_at_the_next(size: int, monkeypatch) -> None:
    """Ctrl-C in a notebook, say: the rest of the message is not read as the next one."""
    results = multiprocessing.get_context("fork").Queue()
    whole = WholeMessages(results, wait_s=0.25)
    messages = [os.urandom(size), b"next"]
    for message in messages:
        results.put(message)
    reads = 0
    readv = os.readv

    def interrupted_at_the_second_read(descriptor: int, buffers: list) -> int:
        nonlocal reads
        reads += 1
        if reads == 2:
            raise KeyboardInterrupt
        return readv(descriptor, [buffers[0][:max(len(buffers[0]) // 2, 1)]])  # a read that stops part-way

    monkeypatch.setattr(os, "readv", interrupted_at_the_second_read)
    with pytest.raises(KeyboardInterrupt):
        whole.get(timeout=10)
    monkeypatch.setattr(os, "readv", readv)
    whole.workers = [types.SimpleNamespace(pid=1, exitcode=-9)]  # a wait for bytes that never come fails at once
    assert [whole.get(timeout=10) for _ in messages] == messages
    results.close()
    results.join_thread()
