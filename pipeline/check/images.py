"""``verify --images``: every image a set holds decodes, as the loader will decode it.

The build keeps an image's bytes as they are (it only checks that they start as a JPEG, PNG or
WebP does), so a file cut short or damaged passes the build and the shards' checksums, and
would otherwise be found by a training run, as an error (or a skip) part way through an epoch.
Each value that starts as an image is decoded with the loader's decoder (OpenCV where it
imports, else Pillow), at a small size: a JPEG then decodes at an eighth of its size, all of
its data read, which is what finds a cut or damage, at a fraction of a full decode's cost.
"""

from __future__ import annotations

from typing import Callable

from ..format.codec import ROWS_FIELD
from ..format.image_kind import image_format
from ..format.packing import sample_keys
from ..format.walk import WalkedRecord
from ..stream.image_decoders import ImageError, decoder

_SIDE = 8  # the size decoded to: the smallest that still reads every byte


def _whole(width: int, height: int) -> tuple[int, int, int, int]:
    return 0, 0, width, height


def image_check() -> Callable[[WalkedRecord], list[str]]:
    """:func:`undecodable_images`, once a decoder is known to import (else the ImportError saying
    what to install, before the first shard is read)."""
    decoder("auto")
    return undecodable_images


def undecodable_images(walked: WalkedRecord) -> list[str]:
    """Why each image of the record ``walked`` that cannot be decoded fails, naming its field
    and, in a packed record, its sample's key: the record's key is its first sample's, and
    every damaged image is worth knowing of before training."""
    decode = decoder("auto")
    packed = ROWS_FIELD in walked.fields
    keys = sample_keys(walked.key, walked.fields) if packed else [walked.key]
    reasons = []
    for name, value in walked.fields.items():
        for row, item in enumerate(value if packed and isinstance(value, list) else [value]):
            if isinstance(item, (bytes, bytearray, memoryview)) and image_format(item) is not None:
                try:
                    decode(item, _whole, _SIDE, _SIDE)
                except ImageError as exc:
                    sample = f"sample {keys[row]!r} (row {row}): " if packed else ""
                    reasons.append(f"{sample}field {name!r}: {exc}")
    return reasons
