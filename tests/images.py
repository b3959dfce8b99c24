"""Images for the tests: smooth photo-like pictures (so that decoders and resizes can be compared
within a small tolerance), encoded in memory or laid out as class folders."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A smooth RGB picture: gradients and a soft disc, different for each seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = rng.uniform(0, 6, 3)
    red = 127 + 100 * np.sin(x / max(width, 1) * 3 + phase[0])
    green = 127 + 100 * np.cos(y / max(height, 1) * 3 + phase[1])
    disc = np.hypot(x - width * rng.uniform(0.3, 0.7), y - height * rng.uniform(0.3, 0.7)) < min(height, width) / 4
    blue = np.where(disc, 230.0, 40.0 + 60 * np.sin(phase[2]))
    return np.clip(np.stack([red, green, blue], -1), 0, 255).astype(np.uint8)


def encoded(image: Image.Image | np.ndarray, fmt: str = "JPEG", **options) -> bytes:
    """``image`` in ``fmt`` (JPEG at quality 95 unless told)."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    if fmt == "JPEG":
        options.setdefault("quality", 95)
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def image_folder(root: Path, classes: dict[str, int], size: tuple[int, int] = (48, 64), png_every: int = 4) -> dict:
    """``root/<class>/<n>.jpg`` (every ``png_every``-th a PNG), ``classes[name]`` images each;
    ``{relative path: bytes}`` of what was written."""
    written = {}
    number = 0
    for name, count in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for _ in range(count):
            fmt, suffix = ("PNG", "png") if number % png_every == 0 else ("JPEG", "jpg")
            data = encoded(photo(*size, seed=number), fmt)
            path = root / name / f"{number:04d}.{suffix}"
            path.write_bytes(data)
            written[path.relative_to(root).as_posix()] = data
            number += 1
    return written
