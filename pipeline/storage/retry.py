"""Retries with exponential back-off and jitter, and the timeouts every remote read obeys."""

from __future__ import annotations

import logging
import os
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, TypeVar

from .errors import SourceError, TransientError, redact

log = logging.getLogger("pipeline.storage")
T = TypeVar("T")
#: Retries and resumed reads in this process, for the loader's stats.
COUNTERS: Counter[str] = Counter()


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. ``read_timeout``: seconds a read may go without receiving
    ``stall_bytes`` bytes before the connection counts as stalled (a silent server and one
    that trickles a byte at a time are both caught)."""

    attempts: int = 8
    base_delay: float = 0.25
    max_delay: float = 15.0
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    stall_bytes: int = 64 << 10

    @classmethod
    def from_env(cls) -> "RetryPolicy":
        """Defaults, overridden by ``PIPELINE_RETRY_ATTEMPTS``, ``PIPELINE_RETRY_DELAY`` (the first
        back-off, seconds), ``PIPELINE_CONNECT_TIMEOUT`` and ``PIPELINE_READ_TIMEOUT``."""
        env = os.environ
        return cls(attempts=int(env.get("PIPELINE_RETRY_ATTEMPTS", cls.attempts)),
                   base_delay=float(env.get("PIPELINE_RETRY_DELAY", cls.base_delay)),
                   connect_timeout=float(env.get("PIPELINE_CONNECT_TIMEOUT", cls.connect_timeout)),
                   read_timeout=float(env.get("PIPELINE_READ_TIMEOUT", cls.read_timeout)))

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based): exponential, jittered."""
        return min(self.max_delay, self.base_delay * 2**attempt) * random.uniform(0.5, 1.0)


def with_retries(action: Callable[[], T], url: str, offset: int, policy: RetryPolicy, what: str) -> T:
    """Run ``action``; on a TransientError wait and try again, up to ``policy.attempts`` times.
    Every retry is logged once, with the URL (redacted) and the byte offset."""
    for attempt in range(policy.attempts):
        try:
            return action()
        except TransientError as exc:
            if attempt + 1 == policy.attempts:
                raise SourceError(url, offset, f"{what} failed {policy.attempts} times, last: {exc.reason}") from None
            pause = policy.delay(attempt)
            COUNTERS["retries"] += 1
            log.warning("retrying %s of %s at byte %d in %.2fs (attempt %d/%d): %s", what, redact(url),
                        offset, pause, attempt + 2, policy.attempts, exc.reason)
            time.sleep(pause)
    raise AssertionError("unreachable")
