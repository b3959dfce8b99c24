"""What a cluster a build starts says as the build stops: nothing of distributed's internals.

A build stopped by Ctrl-C closes the cluster it started, and each worker that was writing a
shard then logged a WARNING that its task "ended with CancelledError", and each nanny (they run
in the build's process) that it killed a worker still busy: lines of distributed's internals
after the build's own "interrupted" line. The shards they were writing are temporary files,
which a resume replaces. Only those two messages are dropped: the workers' other warnings
(memory, a worker that died) still show, and a cluster of the user's is left as its owner
configured it. Imported only where distributed is (the ``dask`` extra).
"""

from __future__ import annotations

import logging
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

#: What a nanny says as it kills a worker still busy when its cluster closes.
NANNY_KILLED = "Worker process still alive after"


class Without(logging.Filter):
    """Drops the log records whose message holds ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


class QuietCancelledTasks(WorkerPlugin):
    """Set up in every worker of the cluster, those a nanny starts again after a crash too."""

    def setup(self, worker: Any) -> None:
        logging.getLogger("distributed.worker.state_machine").addFilter(Without("ended with CancelledError"))
