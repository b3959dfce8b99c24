"""Labels that are class names are stored as positions in the sorted names, as torchvision's
ImageFolder numbers its class folders. Names that read as whole numbers ("2", "10") sort as
text, so that "10" comes before "2": the position stored is then not the number a user reads,
and a model learns against labels it is not scored on. The build warns, saying how to keep the
numbers."""

from __future__ import annotations

import re
from typing import Iterable

from ...caller_warning import warn_caller

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
