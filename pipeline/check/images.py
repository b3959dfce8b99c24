"""``verify --images``: every image a set holds decodes, as the loader will decode it.

The build keeps an image's bytes as they are (it only checks that they start as a JPEG, PNG or
WebP does), so a file cut short or damaged passes the build and the shards' checksums, and
would otherwise be found by a training run, as an error (or a skip) part way through an epoch.
Each value that starts as an image is decoded with the loader's decoder (OpenCV where it
imports, else Pillow), at a small size: a JPEG then decodes at an eighth of its size, all of
its data read, which is what finds a cut or damage, at a fraction of a full decode's cost.
"""

from __future__ import annotations

from typing import Any, Callable

from ..format.image_kind import image_format
from ..format.walk import WalkedRecord
from ..stream.image_decoders import ImageError, decoder

_SIDE = 8  # the size decoded to: the smallest that still reads every byte


def _whole(width: int, height: int) -> tuple[int, int, int, int]:
    return 0, 0, width, height


def _values(value: Any) -> list[Any]:
    """A field's values: one, or a packed record's column of them."""
    return value if isinstance(value, list) else [value]


def image_check() -> Callable[[WalkedRecord], str | None]:
    """:func:`undecodable_image`, once a decoder is known to import (else the ImportError saying
    what to install, before the first shard is read)."""
    decoder("auto")
    return undecodable_image


def undecodable_image(walked: WalkedRecord) -> str | None:
    """Why an image of the record ``walked`` cannot be decoded (naming its field), or None."""
    decode = decoder("auto")
    for name, value in walked.fields.items():
        for item in _values(value):
            if isinstance(item, (bytes, bytearray, memoryview)) and image_format(item) is not None:
                try:
                    decode(item, _whole, _SIDE, _SIDE)
                except ImageError as exc:
                    return f"field {name!r}: {exc}"
    return None
