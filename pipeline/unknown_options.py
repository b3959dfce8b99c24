"""A keyword argument that the function called does not take: an error that names that
function (Python's own named the internal one the options were passed on to, ``build_shards()``
or ``ShardDataset.__init__()``), the name it may have meant, and every name it takes."""

from __future__ import annotations

import difflib
from typing import Any, Mapping, Sequence


def refuse_unknown(called: str, options: Mapping[str, Any], accepted: Sequence[str],
                   not_taken: Mapping[str, str] | None = None) -> None:
    """Raise a TypeError for the first of ``options`` not in ``accepted``, the names that
    ``called`` (a function's name) takes: with why it is not taken where ``not_taken`` says (an
    option of another API that the user may expect here), else with the nearest accepted name."""
    unknown = next((name for name in options if name not in accepted), None)
    if unknown is None:
        return
    if unknown in (not_taken or {}):
        hint = f" ({not_taken[unknown]})"  # type: ignore[index]
    else:
        close = difflib.get_close_matches(unknown, accepted, n=1)
        hint = f" (did you mean {close[0]}=?)" if close else ""
    raise TypeError(f"{called}() got an unexpected keyword argument {unknown!r}{hint}; it takes {', '.join(accepted)}")
