"""Warnings that point at the user's line.

A warning's ``stacklevel`` counts frames, and the library's own frames between the user's call
and the warning change with every refactoring (``make_loader`` → ``ShardDataset`` → ...): a fixed
level shows some library line, which tells the user nothing and is shown once for every
caller alike. Here the level is found: the first frame outside this package and outside the
code that runs a DataLoader's loop (torch's data loading, and the multiprocessing that starts
its workers), which a user's line calls into: in a forked worker, the stack still holds the
parent's frames at the fork, the user's loop among them, beneath torch's worker loop. A spawned
worker's (or a forkserver's) holds none: beneath multiprocessing's frames lies only the
``python -c "from multiprocessing.spawn import spawn_main; ..."`` that started it, no user's line.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from types import FrameType

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_MULTIPROCESSING = os.path.dirname(multiprocessing.__file__) + os.sep


#: The module of torch whose frames run a DataLoader's loop between the user's line and this
#: package's (multiprocessing's, which starts its workers, are skipped too).
_DATA_LOADING = "torch.utils.data"


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """Issue ``message`` as a warning of ``category`` from the nearest frame outside this package
    and the loop's runners (the caller's, where there is none: a spawned worker's stack holds no
    user's line)."""
    level, frame = _user_frame(sys._getframe(1))
    warnings.warn(message, category, stacklevel=level + 1 if frame is not None else 2)


def user_line() -> str:
    """``file:line`` of the nearest frame outside this package (the file's name only: the same
    script on two machines may lie in other folders); ``""`` where there is none."""
    frame = _user_frame(sys._getframe(1))[1]
    return "" if frame is None else f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _user_frame(frame: FrameType | None) -> tuple[int, FrameType | None]:
    """The nearest frame from ``frame`` outside this package and the loop's runners, and how many
    frames up it is (1: ``frame`` itself); ``None`` where there is none, or only the command line
    that started a spawned process (see the module docstring)."""
    loading = sys.modules.get(_DATA_LOADING)  # (not imported: none of its frames)
    skipped = (_PACKAGE, _MULTIPROCESSING,
               *([os.path.dirname(loading.__file__) + os.sep] if loading is not None and loading.__file__ else []))
    level, called = 1, None
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        level, called, frame = level + 1, frame, frame.f_back
    if frame is not None and frame.f_code.co_filename == "<string>" and called is not None and \
            called.f_code.co_filename.startswith(_MULTIPROCESSING):
        return level, None
    return level, frame
