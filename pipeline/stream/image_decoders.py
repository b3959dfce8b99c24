"""The two image decoders behind :class:`~pipeline.stream.images.Images`: OpenCV and Pillow.

Each takes an image's bytes, a function that says which box of the decoded image becomes the
output, and the output's size, and returns an ``(height, width, 3)`` RGB ``uint8`` array. Both
give 8-bit RGB for grey, palette, alpha, CMYK and 16-bit images; both refuse a JPEG that was
cut short (libjpeg would fill the missing rows with grey and only warn), a PNG whose chunks fail
their checksums or that was cut short (Pillow decodes damaged pixel data without a word, and a
cut one too where a script set its ``LOAD_TRUNCATED_IMAGES``), and a WebP shorter than its
header says.
Damage inside a JPEG's or a lossy WebP's data cannot be seen: neither format has a checksum.
"""

from __future__ import annotations

import functools
import io
import math
import re
import zlib
from typing import Any, Callable

import numpy as np

from ..format.image_kind import image_format, pillow_rgb

#: ``box_of(image width, image height)`` -> ``(left, top, box width, box height)``
BoxOf = Callable[[int, int], tuple[int, int, int, int]]
Decoder = Callable[[Any, BoxOf, int, int], np.ndarray]
_JPEG, _END_OF_IMAGE = b"\xff\xd8\xff", b"\xff\xd9"
_PNG = b"\x89PNG\r\n\x1a\n"
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")  # after a scan: FF 00 is a stuffed byte, FF Dn a restart
_REDUCED: dict[int, int] = {}  # DCT scale -> OpenCV's flag (filled on first use: cv2 is optional)
#: The most pixels an image may have where Pillow is not installed: its own default limit (twice
#: its ``MAX_IMAGE_PIXELS``), for both backends: a PNG of a few MB can say 30000x30000 pixels,
#: which OpenCV decodes into 2.7 GB.
MAX_PIXELS = 2 * 89_478_485


class ImageError(ValueError):
    """An image that cannot be decoded: the reason, without where it came from (the caller knows)."""


@functools.lru_cache(maxsize=None)
def decoder(backend: str) -> Decoder:
    """The decoding function of ``backend`` (``"auto"``: OpenCV where it imports, else Pillow)."""
    if backend in ("auto", "opencv"):
        try:
            import cv2

            _REDUCED.update({2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8})
            return opencv_decode
        except ImportError:
            if backend == "opencv":
                raise ImportError("Images(backend='opencv') needs OpenCV: pip install opencv-python-headless") from None
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise ImportError("decoding images needs Pillow or OpenCV: pip install 'pipeline[images]'") from None
    return pillow_decode


@functools.lru_cache(maxsize=None)
def single_threaded(pid: int) -> None:
    """OpenCV on one thread in this process (``pid``: once per process), as torch is in a
    DataLoader worker: the workers already keep the cores busy, and more threads than cores
    only take turns."""
    try:
        import cv2
    except ImportError:
        return
    cv2.setNumThreads(1)


def check_whole(data: Any) -> tuple[int, int] | None:
    """Refuse an image cut short or whose checksums fail (see the module docstring); return a
    JPEG's ``(width, height)`` (see :func:`check_jpeg`)."""
    head = bytes(memoryview(data)[:30])
    if head.startswith(_PNG):
        check_pixels(int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big"))  # (IHDR's)
        _check_png(data)
    elif head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        size = 8 + int.from_bytes(head[4:8], "little")  # the RIFF header's 8 bytes and what it says follows
        if len(data) < size:
            raise ImageError(f"a truncated WebP ({len(data)} bytes, its header says {size})")
        check_pixels(*webp_size(head))
    size = check_jpeg(data)
    if size is not None:
        check_pixels(*size)
    return size


def webp_size(head: bytes) -> tuple[int, int]:
    """A WebP's canvas ``(width, height)`` from its first chunk's header ((0, 0) if unknown)."""
    kind = head[12:16]
    if kind == b"VP8X":  # extended: the canvas, 24 bits each, less one
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    if kind == b"VP8L" and head[20] == 0x2F:  # lossless: 14 bits each, less one
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, (bits >> 14 & 0x3FFF) + 1
    if kind == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":  # lossy: the key frame's 14 bits each
        return int.from_bytes(head[26:28], "little") & 0x3FFF, int.from_bytes(head[28:30], "little") & 0x3FFF
    return 0, 0


def check_pixels(width: int, height: int) -> None:
    """Refuse an image of more pixels than Pillow would decode (as its ``MAX_IMAGE_PIXELS`` says:
    ``None`` lifts the limit, for both backends)."""
    try:
        from PIL import Image
    except ImportError:
        limit: int | None = MAX_PIXELS
    else:
        limit = None if Image.MAX_IMAGE_PIXELS is None else 2 * int(Image.MAX_IMAGE_PIXELS)
    if limit is not None and width * height > limit:
        raise ImageError(f"an image of {width}x{height} pixels, more than {limit} (Pillow's limit, twice "
                         f"PIL.Image.MAX_IMAGE_PIXELS, for both backends): a decompression bomb, or a picture far "
                         f"larger than any input of a model; scale it down before building the shards, or set "
                         f"MAX_IMAGE_PIXELS = None where the images are trusted")


def _check_png(data: Any) -> None:
    """Walk a PNG's chunks to its IEND, checking each one's CRC."""
    view = memoryview(data)
    at = len(_PNG)
    while at + 12 <= len(view):
        end = at + 12 + int.from_bytes(view[at:at + 4], "big")
        if end > len(view):
            break
        kind = bytes(view[at + 4:at + 8])
        if zlib.crc32(view[at + 4:end - 4]) != int.from_bytes(view[end - 4:end], "big"):
            raise ImageError(f"a damaged PNG ({len(data)} bytes: its {kind.decode('latin-1')} chunk at byte {at} "
                             f"fails its checksum)")
        if kind == b"IEND":
            return
        at = end
    raise ImageError(f"a truncated PNG ({len(data)} bytes, it ends before its IEND chunk)")


def check_jpeg(data: Any) -> tuple[int, int] | None:
    """``(width, height)`` from a JPEG's frame header (read before decoding it, to pick a DCT
    scale), or ``None`` when ``data`` is not a JPEG (or has no frame header); raise when it was
    cut short. One walk over its segments from the start must reach the end-of-image marker of
    the first image; whatever follows it (a video of a "motion photo", a second image) is not
    looked at. A scan's entropy-coded bytes hold no marker (an ``FF`` in them is followed by
    ``00`` or a restart marker), so the next marker after a scan is found with one search."""
    view = memoryview(data)
    if bytes(view[:3]) != _JPEG:
        return None
    size, scanned, huffman, coded = None, False, False, 0
    at = 2
    while at + 4 <= len(view):
        marker = view[at + 1]
        if view[at] != 0xFF:  # stray bytes between segments: libjpeg skips them to the next marker, and so do we
            found = _NEXT_MARKER.search(view, at)
            if found is None:
                break
            at = found.start()
            continue
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker == 0xD9:
            return _coded_enough(size, huffman, coded, len(data))
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # restart markers, TEM: no length
            at += 2
            continue
        if not scanned and size is None and 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) \
                and at + 9 <= len(view):  # the frame header, which comes before the first scan
            size = int.from_bytes(view[at + 7:at + 9], "big"), int.from_bytes(view[at + 5:at + 7], "big")
            huffman = marker in (0xC0, 0xC1, 0xC2)
        at += 2 + int.from_bytes(view[at + 2:at + 4], "big")
        if marker == 0xDA:  # a scan: its data runs to the next marker
            scanned = True
            found = _NEXT_MARKER.search(view, at)
            if found is None:
                break
            coded += found.start() - at
            at = found.start()
    if bytes(view[at:at + 2]) == _END_OF_IMAGE:
        return _coded_enough(size, huffman, coded, len(data))
    raise ImageError(f"a truncated JPEG ({len(data)} bytes, it ends before its end-of-image marker)")


def _coded_enough(size: tuple[int, int] | None, huffman: bool, coded: int, length: int) -> tuple[int, int] | None:
    """``size``, unless a Huffman-coded JPEG's scans hold fewer bytes than its frame header's
    size needs: every block of 8x8 pixels takes a bit at least (its DC code), in a component of
    at least a quarter of the blocks of the full size in each axis; fewer is a damaged header,
    which libjpeg would decode into grey fill with a warning (and memory for the size claimed)."""
    if size is None or not huffman:
        return size
    least_bits = -(-size[0] // 32) * -(-size[1] // 32)
    if coded * 8 < least_bits:
        raise ImageError(f"a damaged JPEG ({length} bytes: its frame header says {size[0]}x{size[1]} pixels, which "
                         f"take {least_bits // 8} bytes of image data at least, and it holds {coded})")
    return size


def _not_an_image(data: Any) -> ImageError:
    kind = image_format(data)
    if kind is not None:
        return ImageError(f"a {kind} that cannot be decoded ({len(data)} bytes: truncated or damaged)")
    return ImageError(f"not a JPEG, PNG or WebP image (it starts with {bytes(data[:8])!r}, {len(data)} bytes)")


def opencv_decode(data: Any, box_of: BoxOf, width: int, height: int) -> np.ndarray:
    import cv2

    # a JPEG much larger than the output decodes at 1/2, 1/4 or 1/8 of its size, in the DCT (far faster)
    size = check_whole(data)
    reduce = 1
    if size is not None:
        _, _, box_w, box_h = box_of(*size)
        reduce = next((r for r in (8, 4, 2) if min(box_w / width, box_h / height) >= r), 1)
    rgb = getattr(cv2, "IMREAD_COLOR_RGB", None) if reduce == 1 else None  # (OpenCV 4.11 on; else read as BGR)
    flags = _REDUCED[reduce] if reduce > 1 else cv2.IMREAD_COLOR if rgb is None else rgb
    try:  # EXIF orientation is ignored, as Pillow (and so torchvision's ImageFolder) ignores it
        image = cv2.imdecode(np.frombuffer(data, np.uint8), flags | cv2.IMREAD_IGNORE_ORIENTATION) if len(data) else None
    except cv2.error as exc:
        raise ImageError(f"cannot decode: {' '.join(str(exc).split())}") from None
    if image is None:
        raise _not_an_image(data)
    if size is None or reduce == 1:
        left, top, box_w, box_h = box_of(image.shape[1], image.shape[0])
    else:  # the box in the reduced image's pixels: exactly 1/reduce of the full ones, within the image
        full_left, full_top, full_w, full_h = box_of(*size)
        left, top = min(round(full_left / reduce), image.shape[1] - 1), min(round(full_top / reduce), image.shape[0] - 1)
        box_w = min(max(round(full_w / reduce), 1), image.shape[1] - left)
        box_h = min(max(round(full_h / reduce), 1), image.shape[0] - top)
    box = image[top:top + box_h, left:left + box_w]
    # bilinear reads 2x2 pixels, enough below a 2x reduction; beyond, area averaging keeps it from aliasing (at
    # 3x the cost: measured 550 against 165 us an image from 375 to 224 pixels)
    shrink = min(box_w / width, box_h / height)
    out = cv2.resize(box, (width, height), interpolation=cv2.INTER_AREA if shrink >= 2 else cv2.INTER_LINEAR)
    return out if rgb is not None else cv2.cvtColor(out, cv2.COLOR_BGR2RGB)  # the reduced reads give BGR only


def pillow_decode(data: Any, box_of: BoxOf, width: int, height: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    check_whole(data)
    try:
        image = Image.open(io.BytesIO(data))
        full_w, full_h = image.size
        left, top, box_w, box_h = box_of(full_w, full_h)
        factor = min(box_w / width, box_h / height)
        if factor >= 2:  # a JPEG decodes at 1/2, 1/4 or 1/8 of its size, in the DCT (far faster): the box stays larger
            image.draft("RGB", (math.ceil(full_w / factor), math.ceil(full_h / factor)))
        x_scale, y_scale = image.size[0] / full_w, image.size[1] / full_h
        image.load()  # decode here, where its errors are caught (open only reads the header)
        image = pillow_rgb(image)
    except UnidentifiedImageError:
        raise _not_an_image(data) from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ImageError(f"cannot decode: {exc}") from None
    box = (left * x_scale, top * y_scale, (left + box_w) * x_scale, (top + box_h) * y_scale)
    return np.asarray(image.resize((width, height), Image.Resampling.BILINEAR, box=box))
