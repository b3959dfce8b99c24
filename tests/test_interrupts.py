"""Ctrl-C held through a step that must not be cut, then raised as it would have been."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from pipeline.interrupts import held_ctrl_c


def test_ctrl_c_in_a_held_step_interrupts_once_it_is_done() -> None:
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with held_ctrl_c():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # (a signal is handled between two bytecodes: long past by now)
            steps.append("finished")
    assert steps == ["finished"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_ctrl_c_a_held_step_changes_nothing_and_other_threads_are_left_alone() -> None:
    with held_ctrl_c():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    seen = []

    def elsewhere() -> None:
        with held_ctrl_c():  # signal handlers belong to the main thread: nothing to hold here
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


def test_where_ctrl_c_is_ignored_a_held_step_leaves_it_ignored() -> None:
    """A process started in the step (a build's pool worker) inherits an ignored SIGINT through
    its exec, but not a handler: the held step must not put one in place of the ignoring."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with held_ctrl_c():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_pressed_twice_in_a_step_held_for_a_wait_interrupts_at_once() -> None:
    """A loader holds Ctrl-C while it starts its workers, which may hang: pressed again, it cuts."""
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with held_ctrl_c(second_at_once=True):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            steps.append("held once")
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            steps.append("held twice")
    assert steps == ["held once"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_programs_own_handler_gets_every_press_in_a_step_held_for_a_wait() -> None:
    """A graceful stop of the program's own (a flag it checks between steps) raises nothing into
    the step: each press reaches it as it comes, none is held, nor raised as KeyboardInterrupt."""
    presses = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: presses.append(signum))
    try:
        with held_ctrl_c(second_at_once=True):
            for _ in range(2):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
            assert presses == [signal.SIGINT] * 2
    finally:
        signal.signal(signal.SIGINT, previous)
