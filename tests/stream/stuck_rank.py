"""Run under torchrun by test_distributed.py: a rank that never finishes, to show that a job run
past its time is reported with its stacks and leaves no process behind."""

import faulthandler
import signal
import time


def wait_for_ever() -> None:
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    wait_for_ever()
