"""Images decoded in the workers: geometry, decoders, determinism, and what bad images do."""

from __future__ import annotations

import dataclasses
import logging
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import pipeline
from pipeline import Images, make_loader
from pipeline.stream.image_decoders import check_jpeg, check_pixels, webp_size
from pipeline.stream.images import uniforms
from pipeline.stream.material import row_seeds
from tests.images import encoded, image_folder, photo

BACKENDS = ["opencv", "pillow"]


def decode(spec: Images, values: list, epoch: int = 0) -> tuple[np.ndarray, dict]:
    out = np.zeros(spec.batch_shape(len(values)), np.uint8)
    failed = spec.decode_into(values, out, row_seeds(0, epoch, np.arange(len(values))))
    return out, failed


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_center_crop_matches_pillow_cropping_and_resizing_the_same_box(backend: str) -> None:
    picture = photo(150, 200)
    spec = Images((60, 40), crop="center", crop_fraction=0.8, backend=backend, channels_last=True)
    left, top, width, height = spec.box(200, 150, None)
    assert (width, height) == (80, 120) and (left, top) == (60, 15)  # the widest 2:3 box, times 0.8, centred
    reference = np.asarray(Image.fromarray(picture).resize((40, 60), Image.Resampling.BILINEAR,
                                                           box=(left, top, left + width, top + height)))
    out, failed = decode(spec, [encoded(picture, "PNG")])
    assert not failed and np.abs(out[0].astype(int) - reference).mean() < 3


def test_opencv_before_4_11_decodes_full_scale_images_in_rgb_too(monkeypatch) -> None:
    """OpenCV 4.10, which the images extra allows, has no IMREAD_COLOR_RGB: every image decoded at
    full scale was an AttributeError."""
    import cv2

    pictures = [encoded(photo(60, 80), "PNG"), encoded(photo(70, 50), "JPEG")]
    spec = Images(32, backend="opencv")
    expected, failed = decode(spec, pictures)
    assert not failed
    monkeypatch.delattr(cv2, "IMREAD_COLOR_RGB")
    out, failed = decode(spec, pictures)
    assert not failed and np.array_equal(out, expected)


def test_random_boxes_keep_their_area_and_aspect_within_bounds_and_fall_back_to_a_centred_box() -> None:
    spec = Images(32, crop="random", scale=(0.25, 0.5), ratio=(0.5, 2.0))
    draws = uniforms(np.arange(500, dtype=np.uint64), 41)
    for row in draws:
        left, top, width, height = spec.box(300, 200, row)
        assert 0 <= left and left + width <= 300 and 0 <= top and top + height <= 200
        assert 0.24 <= width * height / 60000 <= 0.51 and 0.49 <= width / height <= 2.05
    assert spec.box(1000, 10, np.full(41, 0.99)) == (490, 0, 20, 10)  # nothing fits: the aspect clamped to 2


def test_draws_depend_on_the_seed_epoch_and_place_alone() -> None:
    places = np.array([5, 6, 7])
    assert (row_seeds(1, 2, places) == row_seeds(1, 2, places)).all()
    assert (uniforms(row_seeds(1, 2, places[1:]), 3) == uniforms(row_seeds(1, 2, places), 3)[1:]).all()
    assert len({tuple(row_seeds(s, e, places)) for s, e in [(1, 2), (1, 3), (2, 2)]}) == 3
    values = uniforms(np.arange(10000, dtype=np.uint64), 2)
    assert values.min() >= 0 and values.max() < 1 and abs(values.mean() - 0.5) < 0.01


def _cmyk_jpeg() -> bytes:
    return encoded(Image.fromarray(np.full((16, 16, 3), (200, 40, 40), np.uint8)).convert("CMYK"))


def _png16() -> bytes:
    return encoded(Image.fromarray(np.full((16, 16), 0x8040, np.uint16)), "PNG")


def _flipped(data: bytes, where: float) -> bytes:
    """``data`` with the byte ``where`` of the way through it changed."""
    at = int(len(data) * where)
    return data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1:]


#: name: (bytes, a pattern of the error's reason, else the RGB every pixel should be near)
CASES = {
    "truncated JPEG": (encoded(photo(64, 64))[:700], "a truncated JPEG"),
    "truncated PNG": (encoded(photo(64, 64), "PNG")[:200], r"a truncated PNG \(200 bytes, it ends before its IEND"),
    "damaged PNG": (_flipped(encoded(photo(64, 64), "PNG"), 0.5),
                    r"a damaged PNG \(\d+ bytes: its IDAT chunk at byte \d+ fails its checksum\)"),
    "truncated WebP": (encoded(photo(64, 64), "WEBP")[:150], r"a truncated WebP \(150 bytes, its header says \d+\)"),
    "not an image": (b"<html>404</html>", r"not a JPEG, PNG or WebP image \(it starts with b'<html>40'"),
    "empty bytes": (b"", "not a JPEG, PNG or WebP image"),
    "not bytes": (17, "not image bytes but int"),
    "CMYK JPEG": (_cmyk_jpeg(), (200, 40, 40)),
    "16-bit grey PNG": (_png16(), (0x80, 0x80, 0x80)),
    "1x1 image": (encoded(np.full((1, 1, 3), (10, 200, 30), np.uint8), "PNG"), (10, 200, 30)),
    "palette PNG": (encoded(Image.fromarray(np.full((8, 8, 3), (0, 0, 255), np.uint8)).convert("P"), "PNG"), (0, 0, 255)),
    "grey JPEG": (encoded(Image.fromarray(np.full((16, 16), 90, np.uint8))), (90, 90, 90)),
    "RGBA PNG": (encoded(Image.fromarray(np.full((8, 8, 4), (250, 0, 0, 100), np.uint8)), "PNG"), (250, 0, 0)),
    "WebP": (encoded(np.full((16, 16, 3), (30, 60, 90), np.uint8), "WEBP", lossless=True), (30, 60, 90)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_and_unusual_images(backend: str, case: str, monkeypatch) -> None:
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)  # as many training scripts set it: no matter
    data, expected = CASES[case]
    out, failed = decode(Images(12, backend=backend, channels_last=True), [data])
    if isinstance(expected, str):
        assert re.search(expected, failed[0]), failed
    else:
        assert not failed
        assert np.abs(out[0].reshape(-1, 3).astype(int) - expected).max() <= 3, out[0].reshape(-1, 3)[0]


@pytest.fixture(scope="module")
def image_shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images")
    image_folder(root / "folder", {"cat": 70, "dog": 60, "eel": 50}, size=(40, 56))
    pipeline.build_imagefolder(root / "folder", root / "shards", shard_samples=40, quiet=True)
    return root / "shards"


def epoch_batches(shards: Path, workers: int, spec: Images, epoch: int = 0, **options) -> list[dict]:
    loader = make_loader(shards, num_workers=workers, batch_size=32, seed=5, shuffle_buffer=64,
                         images={"image": spec}, **options)
    loader.set_epoch(epoch)
    return [{name: value.clone() for name, value in batch.items()} for batch in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_random_crops_are_the_same_in_any_number_of_workers_and_new_each_epoch(image_shards: Path, workers: int) -> None:
    spec = Images(24, crop="random", flip=True)
    reference = epoch_batches(image_shards, 1, spec)
    batches = epoch_batches(image_shards, workers, spec)
    assert [b["image"].shape for b in batches] == [(32, 3, 24, 24)] * 5 + [(20, 3, 24, 24)]
    assert batches[0]["image"].dtype == torch.uint8
    assert all(torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
               for a, b in zip(batches, reference))
    assert sorted(torch.cat([b["label"] for b in batches]).tolist()) == [0] * 70 + [1] * 60 + [2] * 50
    again = epoch_batches(image_shards, workers, spec, epoch=1)
    assert not torch.equal(torch.cat([b["image"] for b in again]), torch.cat([b["image"] for b in batches]))


def test_resume_gives_the_same_crops_as_an_uninterrupted_epoch(image_shards: Path) -> None:
    options = dict(batch_size=32, seed=5, shuffle_buffer=64, images={"image": Images(16, crop="random", flip=True)})
    reference = epoch_batches(image_shards, 2, options["images"]["image"])
    loader = make_loader(image_shards, num_workers=2, **options)
    head = [next(iter(loader))["image"].clone() for _ in range(1)]
    state = loader.state_dict()
    resumed = make_loader(image_shards, num_workers=1, **options)
    resumed.load_state_dict(state)
    tail = [batch["image"].clone() for batch in resumed]
    assert all(torch.equal(a, b["image"]) for a, b in zip(head + tail, reference)) and len(head + tail) == 6


def test_channels_last_and_a_center_crop_give_the_same_pixels_as_the_default_layout(image_shards: Path) -> None:
    first = epoch_batches(image_shards, 0, Images((20, 28)))[0]["image"]
    last = epoch_batches(image_shards, 0, Images((20, 28), channels_last=True))[0]["image"]
    assert first.shape == (32, 3, 20, 28) and last.shape == (32, 20, 28, 3)
    assert torch.equal(first.permute(0, 2, 3, 1), last)


@pytest.fixture(scope="module")
def damaged_shards(tmp_path_factory) -> Path:
    """20 samples, image 7 a truncated JPEG."""
    out = tmp_path_factory.mktemp("damaged")
    with pipeline.ShardWriter(out, prefix="part", shard_samples=10) as writer:
        for n in range(20):
            data = encoded(photo(20, 20, seed=n))
            writer.write({"image": data[:300] if n == 7 else data, "label": n}, key=f"img-{n}")
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bad_image_names_its_shard_record_key_and_field(damaged_shards: Path, workers: int) -> None:
    loader = make_loader(damaged_shards, num_workers=workers, batch_size=5, images={"image": Images(8)})
    with pytest.raises(pipeline.ShardError, match=r"part-000000\.tar at byte \d+: record 7 \(key 'img-7'\), field 'image': a "
                                    r"truncated JPEG .*on_error='skip'"):
        list(loader)


def test_under_skip_a_unit_of_bad_images_alone_says_how_to_find_them(tmp_path: Path) -> None:
    """9 samples on 9 ranks: a rank's share, one sample, is its unit; the rank whose sample is
    the truncated image has no stand-in for it."""
    with pipeline.ShardWriter(tmp_path, prefix="part") as writer:
        for n in range(9):
            data = encoded(photo(20, 20, seed=n))
            writer.write({"image": data[:300] if n == 4 else data, "label": n}, key=f"img-{n}")
    loader = make_loader(tmp_path, num_workers=0, batch_size=8, on_error="skip", shuffle=False, rank=4, world_size=9,
                         images={"image": Images(8)})
    with pytest.raises(pipeline.ShardError, match=r"record 4 \(key 'img-4'\), field 'image': a truncated JPEG .*; no "
                                                  r"image of its unit could be decoded, so none can stand in for it \(a "
                                                  r"unit can be as small as a batch, or a rank's whole share of a small "
                                                  r"epoch\): find the images that fail with pipeline verify --images, "
                                                  r"and mend or remove them$"):
        list(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_under_skip_a_bad_image_costs_its_row_counted_and_replaced_whole(damaged_shards: Path, workers: int) -> None:
    loader = make_loader(damaged_shards, num_workers=workers, batch_size=5, on_error="skip", images={"image": Images(8)})
    batches = list(loader)
    labels = torch.cat([b["label"] for b in batches]).tolist()
    images = torch.cat([b["image"] for b in batches])
    assert len(labels) == 20 and 7 not in labels and len(set(labels)) == 19
    twin = [i for i, label in enumerate(labels) if labels.count(label) == 2]
    assert torch.equal(images[twin[0]], images[twin[1]])  # the stand-in is a whole row: image and label
    stats = loader.stats()
    assert (stats["skipped_pieces"], stats["replaced_samples"]) == (1, 1)


def test_bad_images_under_skip_are_logged_once_a_shard_and_process(tmp_path: Path, caplog) -> None:
    """Each bad image was a WARNING at every read: 1% of ImageNet's images undecodable printed
    12,000 lines an epoch. As any skip, the first of a shard is a warning, the others DEBUG."""
    with pipeline.ShardWriter(tmp_path, prefix="part") as writer:
        for n in range(40):
            data = encoded(photo(20, 20, seed=n))
            writer.write({"image": data[:300] if n % 10 == 3 else data, "label": n}, key=f"img-{n}")
    loader = make_loader(tmp_path, num_workers=0, batch_size=8, on_error="skip", images={"image": Images(8)})
    caplog.set_level(logging.DEBUG, logger="pipeline")
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert len(list(loader)) == 5
    skips = [r for r in caplog.records if r.getMessage().startswith("skipping the image")]
    assert [r.levelno for r in skips] == [logging.WARNING] + [logging.DEBUG] * 7
    assert loader.stats()["replaced_samples"] == 8


def test_shards_without_an_index_decode_too(damaged_shards: Path, tmp_path: Path, caplog) -> None:
    """A bad image of shards without an index is named by its sample's key where the key is read
    (the shard and record are known only with an index)."""
    for tar in damaged_shards.glob("*.tar"):
        (tmp_path / tar.name).write_bytes(tar.read_bytes())
    shards = sorted(str(p) for p in tmp_path.glob("*.tar"))
    loader = make_loader(shards, num_workers=0, batch_size=5, on_error="skip", images={"image": Images(8)},
                         fields=["image", "label", "__key__"])
    images = torch.cat([b["image"] for b in loader])
    assert images.shape == (20, 3, 8, 8) and loader.stats()["replaced_samples"] == 1
    skips = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping the image")]
    assert len(skips) == 1 and re.match(r"skipping the image of sample \d+ of its stream, key 'img-7' \(index the "
                                        r"shards, .*\), its sample replaced by another of its unit, of the shards of "
                                        r"consumer 0 \(no index\): field 'image': a truncated JPEG", skips[0]), skips
    with pytest.raises(pipeline.ShardError, match=r"sample \d+ of its stream \(fields=\[\.\.\., '__key__'\] names its "
                                                  r"key\) \(index the shards, pipeline index"):
        list(make_loader(shards, num_workers=0, batch_size=5, images={"image": Images(8)}))


def test_images_must_name_a_field_of_image_bytes(image_shards: Path) -> None:
    with pytest.raises(ValueError, match=r"field 'photo', which the index does not have \(it has \['image', 'label'\]\)"):
        make_loader(image_shards, images={"photo": Images(8)})
    with pytest.raises(ValueError, match="field 'label', which holds int, not image bytes"):
        make_loader(image_shards, images={"label": Images(8)})
    with pytest.raises(TypeError, match=r"images\['image'\] must be an Images\(...\), got int"):
        make_loader(image_shards, images={"image": 224})
    with pytest.raises(TypeError, match=r"^images takes a dict of field names to Images\(...\), such as "
                                        r"images=\{'image': Images\(224\)\}, got Images$"):
        make_loader(image_shards, images=Images(8))
    with pytest.raises(ValueError, match=r"^images names field 'image', which fields=\['label'\] leaves out: add it "
                                         r"to fields$"):
        make_loader(image_shards, fields=["label"], images={"image": Images(8)})
    with pytest.raises(ValueError, match="crop must be one of"):
        Images(8, crop="middle")


@pytest.mark.parametrize("options, message", [
    (dict(size="224"), "Images size must be an int (a square) or (height, width), two ints; got '224'"),
    (dict(size=(64, 32, 16)), "two ints; got (64, 32, 16)"),
    (dict(size=(64,)), "two ints; got (64,)"),
    (dict(size=64.5), "two ints; got 64.5"),
    (dict(size=True), "two ints; got True"),
    (dict(size=8, flip="yes"), "Images flip must be True or False, got 'yes'"),
    (dict(size=8, scale=(0.5, 1.0)), "Images scale= has no effect with crop='center': crop_fraction applies to "
                                     "crop='center', scale and ratio to crop='random'"),
    (dict(size=8, crop="random", crop_fraction=0.875), "Images crop_fraction= has no effect with crop='random'"),
])
def test_images_options_that_would_do_something_else_are_refused(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Images(**options)
    assert Images((24, 32)).shape == (24, 32) and Images(np.int64(8)).size == 8 and Images([24, 32]).size == (24, 32)


@pytest.mark.parametrize("crop", ["center", "random"])
def test_a_large_jpeg_decodes_at_a_dct_scale_to_what_a_full_decode_gives(crop: str, monkeypatch) -> None:
    import cv2

    picture = np.asarray(Image.fromarray(photo(150, 200, seed=3)).resize((1603, 1205), Image.Resampling.BICUBIC))
    data = encoded(picture)
    assert check_jpeg(data) == (1603, 1205) and check_jpeg(encoded(picture, "PNG")) is None
    spec = Images(100, crop=crop, channels_last=True, **({"scale": (0.3, 1.0)} if crop == "random" else {}))
    draws = uniforms(row_seeds(0, 0, np.arange(1)), 41)[0]
    left, top, width, height = spec.box(1603, 1205, draws if crop == "random" else None)
    reference = np.asarray(Image.fromarray(picture).resize((100, 100), Image.Resampling.BOX,
                                                           box=(left, top, left + width, top + height)))
    flags = []
    real = cv2.imdecode
    monkeypatch.setattr(cv2, "imdecode", lambda buffer, flag: flags.append(flag) or real(buffer, flag))
    for backend in BACKENDS:
        out, failed = decode(dataclasses.replace(spec, backend=backend), [data])
        assert not failed and np.abs(out[0].astype(int) - reference).mean() < 3, backend
    scale = next(r for r in (8, 4, 2) if min(width, height) / 100 >= r)  # the box is at least 200 pixels a side
    reduced = {8: cv2.IMREAD_REDUCED_COLOR_8, 4: cv2.IMREAD_REDUCED_COLOR_4, 2: cv2.IMREAD_REDUCED_COLOR_2}[scale]
    assert flags == [reduced | cv2.IMREAD_IGNORE_ORIENTATION]  # the DCT-scaled read was taken


def test_a_jpeg_with_data_after_its_end_is_whole_and_one_cut_anywhere_is_not() -> None:
    rng = np.random.default_rng(0)
    picture = photo(120, 160)
    exif = Image.Exif()
    exif[0x0112] = 6
    for data in (encoded(picture), encoded(picture, progressive=True), encoded(picture, exif=exif.tobytes())):
        for trailer in (b"", rng.bytes(1 << 16), b"\xff\xda" * 100):  # a motion photo's video, say
            assert not decode(Images(16), [data + trailer])[1]
        for cut in (3, 200, len(data) // 2, len(data) - 2):
            assert "truncated JPEG" in decode(Images(16), [data[:cut]])[1][0]


@pytest.mark.parametrize("backend", ["opencv", "pillow"])
def test_a_jpeg_whose_header_claims_more_pixels_than_its_data_can_hold_is_damaged(backend: str) -> None:
    """A frame header damaged to say 60000x60000 decoded, with OpenCV, into grey fill with a
    warning (and memory for the size claimed): each 8x8 block takes a bit at least. The least
    data JPEGs of every kind hold (one flat colour; 1x1; grey; 4:2:0, progressive) pass."""
    data = bytearray(encoded(photo(48, 64)))
    frame = data.find(b"\xff\xc0")
    data[frame + 5:frame + 9] = (60000).to_bytes(2, "big") * 2
    failed = decode(Images(16, backend=backend), [bytes(data)])[1]
    assert list(failed) == [0] and re.fullmatch(
        rf"a damaged JPEG \({len(data)} bytes: its frame header says 60000x60000 pixels, which take 439453 bytes of "
        rf"image data at least, and it holds \d+\)", failed[0]), failed
    flat = np.full((2000, 3000, 3), 128, np.uint8)
    for image in (encoded(flat, quality=1), encoded(flat[:1, :1]), encoded(flat[..., 0], quality=1),
                  encoded(flat, quality=1, subsampling=2, progressive=True)):
        assert check_jpeg(image) is not None and not decode(Images(16, backend=backend), [image])[1]


def _claiming(kind: str, width: int, height: int) -> bytes:
    """A small image whose header says it is ``width`` x ``height`` pixels."""
    if kind == "PNG":
        data = bytearray(encoded(photo(48, 64), "PNG"))
        data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")  # IHDR's, and its CRC: a sound header
        data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
        return bytes(data)
    data = bytearray(encoded(photo(48, 64), "WEBP", lossless=True))  # VP8L: 14 bits each, less one
    bits = int.from_bytes(data[21:25], "little") & ~0xFFFFFFF | (width - 1) | (height - 1) << 14
    data[21:25] = bits.to_bytes(4, "little")
    return bytes(data)


@pytest.mark.parametrize("backend", ["opencv", "pillow"])
@pytest.mark.parametrize("kind", ["PNG", "WebP"])
def test_an_image_of_more_pixels_than_pillows_limit_is_refused_before_decoding(backend: str, kind: str,
                                                                                 monkeypatch) -> None:
    """A PNG of 2.6 MB saying 30000x30000 pixels decoded, with OpenCV, into 2.7 GB (and 42 s);
    Pillow refused it. Both backends refuse it now, from its header, as Pillow does, and both
    decode it where PIL.Image.MAX_IMAGE_PIXELS is None (trusted images)."""
    from PIL import Image

    failed = decode(Images(16, backend=backend), [_claiming(kind, 16000, 12000)])[1]
    assert list(failed) == [0] and failed[0].startswith(
        "an image of 16000x12000 pixels, more than 178956970 (Pillow's limit, twice PIL.Image.MAX_IMAGE_PIXELS, for "
        "both backends): a decompression bomb"), failed
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    check_pixels(16000, 12000)  # the limit lifted, as Pillow's


@pytest.mark.parametrize("kind, alpha", [("VP8 ", False), ("VP8L", False), ("VP8X", True)])
def test_a_webps_size_is_read_from_its_header_lossy_lossless_or_extended(kind: str, alpha: bool) -> None:
    image = photo(23, 37)  # 37 wide, 23 high
    data = encoded(np.dstack([image, np.full((23, 37), 99, np.uint8)]) if alpha else image, "WEBP",
                   lossless=kind == "VP8L")
    assert data[12:16] == kind.encode() and webp_size(data[:30]) == (37, 23)


def test_webdataset_shards_indexed_in_place_decode_their_jpg_members(tmp_path: Path) -> None:
    import webdataset as wds

    for shard in range(2):
        with wds.TarWriter(str(tmp_path / f"w-{shard:06d}.tar")) as sink:
            for n in range(30):
                data = encoded(photo(30, 40, seed=n))
                sink.write({"__key__": f"{shard}-{n:04d}", "jpg": data[:-50] if (shard, n) == (1, 4) else data,
                            "cls": n % 3})
    pipeline.index_shards([str(tmp_path / "w-000000.tar"), str(tmp_path / "w-000001.tar")], quiet=True)
    loader = make_loader(tmp_path, num_workers=2, batch_size=16, on_error="skip", images={"jpg": Images(16)})
    batches = list(loader)
    assert torch.cat([b["jpg"] for b in batches]).shape == (60, 3, 16, 16) and loader.stats()["replaced_samples"] == 1
    with pytest.raises(pipeline.ShardError, match=r"w-000001\.tar at byte \d+: record 4 \(key '1-0004'\), field 'jpg'"):
        list(make_loader(tmp_path, num_workers=0, batch_size=16, images={"jpg": Images(16)}))


@pytest.mark.parametrize("workers", [0, 2])
def test_images_stored_as_jpg_in_some_samples_and_png_in_others_decode_from_whichever_a_sample_has(
        tmp_path: Path, workers: int) -> None:
    import webdataset as wds

    pictures = [photo(30, 40, seed=n) for n in range(30)]
    with wds.TarWriter(str(tmp_path / "w-000000.tar")) as sink:
        for n, picture in enumerate(pictures):
            kind = "png" if n % 2 else "jpg"
            sink.write({"__key__": f"{n:04d}", kind: encoded(picture, "PNG" if n % 2 else "JPEG"), "cls": n})
    with pytest.raises(ValueError, match=re.escape("images={'jpg;png': ...} reads whichever of several fields a sample "
                                                   "has, which needs an index of the shards")):
        make_loader([str(tmp_path / "w-000000.tar")], num_workers=0, images={"jpg;png": Images(16)},
                    as_tuple=["jpg;png", "cls"])
    pipeline.index_shards([str(tmp_path / "w-000000.tar")], quiet=True)
    with pytest.warns(UserWarning, match=re.escape("images names field 'jpg', which some samples lack (the index marks "
                                                   "it optional): each of them is an error, or with on_error='skip' "
                                                   "replaced by another sample; if the others hold their image in "
                                                   "another field (.png where these have .jpg), name both: "
                                                   "images={'jpg;png': ...} decodes whichever a sample has")):
        alone = make_loader(tmp_path, num_workers=0, batch_size=10, images={"jpg": Images(16)})
    with pytest.raises(pipeline.ShardError, match=r"record \d+ \(key '\d+'\), field 'jpg': the sample lacks this field; "
                                                  r"name each field a sample may hold its image in \(images="
                                                  r"\{'jpg;png': \.\.\.\} decodes whichever it has\), or pass "
                                                  r"on_error='skip' to train on other samples in its place$"):
        list(alone)
    with pytest.raises(ValueError, match=re.escape("fields ['jpg;png'] are not in the index (it has ['cls', 'jpg', "
                                                   "'png']); fields lists each field read, the several an images key "
                                                   "names too: ['jpg', 'png']")):
        make_loader(tmp_path, num_workers=0, fields=["jpg;png", "cls"], images={"jpg;png": Images(16)})
    loader = make_loader(tmp_path, num_workers=workers, batch_size=10, images={"jpg;png": Images(16, crop="resize")})
    batches = list(loader)
    assert all(sorted(batch) == ["cls", "jpg;png"] for batch in batches)
    got = {int(label): image for batch in batches for label, image in zip(batch["cls"], batch["jpg;png"])}
    assert sorted(got) == list(range(30)) and loader.stats()["replaced_samples"] == 0
    for fields in (None, ["jpg", "png", "cls"]):
        images, labels = next(iter(make_loader(tmp_path, num_workers=workers, batch_size=30, shuffle=False,
                                               fields=fields, images={"jpg;png": Images(16, crop="resize")},
                                               as_tuple=["jpg;png", "cls"])))
        assert images.shape == (30, 3, 16, 16) and labels.tolist() == list(range(30))
    for n in (0, 1):  # each as Images decodes its own bytes
        expected, failed = decode(Images(16, crop="resize"), [encoded(pictures[n], "PNG" if n % 2 else "JPEG")])
        assert not failed and torch.equal(got[n], torch.from_numpy(expected[0]))


def test_a_dct_scaled_box_at_the_image_edge_keeps_the_edge() -> None:
    picture = np.full((2000, 2000, 3), 40, np.uint8)
    picture[:, :16] = (250, 0, 0)  # a red stripe at the left edge: 1.8 output pixels of 224
    for backend in BACKENDS:
        out, failed = decode(Images(224, crop="resize", backend=backend, channels_last=True), [encoded(picture)])
        assert not failed and out[0, :, 0, 0].min() > 240 and out[0, :, 1, 0].min() > 150, backend  # 1.8 pixels red
        assert out[0, :, 3:, 0].max() < 60, backend


def test_stray_bytes_between_segments_are_skipped_as_the_decoders_skip_them() -> None:
    data = encoded(photo(40, 40))
    table = data.index(b"\xff\xdb")  # the first quantisation table's segment
    stray = data[:table] + b"\x00\x00" + data[table:]
    assert not decode(Images(16), [stray])[1]
    assert "truncated JPEG" in decode(Images(16), [stray[:len(stray) // 2]])[1][0]
