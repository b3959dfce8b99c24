"""Labels that are class names are stored as positions in the sorted names, as torchvision's
ImageFolder numbers its class folders. Names that read as whole numbers ("2", "10") sort as
text, so that "10" comes before "2": the position stored is then not the number a user reads,
and a model learns against labels it is not scored on. The build warns, saying how to keep the
numbers."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ...caller_warning import warn_caller
from ...format.errors import SampleError

_WHOLE = re.compile(r"-?\d+")


def sorted_classes(names: Iterable[str], where: str, keep_numbers: str) -> list[str]:
    """The distinct ``names`` sorted; a warning from ``where`` when they all read as whole numbers
    that their positions do not equal, ``keep_numbers`` saying how to store the numbers."""
    classes = sorted(set(names))
    warn_of_renumbered_numbers(classes, where, keep_numbers)
    return classes


def warn_of_renumbered_numbers(classes: list[str], where: str, keep_numbers: str) -> None:
    """Warn where ``classes`` all read as whole numbers and one's position is not its number."""
    if not classes or not all(isinstance(name, str) and _WHOLE.fullmatch(name) for name in classes):
        return
    moved = next(((name, n) for n, name in enumerate(classes) if int(name) != n), None)
    if moved is not None:
        shown = ", ".join(map(repr, classes[:4])) + (", ..." if len(classes) > 4 else "")
        warn_caller(f"{where}: the class names read as whole numbers ({shown}), but each is stored as its position "
                    f"in the names sorted as text, as torchvision's ImageFolder numbers class folders: {moved[0]!r} "
                    f"is label {moved[1]}; {keep_numbers}")


def given_classes(classes: Sequence[str] | None) -> list[str] | None:
    """The class list a build was given (``classes=``, ``--classes``), which numbers the labels in
    place of the names found sorted: a set of a later week, whose new class would otherwise move
    every name after it, keeps the numbering of the model trained on the first. Checked here, as
    a list's mistakes would renumber labels without a word: a string (its letters taken for
    names), a name twice, an empty name (``--classes ""`` from a script's empty variable)."""
    if classes is None:
        return None
    if isinstance(classes, str):
        raise TypeError(f"classes is a list of class names, e.g. classes=['cat', 'dog'], got the string {classes!r}")
    names = list(classes)
    if not names or not all(isinstance(name, str) and name for name in names):
        raise ValueError(f"classes must be distinct, non-empty names, got {names}")
    twice = sorted(name for name, count in Counter(names).items() if count > 1)
    if twice:
        raise ValueError(f"classes must be distinct, non-empty names, got {names} ({twice} more than once)")
    return names


def class_numbers(names: np.ndarray, classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The position in ``classes`` (one name at least, in any order) of each of ``names``, and the
    indexes of the names it lacks (their positions are meaningless), without a loop per name."""
    order = np.argsort(np.array(classes, dtype=object))
    ordered = np.array(classes, dtype=object)[order]  # (objects: NumPy strings drop a last NUL)
    at = np.minimum(np.searchsorted(ordered, names), len(classes) - 1)
    return order[at].astype(np.int64), np.flatnonzero(ordered[at] != names)


def label_file_classes(rows: list[np.ndarray], paths: list[Path], given: list[str] | None) -> list[str] | None:
    """The class list of label files' rows (``paths``, one array each) whose labels are names:
    ``given``, each name checked to be in it, or else the sorted names (each stored as its
    position, as torchvision's ImageFolder numbers its class folders); ``None`` for labels that
    are numbers. Files of names beside files of numbers are refused, naming one of each."""
    named = [r.dtype.kind in "UO" for r in rows]
    if not any(named):
        if given is not None:
            raise SampleError(f"{paths[0]}: its labels are numbers, and classes= (--classes) numbers labels that "
                              f"are class names: leave it out")
        return None
    if not all(named):
        raise SampleError(f"{paths[named.index(True)]} holds class names, {paths[named.index(False)]} numbers: "
                          f"give every label file the same kind of labels")
    if given is None:
        return sorted_classes(set().union(*(r.tolist() for r in rows)), str(paths[0].parent),
                              "save the labels as numbers (y.astype(int)) to store those numbers")
    for r, path in zip(rows, paths):
        unknown = class_numbers(r, given)[1]
        if len(unknown):
            raise SampleError(f"{path}: label {unknown[0]} ({str(r[unknown[0]])!r}) is not among the classes {given}")
    return given
