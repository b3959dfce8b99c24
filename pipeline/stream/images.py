"""Decode image fields (JPEG, PNG, WebP bytes) inside the workers, into one batched ``uint8`` buffer.

``ShardDataset(..., images={"image": Images(224)})`` replaces a field of image bytes with a
tensor ``(N, 3, H, W)`` (``(N, H, W, 3)`` with ``channels_last``) of RGB ``uint8``, written
straight into the unit's shared buffer: one decoder call, one crop-and-resize and one copy per
image, and no per-sample Python besides. Grey, palette, alpha, CMYK and 16-bit images come out
as 8-bit RGB.

Decoders, measured here on 500x375 JPEGs of quality 90 (decode, resize to 224 and crop, one
thread): OpenCV (``opencv-python-headless``, libjpeg-turbo) 0.74 ms an image, Pillow 1.49 ms.
``backend="auto"`` takes OpenCV where it imports, else Pillow (``pip install 'pipeline[images]'``
brings both).

Random crops and flips are drawn from a counter-based hash of ``(seed, epoch, the sample's place
in the epoch)``: the same in any number of workers, on any machine, and after a resume (for
shards without an index, the place is the sample's number in its worker's stream: the same for
the same number of workers).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..format.numbers import is_whole
from .image_decoders import ImageError, decoder

CROPS = ("center", "random", "resize")
BACKENDS = ("auto", "opencv", "pillow")
_ATTEMPTS = 10  # tries of a random crop before the fallback, as torchvision's RandomResizedCrop
_DRAWS = 4 * _ATTEMPTS + 1  # per attempt: area, ratio, x, y; then the flip
MISSING_IMAGE = "the sample lacks this field"


@dataclass(frozen=True)
class Images:
    """How to decode one image field: to ``size`` (an int for squares, or ``(height, width)``).

    ``crop``: ``"center"`` (the largest centred box of the output's shape, times
    ``crop_fraction``: 0.875 is the classic resize-256-crop-224), ``"random"`` (a random box of
    ``scale`` of the area and ``ratio`` of aspect, as RandomResizedCrop) or ``"resize"`` (the
    whole image, stretched). ``flip``: mirror half of the images at random. ``channels_last``:
    ``(N, H, W, 3)`` instead of ``(N, 3, H, W)``. ``backend``: ``"auto"``, ``"opencv"`` or ``"pillow"``.
    """

    size: int | tuple[int, int]
    crop: str = "center"
    crop_fraction: float = 1.0
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    channels_last: bool = False
    backend: str = "auto"

    def __post_init__(self) -> None:
        # plain ints, floats and tuples (a list, or NumPy's ints, would neither hash nor go through JSON)
        object.__setattr__(self, "size", _size(self.size))
        for name in ("scale", "ratio"):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        object.__setattr__(self, "crop_fraction", float(self.crop_fraction))
        height, width = self.shape
        if height < 1 or width < 1:
            raise ValueError(f"Images size must be positive, got {self.size!r}")
        if self.crop not in CROPS:
            raise ValueError(f"Images crop must be one of {CROPS}, got {self.crop!r}")
        if not 0 < self.crop_fraction <= 1:
            raise ValueError(f"Images crop_fraction must be in (0, 1], got {self.crop_fraction}")
        if not 0 < self.scale[0] <= self.scale[1] <= 1 or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"Images scale must lie in (0, 1] and ratio be positive, got {self.scale}, {self.ratio}")
        if self.backend not in BACKENDS:
            raise ValueError(f"Images backend must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("flip", "channels_last"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"Images {name} must be True or False, got {getattr(self, name)!r}")
        unused = [name for name, crops in (("crop_fraction", ("center",)), ("scale", ("random",)),
                                           ("ratio", ("random",))) if self.crop not in crops and
                  getattr(self, name) != next(f.default for f in dataclasses.fields(self) if f.name == name)]
        if unused:
            raise ValueError(f"Images {'= and '.join(unused)}= has no effect with crop={self.crop!r}: crop_fraction "
                             f"applies to crop='center', scale and ratio to crop='random'; leave it out, or choose "
                             f"that crop")
        decoder(self.backend)  # a missing decoder is an error here, not in a worker

    def __repr__(self) -> str:
        """``pipeline.Images(...)`` with the fields that differ from their defaults: a valid call."""
        changed = [f"{field.name}={getattr(self, field.name)!r}" for field in dataclasses.fields(self)[1:]
                   if getattr(self, field.name) != field.default]
        return f"pipeline.Images({', '.join([repr(self.size), *changed])})"

    @property
    def shape(self) -> tuple[int, int]:
        """``(height, width)`` of the output."""
        size = self.size
        return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))

    @property
    def random(self) -> bool:
        return self.crop == "random" or self.flip

    def batch_shape(self, rows: int) -> tuple[int, ...]:
        height, width = self.shape
        return (rows, height, width, 3) if self.channels_last else (rows, 3, height, width)

    def decode_into(self, values: Sequence[Any], out: np.ndarray, seeds: np.ndarray | None) -> dict[int, str]:
        """Decode ``values`` (bytes) into ``out`` (``batch_shape(len(values))``); random draws from
        ``seeds`` (one ``uint64`` per row). Returns the rows that failed, with the reason."""
        draws = uniforms(seeds, _DRAWS) if self.random and seeds is not None else None
        decode = decoder(self.backend)
        height, width = self.shape
        failed: dict[int, str] = {}
        for row, data in enumerate(values):
            try:
                if data is None:
                    raise ImageError(MISSING_IMAGE)
                if not isinstance(data, (bytes, bytearray, memoryview)):
                    raise ImageError(f"not image bytes but {type(data).__name__}")
                image = decode(data, functools.partial(self.box, draws=None if draws is None else draws[row]),
                               width, height)
            except ImageError as exc:
                failed[row] = str(exc)
                continue
            if draws is not None and self.flip and draws[row, -1] < 0.5:
                image = image[:, ::-1]
            out[row] = image if self.channels_last else image.transpose(2, 0, 1)
        return failed

    def box(self, width: int, height: int, draws: np.ndarray | None) -> tuple[int, int, int, int]:
        """``(left, top, box width, box height)`` of the part of a ``width`` x ``height`` image
        that becomes the output."""
        out_height, out_width = self.shape
        if self.crop == "resize":
            return 0, 0, width, height
        if self.crop == "random" and draws is not None:
            found = self._random_box(width, height, draws)
            if found is not None:
                return found
            return _fallback_box(width, height, self.ratio)
        aspect = out_width / out_height
        box_width = min(width, height * aspect) * self.crop_fraction
        box_height = box_width / aspect
        box_w, box_h = max(int(round(box_width)), 1), max(int(round(box_height)), 1)
        return (width - box_w) // 2, (height - box_h) // 2, box_w, box_h

    def _random_box(self, width: int, height: int, draws: np.ndarray) -> tuple[int, int, int, int] | None:
        area = width * height
        low, high = math.log(self.ratio[0]), math.log(self.ratio[1])
        for attempt in range(_ATTEMPTS):
            u_area, u_ratio, u_x, u_y = draws[4 * attempt:4 * attempt + 4]
            target = area * (self.scale[0] + u_area * (self.scale[1] - self.scale[0]))
            aspect = math.exp(low + u_ratio * (high - low))
            box_w = int(round(math.sqrt(target * aspect)))
            box_h = int(round(math.sqrt(target / aspect)))
            if 0 < box_w <= width and 0 < box_h <= height:
                return int(u_x * (width - box_w + 1)), int(u_y * (height - box_h + 1)), box_w, box_h
        return None


def _fallback_box(width: int, height: int, ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """RandomResizedCrop's box when no attempt fits: centred, of the image's aspect clamped to ``ratio``."""
    aspect = width / height
    if aspect < ratio[0]:
        box_w, box_h = width, max(int(round(width / ratio[0])), 1)
    elif aspect > ratio[1]:
        box_w, box_h = max(int(round(height * ratio[1])), 1), height
    else:
        box_w, box_h = width, height
    return (width - box_w) // 2, (height - box_h) // 2, box_w, box_h


def uniforms(seeds: np.ndarray, count: int) -> np.ndarray:
    """``count`` uniform floats in [0, 1) per seed (``(len(seeds), count)``): splitmix64 of the
    seed and the draw's number, vectorised, so that a row's draws depend on its seed alone."""
    with np.errstate(over="ignore"):
        x = seeds.astype(np.uint64)[:, None] + (np.arange(1, count + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _size(size: Any) -> int | tuple[int, int]:
    """An output size as given: an int (a square) or ``(height, width)``; anything else (a string,
    whose characters would pass for numbers, a float, three numbers) is an error, not a shape."""
    if is_whole(size):
        return int(size)
    if isinstance(size, Sequence) and not isinstance(size, (str, bytes)) and len(size) == 2 and all(
            is_whole(v) for v in size):
        return int(size[0]), int(size[1])
    raise ValueError(f"Images size must be an int (a square) or (height, width), two ints; got {size!r}")

