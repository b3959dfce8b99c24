"""The log of what ``on_error="skip"`` leaves out: a warning the first time a process skips part
of a shard, DEBUG records after that. A shard cut short fails every piece read past the cut
(hundreds an epoch), and one line says as much as hundreds; ``stats()`` counts every one."""

from __future__ import annotations

import logging

from ..storage import redact

_WARNED: set[str] = set()  # the shards this process has warned of


def log_skip(log: logging.Logger, url: str, what: str, exc: Exception | str) -> None:
    """Log that ``what`` (``"12 samples"``, ``"a record"``) of the shard at ``url`` is skipped
    because of ``exc``."""
    first = url not in _WARNED
    _WARNED.add(url)
    note = "; later skips in this shard are logged at DEBUG level (stats() counts them all)" if first else ""
    log.log(logging.WARNING if first else logging.DEBUG, "skipping %s of %s: %s%s", what, redact(url), exc, note)
