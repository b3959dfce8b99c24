"""Ctrl-C that stops a command every time, and never in the middle of what must not be cut.

Python raises ``KeyboardInterrupt`` wherever the main thread is when the signal is handled. When
that is a weakref callback (a build ends a shard's writer thread for each shard, and the thread's
end runs one), the exception is printed as "Exception ignored" and dropped, and the command goes
on as if nothing was pressed. Here the interrupt that would land there is raised 10 ms later
instead, from the code the callback returns to.

Some steps leave things broken when cut: a process pool cut while it starts a worker (the
worker reads half of what it was sent, and prints a traceback) or its manager thread (the pool
can then not be shut down). :func:`held_ctrl_c` holds an interrupt until such a step is done.
"""

from __future__ import annotations

import _thread
import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator

#: Where a raised exception is dropped: the modules whose functions run as weakref callbacks.
_DROPPING = ("_weakrefset.py", "weakref.py")
_LATER_S = 0.01


def interrupt(signum: int, frame: FrameType | None) -> None:
    """A SIGINT handler: raise ``KeyboardInterrupt``, or 10 ms later when ``frame`` is a weakref
    callback's (see the module docstring)."""
    if frame is not None and frame.f_code.co_filename.endswith(_DROPPING):
        later = threading.Timer(_LATER_S, _thread.interrupt_main)  # a SIGINT of its own, handled here again
        later.daemon = True
        later.start()
        return
    raise KeyboardInterrupt


@contextmanager
def reliable_ctrl_c() -> Iterator[None]:
    """Ctrl-C raises ``KeyboardInterrupt`` outside weakref callbacks while the block runs (in the
    main thread: elsewhere signals cannot be handled, and nothing is changed)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # another thread, or Ctrl-C already handled by someone else: left as it is
        return
    signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextmanager
def held_ctrl_c(second_at_once: bool = False) -> Iterator[None]:
    """Ctrl-C pressed while the block runs interrupts once it is done (in the main thread:
    elsewhere no interrupt is raised, and nothing is changed). Where Ctrl-C is ignored it stays
    so: processes started in the block (a pool's workers) inherit the ignoring through their
    exec, not a handler, which exec would reset to the default.

    ``second_at_once``, for a block that may wait (for a worker that hangs): pressed again, Ctrl-C
    interrupts at once; and a handler of the program's own, which raises nothing into the block
    (a graceful stop that sets a flag), is left to handle every press as it comes."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or handler is signal.SIG_IGN or (
            second_at_once and handler not in (signal.default_int_handler, interrupt)):
        yield
        return
    pressed: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if pressed and second_at_once:
            pressed.clear()
            previous(signum, frame)  # (it raises KeyboardInterrupt)
        pressed.append(signum)
    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pressed:
            signal.raise_signal(signal.SIGINT)  # handled now, as it would have been
