"""A shard replaced on the server while it is read: a read resumed after a cut asks for the rest
of whatever is at the URL now, and would join the start of one version to the rest of another
(nothing checks the bytes of shards without an index)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from pipeline import SourceError
from pipeline.storage import open_stream
from tests.storage.servers import FaultProxy, port_of


class CutThenReplaced(FaultProxy):
    """Cuts the first response, then puts ``new`` in the place of ``old`` (as a rebuild renames
    a shard into place) before the client resumes: every later response is whole."""

    def __init__(self, upstream_port: int, old: Path, new: Path) -> None:
        super().__init__(upstream_port, {"cut": 1.0}, fail_after=None)
        self.old, self.new = old, new

    def _pump(self, upstream: socket.socket, client: socket.socket, fault: str) -> None:
        super()._pump(upstream, client, fault)
        if fault == "cut":
            self.faults = {}
            if self.new.exists():
                os.replace(self.new, self.old)


@pytest.mark.parametrize("replaced", [True, False])
def test_a_read_resumed_after_a_cut_refuses_a_shard_replaced_meanwhile(nginx: str, web_root: Path, fast_retries,
                                                                       replaced: bool) -> None:
    folder = web_root / f"replaced-{replaced}"
    folder.mkdir()
    old, new = folder / "s.tar", folder / ".s.tar.new"
    first, second = os.urandom(300_000), os.urandom(300_000)  # one size: only the version tells them apart
    old.write_bytes(first)
    os.utime(old, (time.time() - 3600,) * 2)  # written an hour before its replacement (nginx's ETag: mtime, size)
    if replaced:
        new.write_bytes(second)
    proxy = CutThenReplaced(port_of(nginx), old, new)
    try:
        with open_stream(f"{proxy.url}/{folder.name}/s.tar") as stream:
            if not replaced:
                assert stream.read() == first  # the resume goes on where the cut was
                return
            with pytest.raises(SourceError, match=r"s\.tar at byte \d+: was replaced while it was read \(its version "
                                                  r"\"[0-9a-f-]+\" is now \"[0-9a-f-]+\", as the read resumed after a "
                                                  r"cut\): read it again"):
                stream.read()
    finally:
        proxy.close()
