"""The ``ROOT/<class>/<file>.jpg`` layout of ``torchvision.datasets.ImageFolder``.

Classes are the subfolders of ``ROOT`` sorted by name, as ImageFolder sorts them, and a label is
the position of its class in that list; the list goes into the index's metadata
(``index.metadata["classes"]``), so that a label can be named again at training time. A
sample is ``{"image": the file's bytes, "label": int}``: the bytes are kept as they are (decode
them in the loader, see :class:`pipeline.Images`), unless ``max_side`` asks to shrink large
photos, which are then re-encoded as JPEG in the build's workers.

Files are found in each class folder and its subfolders (linked ones too), in name order; files
of other suffixes are left out with a warning that counts them. What a file holds is
told from its first bytes, not its extension (a PNG named ``.JPEG`` is a PNG): files that are
no JPEG, PNG or WebP images are an error counting them (naming five), before a shard is written.
"""

from __future__ import annotations

import io
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

from ...caller_warning import warn_caller
from ...format.errors import SampleError
from ...format.image_kind import image_format, pillow_rgb
from ...format.index import INDEX_NAME
from ...format.numbers import is_whole
from ...stream.image_decoders import check_whole
from ..rows import RowBlock, key_for_name
from ..source import FileRowsSource
from .class_list import given_classes, warn_of_renumbered_numbers

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
#: the subfolders of ROOT read as two sets (``ROOT/train`` + ``ROOT/val``), and the set each makes
SPLIT_FOLDERS = {"train": "train", "val": "validation", "validation": "validation"}
SPLIT_NAMES = {*SPLIT_FOLDERS, "test"}  # class folders so named, holding folders, are split folders: refused
def class_folders(root: Path) -> list[str]:
    """The class names of an image folder: its subfolders (not hidden), sorted."""
    if not root.is_dir():
        what = "is a file, not a folder: pass the folder of class folders" if root.exists() else "no such folder"
        raise FileNotFoundError(f"{root}: {what} (ROOT/<class>/<image>.jpg)")
    names = sorted(entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith("."))
    if not names:
        raise FileNotFoundError(f"{root}: no class folders (ROOT/<class>/<image>.jpg)")
    for name in names:
        if any((root / name / sub / INDEX_NAME).is_file() for sub in ("", "train", "validation")):
            raise SampleError(f"{root / name}: a shard set (an earlier build written into the folder it reads?), not "
                              f"a class folder: it would be read as class {name!r}; write the shards outside {root}, "
                              f"and move this set out of it")
    return names

#: The JPEG quality of images that ``max_side`` shrinks, unless another is given.
DEFAULT_QUALITY = 90


def _holds_folders(folder: Path) -> bool:
    return any(entry.is_dir() for entry in os.scandir(folder))


def split_folders(root: Path) -> dict[str, Path] | None:
    """``{"train": ROOT/train, "validation": ROOT/val}`` when ROOT holds a train folder and a
    val (or validation) folder, each of class folders; ``None`` for a plain image folder. Other
    folders beside them (a ``test/``) are refused: they would be left out without a word."""
    found = {split: root / name for name, split in SPLIT_FOLDERS.items() if (root / name).is_dir()}
    if set(found) != {"train", "validation"}:
        return None
    others = [name for name in class_folders(root) if root / name not in found.values()]
    if others:
        raise SampleError(f"{root}: holds train/ and val/, which build two sets, and also the folders {others}, "
                          f"which would be left out: build each of them on its own (its labels are the training "
                          f"set's when it holds the same class folders), or move them out of {root}")
    return found


def image_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """The image files under ``folder`` (by suffix), in path order, following linked folders
    (each real folder once: a link loop is walked once), and the other files left out (another
    suffix, a link to nothing). Hidden files and folders are neither: a ``.thumbnails`` folder
    is no data, as a hidden class folder is no class."""
    images: list[Path] = []
    others: list[Path] = []
    seen: set[str] = set()

    def walk(path: Path) -> None:
        real = os.path.realpath(path)
        if real in seen:
            return
        seen.add(real)
        for entry in sorted(os.scandir(path), key=lambda entry: entry.name):
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                walk(Path(entry.path))
            elif entry.is_file() and entry.name.lower().endswith(IMAGE_SUFFIXES):
                images.append(Path(entry.path))
            else:
                others.append(Path(entry.path))
    walk(folder)
    return images, others


def _head(path: Path) -> bytes:
    with open(path, "rb") as file:
        return file.read(12)


def _refuse_non_images(paths: list[Path]) -> None:
    """Raise, counting them and naming the first five, when files named as images are none (a web page saved as .jpg):
    told before a shard is written, not one build at a time, each stopping part way. Their
    first bytes are read by a few threads at once (a file's open is the cost, on a network
    file system most of all)."""
    bad = []
    with ThreadPoolExecutor(8) as pool:
        for first in range(0, len(paths), 4096):  # a batch at a time: a future for each of a million is GBs
            batch = paths[first:first + 4096]
            bad += [(path, head) for path, head in zip(batch, pool.map(_head, batch)) if image_format(head) is None]
    if bad:
        shown = "; ".join(f"{path} (it starts with {head[:8]!r})" for path, head in bad[:5])
        raise SampleError(f"{len(bad)} file(s) are not JPEG, PNG or WebP images: {shown}{'; ...' if len(bad) > 5 else ''}"
                          f"; replace them with whole images, or remove them")


def _warn_of_a_root_one_level_too_deep(root: Path, found: list[str], classes: list[str] | None) -> None:
    """Images beside the class folders are no class's, so are left out: a warning, as they
    are most often those of a class folder given as ROOT (its subfolder then the one class)."""
    loose = sorted(entry.name for entry in os.scandir(root) if entry.is_file() and not entry.name.startswith(".")
                   and entry.name.lower().endswith(IMAGE_SUFFIXES))
    if loose:
        warn_caller(f"{root}: left out {len(loose)} image(s) beside its class folders (e.g. {root / loose[0]}): an "
                    f"image's class is the folder it is in, ROOT/<class>/<image>; if {root} is itself a class "
                    f"folder, pass the folder that holds it")
    elif classes is None and len(found) == 1:
        warn_caller(f"{root}: one class folder only ({found[0]!r}): every label is 0; if {root} is a class "
                    f"folder, pass the folder that holds it")


def _left_out(root: Path, others: list[Path]) -> str:
    """A warning of the files an image folder's build leaves out, by kind, with an example."""
    kinds = Counter("a link to nothing" if not path.exists() else path.suffix.lower() or "no suffix"
                    for path in others)
    listed = ", ".join(f"{kind}: {count}" for kind, count in sorted(kinds.items()))
    return (f"{root}: left out {len(others)} file(s) that are not {'/'.join(IMAGE_SUFFIXES)} images ({listed}; e.g. "
            f"{others[0]}); convert them to JPEG or PNG (or mend the links) to include them")


class ImageFolderSource(FileRowsSource):
    """The images of ``root``'s class folders, ``{"image": bytes, "label": int}``, keyed by their
    path (``cat/0001.jpg`` -> ``cat_0001``). ``classes`` fixes the class list (a validation
    folder takes its training folder's, so that labels agree; a class it lacks is fine, one
    the list lacks an error); ``max_side`` shrinks images whose longer side exceeds it,
    re-encoded as JPEG of ``quality`` (:data:`DEFAULT_QUALITY` unless given, and only given
    with ``max_side``)."""

    row_lists = ("paths", "labels", "keys", "sizes")

    fields = ("image", "label")

    def __init__(self, root: str | os.PathLike[str], classes: Sequence[str] | None = None,
                 max_side: int | None = None, quality: int | None = None) -> None:
        self.root = Path(root)
        found = class_folders(self.root)
        splits = [name for name in found if name.lower() in SPLIT_NAMES and _holds_folders(self.root / name)]
        if splits:
            raise SampleError(f"{self.root}: {splits} look like split folders of class folders, not classes; "
                              f"build_imagefolder (build imagefolder) reads a ROOT of train/ and val/ (or validation/) "
                              f"as two sets, else build each split folder on its own")
        classes = given_classes(classes)
        self.classes = list(found if classes is None else classes)
        if classes is None:
            warn_of_renumbered_numbers(self.classes, str(self.root), "give the classes in the order of their numbers "
                                       "(classes=[...], --classes 0,1,2,...) to store those numbers")
        _warn_of_a_root_one_level_too_deep(self.root, found, classes)
        unknown = sorted(set(found) - set(self.classes))
        if unknown:
            raise SampleError(f"{self.root}: class folders {unknown} are not among the classes {self.classes}")
        if max_side is not None and max_side < 1:
            raise ValueError(f"max_side must be >= 1, got {max_side}")
        if quality is not None and max_side is None:
            raise ValueError(f"quality={quality!r} is the JPEG quality of the images that max_side= shrinks: give "
                             f"max_side too (without it, images are stored as they are)")
        if quality is not None and (not is_whole(quality) or not 1 <= quality <= 100):
            raise ValueError(f"quality must be a whole number from 1 to 100, got {quality!r}")
        self.max_side, self.quality = max_side, DEFAULT_QUALITY if quality is None else quality
        self.paths: list[Path] = []
        self.labels: list[int] = []
        left_out: list[Path] = []
        for name in found:
            images, others = image_files(self.root / name)
            self.paths += images
            self.labels += [self.classes.index(name)] * len(images)
            left_out += others
        if left_out:
            warn_caller(_left_out(self.root, left_out))
        if not self.paths:
            raise FileNotFoundError(f"{self.root}: no {'/'.join(IMAGE_SUFFIXES)} files in its class folders")
        self.keys = self._keys()
        self.sizes = [path.stat().st_size for path in self.paths]
        empty = [path for path, size in zip(self.paths, self.sizes) if not size]
        if empty:  # told of all at once, before a shard is written, not one build at a time
            raise SampleError(f"{len(empty)} image file(s) are empty (0 bytes): {', '.join(map(str, empty[:5]))}"
                              f"{', ...' if len(empty) > 5 else ''}; copy them again, or remove them")
        _refuse_non_images(self.paths)
        if classes is None:
            labelled = set(self.labels)
            unused = [name for name in found if self.classes.index(name) not in labelled]
            if unused:
                warn_caller(f"{self.root}: class folders {unused} hold no images: their labels have no samples")
        self.metadata = {"classes": self.classes}
        self.description = f"image folder {self.root} ({len(self.classes)} classes)"

    def _keys(self) -> list[str]:
        """Each file's key: its path below ROOT, as a key (see :func:`key_for_name`)."""
        keys: list[str] = []
        taken: set[str] = set()
        for path in self.paths:
            keys.append(key_for_name(path.relative_to(self.root).with_suffix("").as_posix(), taken))
            taken.add(keys[-1])
        return keys

    def __len__(self) -> int:
        return len(self.paths)

    def identity(self, digest: Any, start: int, stop: int) -> None:
        """Its files' keys and labels, and how they are shrunk (a resume with another
        ``max_side`` writes every shard again)."""
        super().identity(digest, start, stop)
        digest.update(f"{self.max_side}:{self.quality}".encode())

    def read(self, start: int, stop: int) -> RowBlock:
        images = [self._image(path) for path in self.paths[start:stop]]
        return RowBlock({"image": images, "label": self.labels[start:stop]}, self.keys[start:stop])

    def _image(self, path: Path) -> bytes:
        data = path.read_bytes()
        if image_format(data) is None:
            raise SampleError(f"{path}: not a JPEG, PNG or WebP image (it starts with {data[:8]!r}): replace it with a "
                              f"whole image, or remove it")
        return data if self.max_side is None else shrink(data, self.max_side, self.quality, str(path))


def shrink(data: bytes, max_side: int, quality: int, where: str) -> bytes:
    """``data`` as it is when its longer side is at most ``max_side``, else scaled down to it
    (aspect kept) and encoded as a JPEG of ``quality``."""
    from PIL import Image  # the build's only use of Pillow: needed for --max-side alone

    try:
        check_whole(data)  # Pillow would shrink a damaged PNG into a sound JPEG, its damage then unseen
        with Image.open(io.BytesIO(data)) as image:
            if max(image.size) <= max_side:
                return data
            image.draft("RGB", (max_side, max_side))  # a JPEG decodes at a fraction of its size: faster
            image.load()
            rgb = pillow_rgb(image)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise SampleError(f"{where}: cannot read the image to shrink it: {exc}") from None
    rgb.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    rgb.save(out, "JPEG", quality=quality)
    return out.getvalue()

