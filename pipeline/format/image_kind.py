"""What kind of image a file's bytes hold, told from their first bytes (not from a file name), and
a Pillow image of any mode as 8-bit RGB (what the build's --max-side and the loader both need)."""

from __future__ import annotations

from typing import Any

import numpy as np

_MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"))


def image_format(data: Any) -> str | None:
    """``"JPEG"``, ``"PNG"`` or ``"WebP"`` from an image's first bytes; ``None`` for anything else."""
    head = bytes(data[:12])
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    return None


def pillow_rgb(image: Any) -> Any:
    """8-bit RGB of a Pillow image of any mode; a 16-bit grey image keeps its top 8 bits
    (``convert("RGB")`` would clip it to white)."""
    from PIL import Image

    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        grey = np.asarray(image).astype(np.int64) >> 8
        return Image.fromarray(np.clip(grey, 0, 255).astype(np.uint8), "L").convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")
