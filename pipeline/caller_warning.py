"""Warnings that point at the user's line.

A warning's ``stacklevel`` counts frames, and the library's own frames between the user's call
and the warning change with every refactoring (``make_loader`` → ``ShardDataset`` → ...): a fixed
level shows some library line, which tells the user nothing and is shown once for every
caller alike. Here the level is found: the first frame outside this package.
"""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """Issue ``message`` as a warning of ``category`` from the nearest frame outside this package
    (the caller's, where all of the stack is the package's, as in a DataLoader worker's loop)."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
