"""A field whose samples differ in shape, or that some samples lack: every batch holds it as a
list of per-sample values (never a tensor in one step and a list in the next), unless ``fill``
gives the missing ones a value of the field's dtype and shape; a build names the first sample
whose shape differs."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds

import pipeline
from pipeline import make_loader

pytestmark = pytest.mark.filterwarnings("ignore:.*suggested max number of worker")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_field_of_varied_shapes_is_a_list_in_every_batch(tmp_path: Path, workers: int) -> None:
    """One sample in 600 differs: before, 37 of 38 batches stacked the field into a tensor."""
    with pipeline.ShardWriter(tmp_path, shard_samples=200) as writer:
        for n in range(600):
            writer.write({"x": np.full(5 if n == 317 else 4, n, np.float32), "y": n})
    assert pipeline.load_index(tmp_path).fields["x"].shape == (None,)
    seen = {}
    for batch in make_loader(tmp_path, batch_size=16, num_workers=workers):
        assert isinstance(batch["x"], list) and isinstance(batch["y"], torch.Tensor)
        for x, y in zip(batch["x"], batch["y"].tolist()):
            assert isinstance(x, torch.Tensor)
            seen[y] = x
    assert sorted(seen) == list(range(600))
    assert all(torch.equal(x, torch.full((5 if n == 317 else 4,), float(n))) for n, x in seen.items())


def test_a_field_of_one_shape_is_still_one_tensor(tmp_path: Path) -> None:
    pipeline.write_shards(tmp_path, {"x": np.zeros((100, 4), np.float32)}, quiet=True)
    assert all(isinstance(batch["x"], torch.Tensor) for batch in make_loader(tmp_path, batch_size=16))


def _save_samples(root: Path, shapes: dict[str, tuple[int, ...]]) -> dict:
    root.mkdir()
    for sample, shape in shapes.items():
        torch.save(torch.zeros(shape), root / f"{sample}.pt")
    return {sample: n % 2 for n, sample in enumerate(shapes)}


def test_a_build_names_the_sample_whose_shape_differs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    shapes = {f"id-{n:03d}": (3, 5) if n == 137 else (3, 4) for n in range(300)}
    labels = _save_samples(tmp_path / "data", shapes)
    partition = {"train": sorted(shapes)[:250], "validation": sorted(shapes)[250:]}
    pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "out", shard_samples=100)
    err = capsys.readouterr().err
    assert ("warning: field 'x' varies in shape: sample 'id-137' has shape [3, 5], the samples before it [3, 4] "
            "in train-000001.tar. Batches hold such a field as a list of tensors") in err
    assert err.count("varies in shape") == 1  # not the validation split, whose samples agree
    pipeline.build_sample_files(tmp_path / "data", labels, partition, tmp_path / "quiet", quiet=True)
    assert capsys.readouterr().err == ""


def test_a_build_names_the_shard_whose_samples_have_another_shape(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    shapes = {f"id-{n:03d}": (2,) if n < 100 else (6,) for n in range(200)}
    labels = _save_samples(tmp_path / "data", shapes)
    pipeline.build_sample_files(tmp_path / "data", labels, {"train": sorted(shapes)}, tmp_path / "out",
                                shard_samples=100)
    assert ("warning: field 'x' varies in shape: train-000001.tar holds shape [6], the shards before it [2]. "
            in capsys.readouterr().err)


@pytest.fixture
def optional_field(tmp_path: Path) -> Path:
    """Indexed webdataset shards whose sample 5 lacks its ``npy``."""
    with wds.ShardWriter(str(tmp_path / "w-%06d.tar"), maxcount=100, verbose=0) as sink:
        for i in range(40):
            sink.write({"__key__": f"s{i:02d}", "cls": i, **({} if i == 5 else {"npy": np.full(3, i, np.float32)})})
    pipeline.index_shards(str(tmp_path), quiet=True)
    return tmp_path


@pytest.mark.parametrize("workers", [0, 2])
def test_an_optional_field_is_a_list_in_every_batch_unless_filled(optional_field: Path, workers: int) -> None:
    """Before, the one batch with sample 5 held a list, the others a tensor."""
    loader = make_loader(optional_field, batch_size=4, num_workers=workers)
    values = {}
    for batch in loader:
        assert isinstance(batch["npy"], list) and isinstance(batch["cls"], torch.Tensor)
        values.update(zip(batch["cls"].tolist(), batch["npy"]))
    assert values[5] is None and all(torch.equal(values[i], torch.full((3,), float(i))) for i in values if i != 5)
    filled = {}
    for batch in make_loader(optional_field, batch_size=4, num_workers=workers, fill={"npy": 0}):
        assert batch["npy"].dtype == torch.float32 and batch["npy"].shape == (4, 3)
        filled.update(zip(batch["cls"].tolist(), batch["npy"]))
    assert torch.equal(filled[5], torch.zeros(3)) and torch.equal(filled[7], torch.full((3,), 7.0))
    rounded = {}  # a float field takes any number, rounded to its precision, as NumPy makes it
    for batch in make_loader(optional_field, batch_size=4, num_workers=workers, fill={"npy": [0.1, 0.2, 0.3]}):
        rounded.update(zip(batch["cls"].tolist(), batch["npy"]))
    assert torch.equal(rounded[5], torch.tensor([0.1, 0.2, 0.3], dtype=torch.float32))


@pytest.mark.parametrize(("fill", "message"), [
    ({"npy": [1, 2]}, "fill gives field 'npy' the value [1, 2], but the field holds float32 arrays of shape [3]: give "
                      "an array of that shape, or one number (an array of it)"),
    ({"npy": "none"}, "fill gives field 'npy' the value 'none', but the field holds float32 arrays of shape [3]: give "
                      "a number, or an array, that float32 holds"),
    ({"npy": True}, "fill gives field 'npy' the value True, but the field holds float32 arrays of shape [3]: give a "
                    "number, or an array, that float32 holds"),
    ({"npy": 1e40}, "fill gives field 'npy' the value 1e+40, but the field holds float32 arrays of shape [3]: give "
                    "a number, or an array, that float32 holds"),  # (rounding, yes; to an infinity, no)
    ({"cls": 0.5}, "fill gives field 'cls' the value 0.5, but the field holds Python values of type int: give one of "
                   "that type"),
    ({"cls": True}, "fill gives field 'cls' the value True, but the field holds Python values of type int: give one "
                    "of that type"),
    ({"cls": 2**63}, "fill gives field 'cls' the value 9223372036854775808, which int64, the integers of a batch's "
                     "tensor, does not hold: give one between -2**63 and 2**63 - 1"),  # (a bare TypeError, a list)
    ({"cls": -2**63 - 1}, "fill gives field 'cls' the value -9223372036854775809, which int64"),
])
def test_a_fill_value_the_field_cannot_hold_is_refused(optional_field: Path, fill: dict, message: str) -> None:
    """Before, each made the batch holding it a list, or a tensor of another dtype."""
    with pytest.raises(ValueError, match=re.escape(message)):
        make_loader(optional_field, fill=fill)


def test_a_fill_value_no_float_holds_is_refused_naming_the_field(tmp_path: Path) -> None:
    """It failed as the dataset was made with a bare OverflowError: int too large to convert to float."""
    with tarfile.open(tmp_path / "w-000000.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for n in range(4):
            for ext, data in [("cls", str(n).encode())] + ([("json", b"0.5")] if n % 2 else []):
                member = tarfile.TarInfo(f"k{n}.{ext}")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    assert pipeline.index_shards(tmp_path / "w-000000.tar", quiet=True).fields["json"].dtype == "float"
    with pytest.raises(ValueError, match=r"fill gives field 'json' the value 1000\d+, which a float does not hold"):
        make_loader(tmp_path, fill={"json": 10**400})


@pytest.mark.parametrize("workers", [0, 2])
def test_a_field_of_values_of_several_types_is_a_list_of_them_in_every_batch(tmp_path: Path, workers: int) -> None:
    """Labels written once as 3.5 (or one None among them): before, that batch was float64 (or a
    list), the others int64; then lists of 0-d tensors, in which the ints beside 3.5 were floats
    and the batch with None held Python values. So were ints beside one None (``w``)."""
    with pipeline.ShardWriter(tmp_path / "mixed") as writer:
        for n in range(64):
            writer.write({"y": 3.5 if n == 40 else None if n == 50 else n, "w": None if n == 9 else n * 2})
    assert pipeline.load_index(tmp_path / "mixed").fields["y"].dtype == "any"
    values, weights = [], []
    for batch in make_loader(tmp_path / "mixed", batch_size=8, shuffle=False, num_workers=workers):
        assert isinstance(batch["y"], list) and isinstance(batch["w"], list)
        values.extend(batch["y"])
        weights.extend(batch["w"])
    expected = [3.5 if n == 40 else None if n == 50 else n for n in range(64)]
    assert values == expected and list(map(type, values)) == list(map(type, expected))
    assert weights == [None if n == 9 else n * 2 for n in range(64)]
    assert {type(w) for n, w in enumerate(weights) if n != 9} == {int}


def test_a_field_optional_in_one_source_of_a_mix_is_a_list_in_every_batch(optional_field: Path,
                                                                         tmp_path: Path) -> None:
    """The mix took its fields' specs from its first source: with the whole one first, the
    batches holding the other's sample 5 were lists, the rest tensors."""
    whole = tmp_path / "whole"
    whole.mkdir()
    with wds.ShardWriter(str(whole / "w-%06d.tar"), maxcount=100, verbose=0) as sink:
        for i in range(40):
            sink.write({"__key__": f"s{i:02d}", "cls": i, "npy": np.full(3, i, np.float32)})
    pipeline.index_shards(str(whole), quiet=True)
    for mix in ({"whole": whole, "lacking": optional_field}, {"lacking": optional_field, "whole": whole}):
        assert all(isinstance(batch["npy"], list) for batch in make_loader(mix, batch_size=8))
        assert all(batch["npy"].shape == (8, 3) for batch in make_loader(mix, batch_size=8, fill={"npy": 0}))


def test_a_listed_field_named_first_in_as_tuple_goes_to_the_device_with_the_rest(optional_field: Path) -> None:
    """The prefetcher moved a list or tuple only when its first item was a tensor: a batch whose
    first field was a list stayed on the CPU, all of it."""
    loader = make_loader(optional_field, batch_size=8, as_tuple=["npy", "cls"], shuffle=False)
    npy, cls = next(iter(pipeline.DevicePrefetcher(loader, device="meta")))
    assert cls.device.type == "meta" and isinstance(npy, list) and npy[5] is None
    assert all(value.device.type == "meta" for n, value in enumerate(npy) if n != 5)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_optional_image_field_decoded_is_one_tensor_a_batch(tmp_path: Path, workers: int) -> None:
    """Decoded images are one tensor, however their bytes were stored: an optional image field was
    taken for one to hand out as a list."""
    import io

    from PIL import Image

    with wds.ShardWriter(str(tmp_path / "w-%06d.tar"), maxcount=100, verbose=0) as sink:
        for i in range(32):
            image = io.BytesIO()
            Image.fromarray(np.full((20, 24, 3), i, np.uint8)).save(image, format="PNG")
            sink.write({"__key__": f"s{i:02d}", "cls": i, **({} if i == 3 else {"png": image.getvalue()})})
    pipeline.index_shards(str(tmp_path), quiet=True)
    with pytest.warns(UserWarning, match="images names field 'png', which some samples lack"):
        loader = make_loader(tmp_path, batch_size=4, num_workers=workers, images={"png": pipeline.Images(16)},
                             on_error="skip")
    batches = list(loader)
    assert all(isinstance(batch["png"], torch.Tensor) and batch["png"].shape == (4, 3, 16, 16) for batch in batches)
    assert 3 not in [c for batch in batches for c in batch["cls"].tolist()]  # skipped: its stand-in came instead
