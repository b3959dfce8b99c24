"""Transforms in a worker that its loader stops give up between samples.

A loader stops its workers when a loop breaks off (evaluate every N steps, then go on),
``set_epoch`` moves it, or it is dropped; the unit a worker is making then goes unused. PyTorch
waits for each worker in turn to finish it, up to 5 s each, before it kills them: with a heavy
``sample_transform`` (tokenising, augmenting) every ``break`` cost 10 s with 2 workers. A
transform wrapped here looks at the loader's stop between samples, at most every 50 ms (a
clock read a call otherwise), and ends the unit with :class:`ReadAbandoned`, which nobody sees
(the worker's message goes to a queue the loader no longer reads).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..storage.retry import ReadAbandoned, process_reads_abandoned

#: Seconds between two looks at the loader's stop.
LOOK_S = 0.05
_looked = [0.0]  # when this process last looked


def stopped_between_calls(function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``function``, which first raises :class:`ReadAbandoned` once this worker's loader stopped it."""

    def call(value: Any) -> Any:
        now = time.monotonic()
        if now - _looked[0] > LOOK_S:
            _looked[0] = now
            if process_reads_abandoned():
                raise ReadAbandoned("the loader stopped this worker: the unit under way is not needed")
        return function(value)

    return call
