"""Torch tensors as the values they hold, before their bytes are taken.

A tensor may be a lazy view whose values are not its memory's: the imaginary part of a
conjugated complex tensor (``z.conj().imag``, a float tensor with its *negative bit* set), or a
conjugated complex one. ``torch.save`` keeps those bits, and ``.numpy()`` refuses such a tensor
(a traceback naming no file); an ``int16`` view of a ``bfloat16`` one would give the bits
before negation. Every tensor is resolved here first: detached, on the CPU, the bits applied
(a copy only where one is set).
"""

from __future__ import annotations

from typing import Any


def resolved(tensor: Any) -> Any:
    """``tensor`` detached, on the CPU, with its conjugate and negative bits applied."""
    return tensor.detach().cpu().resolve_conj().resolve_neg()
