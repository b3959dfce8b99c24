"""``pipe:COMMAND``: the standard output of a shell command, as webdataset reads shards through
``curl`` or ``aws s3 cp``."""

from __future__ import annotations

import os
import subprocess
import threading
from typing import Any

from .errors import SourceError, redact

#: Bytes of the command's standard error kept for the message of its failure.
STDERR_TAIL = 4096
#: Seconds to wait, once the command has exited, for its standard error to end (a process it
#: started may still hold it open).
STDERR_END_S = 5.0


class PipeStream:
    """The standard output of a shell command; a non-zero exit is an error naming it, with the
    end of what it wrote on standard error.

    Standard error is read all along, by a thread of its own that keeps the last
    :data:`STDERR_TAIL` bytes. Why: a pipe holds 64 KiB. A command that writes more than that
    on standard error (``curl -v``, a tool's debug log) before it is done would otherwise wait
    for ever for a reader of it, its standard output would stop, and so would the loader."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.process = subprocess.Popen(url[len("pipe:"):], shell=True, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, bufsize=1 << 20)
        self._stderr_tail = b""
        self._stderr_reader = threading.Thread(target=self._keep_stderr_tail, daemon=True,
                                               name=f"stderr of {redact(url)[:60]}")
        self._stderr_reader.start()

    def _keep_stderr_tail(self) -> None:
        assert self.process.stderr is not None
        descriptor = self.process.stderr.fileno()
        try:
            while chunk := os.read(descriptor, 1 << 16):
                self._stderr_tail = (self._stderr_tail + chunk)[-STDERR_TAIL:]
        finally:
            self.process.stderr.close()  # (this thread's to close: closed under a read, it could be reused)

    def read(self, size: int | None = -1) -> bytes:
        assert self.process.stdout is not None
        data = self.process.stdout.read(size)
        if size is None or size < 0 or len(data) < size:  # the end of its output (a buffered read waits for all it asks)
            self._check_exit()
        return data

    def _check_exit(self) -> None:
        status = self.process.wait()
        if status != 0:
            self._stderr_reader.join(STDERR_END_S)
            message = self._stderr_tail.decode("utf-8", "replace").strip()[-300:]
            raise SourceError(self.url, None, f"command exited with status {status}: "
                                              f"{message or '(it wrote nothing on standard error)'}")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> "PipeStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
