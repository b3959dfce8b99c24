"""``build imagefolder``: class folders to shards, bytes unchanged, labels by sorted class name."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import pipeline
from pipeline.cli import main
from tests.helpers import index_content, read_back
from tests.images import encoded, image_folder, photo


def test_classes_are_sorted_labels_follow_them_and_bytes_are_kept(tmp_path: Path, capsys) -> None:
    written = image_folder(tmp_path / "root", {"zebra": 3, "ant": 4, "moth": 2})
    pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", quiet=True)
    index = pipeline.load_index(tmp_path / "out")
    assert index.metadata == {"classes": ["ant", "moth", "zebra"]}
    keys, fields = read_back(tmp_path / "out")
    expected = {path.replace("/", "_").rsplit(".", 1)[0]: (data, ["ant", "moth", "zebra"].index(path.split("/")[0]))
                for path, data in written.items()}
    assert sorted(keys) == sorted(expected) and len(keys) == 9
    for key, image, label in zip(keys, fields["image"], fields["label"]):
        assert (image, label) == expected[key]
    assert main(["inspect", str(tmp_path / "out")]) == 0
    assert "classes  3: ant, moth, zebra" in capsys.readouterr().out


def test_train_and_val_folders_make_two_sets_labelled_by_the_training_classes(tmp_path: Path) -> None:
    image_folder(tmp_path / "root" / "train", {"cat": 2, "dog": 2, "eel": 1})
    image_folder(tmp_path / "root" / "val", {"dog": 1, "eel": 2})  # no cat: labels must still be train's
    assert main(["build", "imagefolder", str(tmp_path / "root"), str(tmp_path / "out"), "--quiet"]) == 0
    train, validation = (pipeline.load_index(tmp_path / "out" / split) for split in ("train", "validation"))
    assert train.metadata == validation.metadata == {"classes": ["cat", "dog", "eel"]}
    assert (tmp_path / "out" / "validation" / "validation-000000.tar").exists()
    keys, fields = read_back(tmp_path / "out" / "validation")
    assert dict(zip(keys, fields["label"])) == {"dog_0000": 1, "eel_0001": 2, "eel_0002": 2}
    with pytest.raises(ValueError, match="already holds train/ and val/ folders"):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "other", validation=0.2, quiet=True)
    with pytest.warns(UserWarning, match=re.escape("the split is theirs, and seed=3, which would draw one, is not "
                                                   "used")):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "other", seed=3, quiet=True)
    assert pipeline.load_index(tmp_path / "other" / "validation").samples == 3


def test_a_class_only_the_validation_folder_has_is_an_error(tmp_path: Path) -> None:
    image_folder(tmp_path / "root" / "train", {"cat": 2})
    image_folder(tmp_path / "root" / "validation", {"cat": 1, "owl": 1})
    with pytest.raises(pipeline.SampleError, match=r"class folders \['owl'\] are not among the classes \['cat'\]"):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", quiet=True)


def test_validation_splits_a_plain_image_folder(tmp_path: Path) -> None:
    image_folder(tmp_path / "root", {"a": 10, "b": 10})
    result = pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", validation=5, seed=1, quiet=True)
    assert {split: index.samples for split, index in result.items()} == {"train": 15, "validation": 5}
    train_keys, _ = read_back(tmp_path / "out" / "train")
    validation_keys, _ = read_back(tmp_path / "out" / "validation")
    assert not set(train_keys) & set(validation_keys) and len(set(train_keys) | set(validation_keys)) == 20
    assert result["validation"].metadata == {"classes": ["a", "b"]}


def test_files_that_are_no_images_are_all_named_before_a_shard_is_written(tmp_path: Path) -> None:
    image_folder(tmp_path / "root", {"a": 30})
    for name in ("0003.jpg", "0020.png", "9999.jpg"):
        (tmp_path / "root" / "a" / name).write_text("<html>" if name != "9999.jpg" else "not a picture")
    with pytest.raises(pipeline.SampleError, match=re.escape(
            f"3 file(s) are not JPEG, PNG or WebP images: {tmp_path / 'root' / 'a' / '0003.jpg'} (it starts with "
            f"b'<html>'); {tmp_path / 'root' / 'a' / '0020.png'} (it starts with b'<html>'); "
            f"{tmp_path / 'root' / 'a' / '9999.jpg'} (it starts with b'not a pi'); replace them with whole images, "
            f"or remove them")):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", shard_samples=5, quiet=True)
    assert not (tmp_path / "out").exists()


def test_empty_image_files_are_all_named_before_a_shard_is_written(tmp_path: Path) -> None:
    image_folder(tmp_path / "root", {"a": 10, "b": 10})
    for name in ("a/0003.jpg", "b/0015.jpg"):
        (tmp_path / "root" / name).write_bytes(b"")  # a copy cut short, say
    with pytest.raises(pipeline.SampleError, match=re.escape(
            f"2 image file(s) are empty (0 bytes): {tmp_path / 'root' / 'a' / '0003.jpg'}, "
            f"{tmp_path / 'root' / 'b' / '0015.jpg'}; copy them again, or remove them")):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()


def test_a_class_folder_without_images_warns(tmp_path: Path) -> None:
    image_folder(tmp_path / "root", {"a": 4, "c": 4})
    (tmp_path / "root" / "b").mkdir()
    with pytest.warns(UserWarning, match=re.escape(f"{tmp_path / 'root'}: class folders ['b'] hold no images: their "
                                                   f"labels have no samples")) as caught:
        index = pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", quiet=True)
    assert caught[0].filename == __file__ and index.metadata["classes"] == ["a", "b", "c"]


@pytest.mark.parametrize("splits", [("train", "test"), ("train",)])
def test_split_folders_other_than_train_and_val_are_refused_not_taken_for_classes(tmp_path: Path, splits) -> None:
    for split in splits:
        image_folder(tmp_path / "root" / split, {"cat": 1, "dog": 1})
    with pytest.raises(pipeline.SampleError, match=r"look like split folders of class folders, not classes"):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", quiet=True)


def test_a_folder_beside_train_and_val_is_refused_not_left_out(tmp_path: Path) -> None:
    for split in ("train", "val", "test"):
        image_folder(tmp_path / "root" / split, {"cat": 1, "dog": 1})
    with pytest.raises(pipeline.SampleError, match=re.escape(
            f"{tmp_path / 'root'}: holds train/ and val/, which build two sets, and also the folders ['test'], which "
            f"would be left out: build each of them on its own")):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", quiet=True)


def test_files_that_are_no_images_by_name_are_counted_in_a_warning_and_linked_folders_are_read(
        tmp_path: Path, capsys) -> None:
    """torchvision's ImageFolder reads .bmp, .gif and .tif, and follows linked folders: a user
    coming from it lost such files without a word, and every image of a linked folder."""
    root = tmp_path / "root"
    written = image_folder(root, {"cat": 3, "dog": 3}, size=(8, 8))
    for name in ("scan.bmp", "anim.gif", "photo.tif"):
        (root / "cat" / name).write_bytes(b"not read")
    (root / "cat" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    elsewhere = tmp_path / "elsewhere"
    image_folder(elsewhere, {"more": 2}, size=(8, 8))
    (root / "dog" / "more").symlink_to(elsewhere / "more")
    (root / "dog" / "loop").symlink_to(root / "dog")  # walked once
    (root / "dog" / ".thumbnails").mkdir()  # hidden: no data, as a hidden class folder is no class
    (root / "dog" / ".thumbnails" / "t.jpg").write_bytes(written["dog/0003.jpg"])
    told = (f"{root}: left out 4 file(s) that are not .jpg/.jpeg/.png/.webp images (.bmp: 1, .gif: 1, .tif: 1, a "
            f"link to nothing: 1; e.g. {root / 'cat' / 'anim.gif'}); convert them to JPEG or PNG (or mend the links) to "
            f"include them")
    with pytest.warns(UserWarning, match=re.escape(told)):
        pipeline.build_imagefolder(root, tmp_path / "out", quiet=True)
    keys, fields = read_back(tmp_path / "out")
    assert keys == ["cat_0000", "cat_0001", "cat_0002", "dog_0003", "dog_0004", "dog_0005", "dog_more_0000",
                    "dog_more_0001"]
    assert fields["label"] == [0, 0, 0, 1, 1, 1, 1, 1]
    assert main(["build", "imagefolder", str(root), str(tmp_path / "cli"), "--quiet"]) == 0
    assert capsys.readouterr().err == f"warning: {told}\n"  # a line of its own, not Python's source line


def test_a_png_named_jpeg_is_kept_as_the_png_it_is(tmp_path: Path) -> None:
    (tmp_path / "root" / "a").mkdir(parents=True)
    png = encoded(photo(20, 30), "PNG")
    (tmp_path / "root" / "a" / "x.JPEG").write_bytes(png)
    pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", quiet=True)
    assert read_back(tmp_path / "out")[1]["image"] == [png]


def test_any_file_name_makes_a_sample_with_a_key_of_its_own(tmp_path: Path) -> None:
    """Names torchvision's ImageFolder reads stopped the build: two files of one stem, a long
    name (a web download's, or 30 CJK characters, over a key's 92 bytes), a class named
    ``__background__`` (keys may not start with ``__``)."""
    names = ["a/x.jpg", "a/x.png", "a/x.webp", "a/x.y.jpg", "a/x_y.jpg", "a/" + "柴犬の写真" * 7 + ".jpg",
             "a/a-very-long-descriptive-name-of-a-photo-downloaded-from-the-web-of-a-golden-retriever.jpg",
             "__background__/bg.jpg", os.fsdecode(b"a/caf\xe9.jpg")]  # a name that is no UTF-8 (Latin-1)
    for n, name in enumerate(names):
        (tmp_path / "root" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "root" / name).write_bytes(encoded(photo(8, 8, seed=n), "PNG" if name.endswith("png") else "JPEG"))
    pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", quiet=True)
    keys, fields = read_back(tmp_path / "out")
    assert len(set(keys)) == len(names) and all(len(key.encode()) <= 92 and not key.startswith("__") for key in keys)
    assert sorted(fields["image"]) == sorted((tmp_path / "root" / name).read_bytes() for name in names)
    assert keys[3:6] == ["a_x", *("a_x_" + hashlib.sha256(f"a/x#{n}".encode()).hexdigest()[:12] for n in (0, 1))]
    assert keys[0] == "_background___bg" and "a_caf\ufffd" in keys


@pytest.mark.parametrize("layout", ["empty", "files only", "empty classes"])
def test_a_folder_without_images_says_what_it_lacks(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    if layout == "files only":
        (root / "x.jpg").write_bytes(encoded(photo(8, 8)))
    if layout == "empty classes":
        (root / "a").mkdir()
    message = "no .jpg/.jpeg/.png/.webp files" if layout == "empty classes" else "no class folders"
    with pytest.raises(FileNotFoundError, match=message):
        pipeline.build_imagefolder(root, tmp_path / "out", quiet=True)


def test_an_image_given_for_the_folder_says_so(tmp_path: Path) -> None:
    image_folder(tmp_path / "root", {"a": 1})
    image = tmp_path / "root" / "a" / "0000.png"
    with pytest.raises(FileNotFoundError, match=re.escape(f"{image}: is a file, not a folder: pass the folder of class "
                                                          f"folders (ROOT/<class>/<image>.jpg)")):
        pipeline.build_imagefolder(image, tmp_path / "out", quiet=True)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'nowhere'}: no such folder")):
        pipeline.build_imagefolder(tmp_path / "nowhere", tmp_path / "out", quiet=True)


def test_max_side_shrinks_large_photos_in_the_build_workers_and_keeps_small_ones(tmp_path: Path) -> None:
    (tmp_path / "root" / "a").mkdir(parents=True)
    large, small = encoded(photo(300, 400), "PNG"), encoded(photo(90, 120))
    deep = encoded(Image.fromarray(np.full((200, 100), 0x8040, np.uint16)), "PNG")  # 16-bit grey: not clipped to white
    (tmp_path / "root" / "a" / "deep.png").write_bytes(deep)
    (tmp_path / "root" / "a" / "large.png").write_bytes(large)
    (tmp_path / "root" / "a" / "small.jpg").write_bytes(small)
    assert main(["build", "imagefolder", str(tmp_path / "root"), str(tmp_path / "out"), "--max-side", "128",
                 "--quality", "80", "--workers", "2", "--quiet"]) == 0
    keys, fields = read_back(tmp_path / "out")
    images = dict(zip(keys, fields["image"]))
    assert images["a_small"] == small
    shrunk = Image.open(io.BytesIO(images["a_large"]))
    assert (shrunk.format, shrunk.size) == ("JPEG", (128, 96))
    deep_shrunk = Image.open(io.BytesIO(images["a_deep"]))
    assert deep_shrunk.size == (64, 128) and abs(np.asarray(deep_shrunk).astype(int) - 0x80).max() <= 2
    # a damaged PNG (a byte of its pixel data changed) is refused, not shrunk into a sound JPEG
    damaged = bytearray(large)
    damaged[len(large) // 2] ^= 0x5A
    (tmp_path / "root" / "a" / "large.png").write_bytes(bytes(damaged))
    with pytest.raises(pipeline.SampleError, match=re.escape(f"{tmp_path / 'root' / 'a' / 'large.png'}: cannot read the "
                                                             f"image to shrink it: a damaged PNG ({len(large)} bytes: "
                                                             f"its IDAT chunk at byte ")):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out2", max_side=128, quiet=True)


@pytest.mark.parametrize("quality", ["0", "101", "high"])
def test_a_quality_out_of_range_is_a_usage_error_on_the_command_line_as_in_python(tmp_path: Path, capsys,
                                                                                  quality: str) -> None:
    image_folder(tmp_path / "root", {"cat": 1})
    with pytest.raises(SystemExit) as exited:
        main(["build", "imagefolder", str(tmp_path / "root"), str(tmp_path / "out"), "--quality", quality])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"argument --quality: {quality!r} is not a whole number from 1 to 100")
    for value in (0, 101, True, 80.5):
        with pytest.raises(ValueError, match=re.escape(f"quality must be a whole number from 1 to 100, got {value!r}")):
            pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", max_side=64, quality=value, quiet=True)



def test_a_quality_without_max_side_is_refused_not_ignored(tmp_path: Path, capsys) -> None:
    """Images are stored as they are unless max_side shrinks them: a quality alone did nothing."""
    image_folder(tmp_path / "root", {"cat": 1})
    told = "quality=10 is the JPEG quality of the images that max_side= shrinks: give max_side too (without it, " \
           "images are stored as they are)"
    with pytest.raises(ValueError, match=re.escape(told)):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", quality=10, quiet=True)
    assert main(["build", "imagefolder", str(tmp_path / "root"), str(tmp_path / "out"), "--quality", "10"]) == 1
    assert capsys.readouterr().err == ("error: --quality 10 is the JPEG quality of the images --max-side shrinks: "
                                       "give --max-side too (without it, images are stored as they are)\n")
    assert not (tmp_path / "out").exists()


def test_parts_of_a_build_keep_the_class_list_and_merge_refuses_parts_of_other_builds(tmp_path: Path) -> None:
    image_folder(tmp_path / "root", {"a": 3, "b": 3})
    for part in range(2):
        pipeline.build_imagefolder(tmp_path / "root", tmp_path / "out", shard_samples=2, part=pipeline.Part(part, 2),
                                   quiet=True)
    index, _ = pipeline.merge_index_files([tmp_path / "out"])
    assert index.metadata == {"classes": ["a", "b"]} and index.samples == 6
    assert pipeline.load_index(tmp_path / "out").metadata == {"classes": ["a", "b"]}
    image_folder(tmp_path / "other", {"c": 3, "d": 3})
    pipeline.build_imagefolder(tmp_path / "other", tmp_path / "mixed", shard_samples=2, part=pipeline.Part(0, 2),
                               quiet=True)
    pipeline.build_imagefolder(tmp_path / "root", tmp_path / "mixed", shard_samples=2, part=pipeline.Part(1, 2),
                               quiet=True)
    with pytest.raises(pipeline.IndexFormatError, match=r"part 1 has metadata \{'classes': \['a', 'b'\]\}, part 0 "
                                                        r"\{'classes': \['c', 'd'\]\}: parts of different builds"):
        pipeline.merge_index_files([tmp_path / "mixed"])


def test_a_build_task_carries_its_own_files_only_and_workers_change_nothing(tmp_path: Path) -> None:
    image_folder(tmp_path / "root", {"a": 30, "b": 30})
    source = pipeline.ImageFolderSource(tmp_path / "root")
    window = source.window(10, 15)
    assert (window.keys, window.labels, len(window), len(source)) == (source.keys[10:15], source.labels[10:15], 5, 60)
    assert window.read(0, 5).columns["image"] == source.read(10, 15).columns["image"]
    assert len(pickle.dumps(window)) * 3 < len(pickle.dumps(source))  # 5 rows against 60, and the same root
    one = pipeline.build_imagefolder(tmp_path / "root", tmp_path / "one", shard_samples=7, quiet=True)
    two = pipeline.build_imagefolder(tmp_path / "root", tmp_path / "two", shard_samples=7, workers=2, quiet=True)
    assert index_content(one) == index_content(two)


def test_a_subclass_with_rows_of_its_own_gets_whole_windows_until_it_names_them(tmp_path: Path) -> None:
    image_folder(tmp_path / "root", {"a": 20})

    class Weighted(pipeline.ImageFolderSource):
        def __init__(self, root: Path) -> None:
            super().__init__(root)
            self.weights = list(range(len(self)))

        def read(self, start: int, stop: int):
            block = super().read(start, stop)
            block.columns["weight"] = self.weights[start:stop]
            return block

    assert Weighted(tmp_path / "root").window(10, 15).read(0, 5).columns["weight"] == [10, 11, 12, 13, 14]


def test_images_beside_the_class_folders_are_named_in_a_warning_not_left_out_silently(tmp_path: Path) -> None:
    """A class folder given as ROOT: its images are beside its one subfolder, which alone would be read."""
    image_folder(tmp_path / "cat", {"sub": 1})
    (tmp_path / "cat" / "001.jpg").write_bytes(encoded(photo(8, 8), "JPEG"))
    (tmp_path / "cat" / "002.PNG").write_bytes(encoded(photo(8, 8), "PNG"))
    with pytest.warns(UserWarning, match=re.escape(f"{tmp_path / 'cat'}: left out 2 image(s) beside its class folders "
                                                   f"(e.g. {tmp_path / 'cat' / '001.jpg'}): an image's class is the "
                                                   f"folder it is in")):
        assert pipeline.build_imagefolder(tmp_path / "cat", tmp_path / "out", quiet=True).samples == 1
    image_folder(tmp_path / "one", {"dog": 2})
    with pytest.warns(UserWarning, match=r"one class folder only \('dog'\): every label is 0"):
        pipeline.build_imagefolder(tmp_path / "one", tmp_path / "out1", quiet=True)


def test_classes_number_a_test_folder_as_the_training_set_and_a_mix_of_other_numberings_is_refused(
        tmp_path: Path) -> None:
    image_folder(tmp_path / "train", {"cat": 2, "dog": 2, "eel": 1})
    image_folder(tmp_path / "test", {"dog": 3})
    pipeline.build_imagefolder(tmp_path / "train", tmp_path / "out" / "train", quiet=True)
    with pytest.warns(UserWarning, match="one class folder only"):
        pipeline.build_imagefolder(tmp_path / "test", tmp_path / "out" / "alone", quiet=True)
    assert main(["build", "imagefolder", str(tmp_path / "test"), str(tmp_path / "out" / "test"), "--quiet",
                 "--classes", "cat, dog,eel"]) == 0
    keys, fields = read_back(tmp_path / "out" / "test")
    assert fields["label"] == [1, 1, 1] and pipeline.load_index(tmp_path / "out" / "test").metadata == {
        "classes": ["cat", "dog", "eel"]}
    loader = pipeline.make_loader({"train": tmp_path / "out" / "train", "test": tmp_path / "out" / "test"},
                                  batch_size=4, num_workers=0)
    assert sorted(label for batch in loader for label in batch["label"].tolist()) == [0, 0, 1, 1, 1, 1, 1, 2]
    with pytest.raises(ValueError, match=re.escape(
            "sources 'train' and 'alone' number their classes differently: label 0 is 'cat' in 'train' and 'dog' in "
            "'alone' ('train': ['cat', 'dog', 'eel'], 'alone': ['dog']); build them with one class list")):
        pipeline.make_loader({"train": tmp_path / "out" / "train", "alone": tmp_path / "out" / "alone"},
                             batch_size=4, num_workers=0)
    for name, classes in (("ab", ["cat", "dog"]), ("abc", ["cat", "dog", "eel"]), ("abd", ["cat", "dog", "fox"])):
        pipeline.build_imagefolder(tmp_path / "test", tmp_path / "out" / name, classes=classes, quiet=True)
    with pytest.raises(ValueError, match=re.escape("sources 'abc' and 'abd' number their classes differently: label 2 "
                                                   "is 'eel' in 'abc' and 'fox' in 'abd'")):  # each agrees with 'ab'
        pipeline.make_loader({name: tmp_path / "out" / name for name in ("ab", "abc", "abd")}, num_workers=0)
    with pytest.raises(ValueError, match=r"classes must be distinct, non-empty names, got \['dog', 'dog'\] "
                                         r"\(\['dog'\] more than once\)"):
        pipeline.build_imagefolder(tmp_path / "test", tmp_path / "out" / "twice", classes=["dog", "dog"], quiet=True)
    with pytest.raises(TypeError, match=re.escape("classes is a list of class names, e.g. classes=['cat', 'dog'], got "
                                                  "the string 'dog'")):
        pipeline.build_imagefolder(tmp_path / "test", tmp_path / "out" / "string", classes="dog", quiet=True)


@pytest.mark.parametrize("split", [False, True])
def test_a_shard_set_written_into_the_image_folder_is_refused_not_taken_for_a_class(tmp_path: Path,
                                                                                      split: bool) -> None:
    """A second build into ROOT/shards (after adding images, say) took 'shards' for a class."""
    root = tmp_path / "photos"
    image_folder(root, {"cat": 2, "dog": 2}, size=(8, 8))
    pipeline.build_imagefolder(root, root / "shards", validation=0.5 if split else None, quiet=True)
    with pytest.raises(pipeline.SampleError, match=re.escape(
            f"{root / 'shards'}: a shard set (an earlier build written into the folder it reads?), not a class "
            f"folder: it would be read as class 'shards'; write the shards outside {root}, and move this set out "
            f"of it")):
        pipeline.build_imagefolder(root, root / "shards", overwrite=True, quiet=True)


def test_an_empty_class_list_is_refused_not_taken_for_none(tmp_path: Path, capsys) -> None:
    """--classes "" (a script's empty variable, a $(...) that failed) numbered the test set's
    labels by its own folders, without a word: dog 0 where training had it 1."""
    image_folder(tmp_path / "root", {"dog": 1, "fox": 1})
    assert main(["build", "imagefolder", str(tmp_path / "root"), str(tmp_path / "out"), "--classes", ""]) == 1
    assert capsys.readouterr().err.startswith("error: classes must be distinct, non-empty names, got ['']")
    assert not (tmp_path / "out" / "index.json").exists()
