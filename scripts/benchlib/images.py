"""The image-decoding case: JPEG files in class folders, decoded and resized to 224 by each reader.

Data: ``rows`` photo-like pictures (smooth gradients, shapes and noise: they compress like
photos, about 50-80 KB at 500x375 and quality 90) in ``CLASSES`` folders; the same bytes as
our shards (``build_imagefolder``) and as webdataset shards (``.jpg`` + ``.cls`` members).

Readers, each giving batches of 256 ``uint8`` images ``(3, 224, 224)`` (shorter side resized to
224, centre crop) and their labels:

- this loader: ``make_loader(shards, images={"image": Images(224)})``: decoded in the workers;
- webdataset: ``WebDataset(urls, shardshuffle=100).shuffle(1000).decode("pil")`` then the same
  resize and crop in ``map_tuple``, ``batched(256)``, in a ``WebLoader``;
- ImageFolder: torchvision's ``ImageFolder`` with ``Resize(224), CenterCrop(224), PILToTensor()``
  where torchvision imports, else the same recipe written out (a map-style dataset that opens
  each file with Pillow), in a ``DataLoader(batch_size=256, shuffle=True)``: the classic per-file way;
- the decoder alone: our decoder on the files' bytes (read into memory first) in a tight loop in
  one process, no loader at all: what decoding costs.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .common import BATCH, WDS_SHARD_SHUFFLE, WDS_SHUFFLE

SIZE = 224
CLASSES = 100
PHOTO = (375, 500)  # height, width
QUALITY = 90
WDS_SHARD_SAMPLES = 1000


def _photo_jpeg(number: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(number)
    height, width = PHOTO
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = rng.uniform(0, 6, 4)
    image = np.stack([127 + 90 * np.sin(x / rng.uniform(20, 80) + phase[0]),
                      127 + 90 * np.cos(y / rng.uniform(20, 80) + phase[1]),
                      127 + 90 * np.sin((x + y) / rng.uniform(30, 90) + phase[2])], -1)
    for _ in range(6):  # a few discs, so that there are edges to code
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(20, 120)
        image[np.hypot(x - cx, y - cy) < r] = rng.uniform(0, 255, 3)
    image += rng.normal(0, 6, image.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=QUALITY)
    return out.getvalue()


def _write_photos(folder: str, start: int, stop: int) -> int:
    written = 0
    for number in range(start, stop):
        data = _photo_jpeg(number)
        path = Path(folder) / f"c{number % CLASSES:03d}" / f"{number:06d}.jpg"
        path.write_bytes(data)
        written += len(data)
    return written


def prepare_images(work: Path, rows: int) -> dict[str, Any]:
    """The image folder, our shards and webdataset's, under ``work``; their sizes."""
    import webdataset as wds

    import pipeline

    folder = work / "photos"
    for label in range(CLASSES):
        (folder / f"c{label:03d}").mkdir(parents=True, exist_ok=True)
    workers = max(os.cpu_count() or 1, 1)
    bounds = np.linspace(0, rows, workers * 4 + 1).astype(int)
    with ProcessPoolExecutor(workers) as pool:
        total = sum(pool.map(_write_photos, [str(folder)] * (len(bounds) - 1), bounds[:-1], bounds[1:]))
    pipeline.build_imagefolder(folder, work / "ours", shard_bytes=64 << 20, workers=workers, quiet=True)
    source = pipeline.ImageFolderSource(folder)
    (work / "wds").mkdir()
    per_shard = min(WDS_SHARD_SAMPLES, -(-rows // 8))  # at least 8 shards: one per worker is not enough
    with wds.ShardWriter(str(work / "wds" / "w-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for key, path, label in zip(source.keys, source.paths, source.labels):
            sink.write({"__key__": key, "jpg": path.read_bytes(), "cls": label})
    return {"folder": str(folder), "ours": str(work / "ours"), "wds": sorted(str(p) for p in (work / "wds").glob("*.tar")),
            "jpeg_bytes": total}


def _pil_transform() -> Any:
    """Shorter side to 224, centre crop, ``uint8`` CHW: torchvision's transforms where they import."""
    try:
        from torchvision import transforms

        return transforms.Compose([transforms.Resize(SIZE), transforms.CenterCrop(SIZE), transforms.PILToTensor()])
    except Exception:  # noqa: BLE001 - torchvision missing, or built for another torch
        return _resize_crop


def _resize_crop(image: Any) -> Any:
    import torch
    from PIL import Image

    width, height = image.size
    scale = SIZE / min(width, height)
    image = image.resize((max(SIZE, round(width * scale)), max(SIZE, round(height * scale))), Image.Resampling.BILINEAR)
    width, height = image.size
    left, top = (width - SIZE) // 2, (height - SIZE) // 2
    return torch.from_numpy(np.asarray(image.crop((left, top, left + SIZE, top + SIZE)))).permute(2, 0, 1)


class PerFileImages:
    """torchvision's ImageFolder, written out: class folders sorted, each item a file opened with Pillow."""

    def __init__(self, root: str) -> None:
        classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        self.items = [(str(path), label) for label, name in enumerate(classes)
                      for path in sorted((Path(root) / name).iterdir())]
        self.transform = _pil_transform()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as image:
            return self.transform(image.convert("RGB")), label


def ours_images_loader(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import pipeline

    loader = pipeline.make_loader(spec["data"], num_workers=spec["workers"], batch_size=BATCH, seed=0,
                                  images={"image": pipeline.Images(SIZE)})
    return loader, {"shuffle_buffer": loader.dataset.shuffle_buffer, "len": len(loader)}


def wds_images_loader(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import webdataset as wds

    dataset = (wds.WebDataset(spec["data"], shardshuffle=WDS_SHARD_SHUFFLE).shuffle(WDS_SHUFFLE).decode("pil")
               .to_tuple("jpg", "cls").map_tuple(_pil_transform(), lambda label: label).batched(BATCH))
    return wds.WebLoader(dataset, batch_size=None, num_workers=spec["workers"]), {"shards": len(spec["data"])}


def folder_images_loader(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from torch.utils.data import DataLoader

    try:
        from torchvision.datasets import ImageFolder

        dataset: Any = ImageFolder(spec["data"], transform=_pil_transform())
        recipe = "torchvision ImageFolder"
    except Exception:  # noqa: BLE001 - torchvision missing, or built for another torch
        dataset, recipe = PerFileImages(spec["data"]), "ImageFolder written out (torchvision does not import)"
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=spec["workers"]), {"recipe": recipe}


class DecoderLoop:
    """Our decoder over every file's bytes (read beforehand), in batches, in this process: no loader."""

    def __init__(self, folder: str) -> None:
        import pipeline

        source = pipeline.ImageFolderSource(folder)
        self.data = [path.read_bytes() for path in source.paths]
        self.labels = np.asarray(source.labels)
        self.spec = pipeline.Images(SIZE)

    def __iter__(self) -> Any:
        for start in range(0, len(self.data), BATCH):
            values = self.data[start:start + BATCH]
            out = np.empty(self.spec.batch_shape(len(values)), np.uint8)
            failed = self.spec.decode_into(values, out, None)
            assert not failed, failed
            yield out, self.labels[start:start + len(values)]


def decoder_loop(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from pipeline.stream.image_decoders import decoder

    return DecoderLoop(spec["data"]), {"decoder": decoder("auto").__name__}


IMAGE_LOADERS = {"ours_images": ours_images_loader, "wds_images": wds_images_loader,
                 "folder_images": folder_images_loader, "decoder_loop": decoder_loop}
