"""``fields=[..., "__key__"]``: each sample's key in its batch, so that a prediction can be
named by the sample it is for: with an index or without, packed or not, mixed, and for the
samples that stand in for damaged ones."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

import pipeline
from pipeline import make_loader

pytestmark = pytest.mark.filterwarnings("ignore:.*suggested max number of worker")


def keyed(loader, field: str = "y") -> dict[str, int]:
    """Each sample's key and its ``field``, over an epoch; a key twice is a failure."""
    pairs = [(key, int(y)) for batch in loader for key, y in zip(batch["__key__"], batch[field])]
    assert len({key for key, _ in pairs}) == len(pairs)
    return dict(pairs)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("pack", [1, 8])
def test_keys_come_with_their_samples_given_or_numbered(tmp_path: Path, workers: int, pack: int) -> None:
    ids = [f"scan-{n:03d}" for n in range(90)]
    pipeline.write_shards(tmp_path / "named", {"y": np.arange(90)}, keys=ids, pack=pack, shard_samples=40, quiet=True)
    pipeline.write_shards(tmp_path / "numbered", {"y": np.arange(90)}, pack=pack, shard_samples=40, quiet=True)
    named = make_loader(tmp_path / "named", batch_size=16, num_workers=workers, fields=["y", "__key__"])
    assert keyed(named) == {key: n for n, key in enumerate(ids)}
    numbered = make_loader(tmp_path / "numbered", batch_size=16, num_workers=workers, fields=["y", "__key__"])
    assert keyed(numbered) == {f"{n:012d}": n for n in range(90)}
    batch = next(iter(make_loader(tmp_path / "named", batch_size=16, num_workers=workers)))
    assert sorted(batch) == ["y"]  # keys only when asked for


def test_keys_of_webdataset_shards_with_and_without_an_index_and_in_a_mix_and_a_tuple(tmp_path: Path) -> None:
    (tmp_path / "wds").mkdir()
    for shard in range(2):
        with wds.TarWriter(str(tmp_path / "wds" / f"w-{shard:06d}.tar")) as sink:
            for n in range(20):
                sink.write({"__key__": f"s{shard}/{n:03d}", "cls": shard * 100 + n})
    urls = sorted(str(path) for path in (tmp_path / "wds").glob("*.tar"))
    expected = {f"s{s}/{n:03d}": s * 100 + n for s in range(2) for n in range(20)}
    for workers in (0, 2):
        assert keyed(make_loader(urls, batch_size=8, num_workers=workers, fields=["cls", "__key__"]), "cls") == expected
    pipeline.index_shards(urls, quiet=True)
    assert keyed(make_loader(tmp_path / "wds", batch_size=8, num_workers=2, fields=["cls", "__key__"]),
                 "cls") == expected
    with pipeline.ShardWriter(tmp_path / "ours", pack=4) as writer:  # Python ints, as the webdataset shards hold
        for n in range(30):
            writer.write({"cls": 1000 + n})
    mix = make_loader({"wds": tmp_path / "wds", "ours": tmp_path / "ours"}, batch_size=8, num_workers=0,
                      fields=["cls", "__key__"])
    assert keyed(mix, "cls") == {**{f"wds/{key}": n for key, n in expected.items()},
                                 **{f"ours/{n:012d}": 1000 + n for n in range(30)}}
    keys, ys = next(iter(make_loader(tmp_path / "ours", batch_size=30, shuffle=False, num_workers=0,
                                     fields=["cls", "__key__"], as_tuple=["__key__", "cls"])))
    assert keys == [f"{n:012d}" for n in range(30)] and ys.tolist() == [1000 + n for n in range(30)]
    only = next(iter(make_loader(tmp_path / "ours", batch_size=4, shuffle=False, num_workers=0, fields=["__key__"])))
    assert only == {"__key__": [f"{n:012d}" for n in range(4)]}


def test_a_sample_that_stands_in_for_a_damaged_one_brings_its_own_key(tmp_path: Path) -> None:
    pipeline.write_shards(tmp_path, {"y": np.arange(40)}, keys=[f"k{n}" for n in range(40)], pack=1, quiet=True)
    shard = tmp_path / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    at = pipeline.load_index(tmp_path).shards[0].offsets[5] + 512  # record 5's payload
    data[at + 20] ^= 0xFF
    shard.write_bytes(bytes(data))
    loader = make_loader(tmp_path, batch_size=8, num_workers=0, on_error="skip", fields=["y", "__key__"])
    pairs = [(key, int(y)) for batch in loader for key, y in zip(batch["__key__"], batch["y"])]
    assert len(pairs) == 40 and all(key == f"k{y}" for key, y in pairs)  # each row's key is its own sample's
    assert "k5" not in {key for key, _ in pairs} and loader.stats()["replaced_samples"] == 1


def test_a_field_named_like_the_key_is_refused_when_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("field '__key__' (in memory): names starting with '__' are "
                                                   "reserved")):
        pipeline.write_shards(tmp_path, {"__key__": np.arange(3)}, quiet=True)
    with pytest.raises(pipeline.SampleError, match=re.escape("field name '__key__' is reserved (starts with '__')")):
        with pipeline.ShardWriter(tmp_path / "writer") as writer:
            writer.write({"__key__": 3})


def test_keys_in_a_mix_name_their_source_and_options_that_misuse_keys_say_so(tmp_path: Path) -> None:
    for name in ("a", "b"):
        pipeline.write_shards(tmp_path / name, {"y": np.arange(10) + (100 if name == "b" else 0)}, quiet=True)
    mix = make_loader({"a": tmp_path / "a", "b": tmp_path / "b"}, batch_size=4, num_workers=0, fields=["y", "__key__"])
    assert keyed(mix) == {f"{name}/{n:012d}": n + (100 if name == "b" else 0) for name in "ab" for n in range(10)}
    with pytest.raises(ValueError, match=re.escape("fill gives '__key__' a value, but every sample has its key")):
        make_loader(tmp_path / "a", fields=["y", "__key__"], fill={"__key__": "?"})
    with pytest.raises(ValueError, match=re.escape("as_tuple names ['__key__'], which are not in the index (it has "
                                                   "['y']); to read the samples' keys, name '__key__' in fields= too")):
        make_loader(tmp_path / "a", as_tuple=["__key__", "y"])


def test_packed_records_of_another_tool_without_numbered_keys_get_keys_of_their_own(tmp_path: Path) -> None:
    import msgpack

    with wds.TarWriter(str(tmp_path / "h-000000.tar")) as sink:
        for key, rows in (("rec-a", [0, 1]), ("rec-b", [2, 3]), ("rec-c", [4])):
            sink.write({"__key__": key, "msgpack": msgpack.packb({"y": rows, "__rows__": len(rows)})})
    urls = [str(tmp_path / "h-000000.tar")]
    expected = {"rec-a/0": 0, "rec-a/1": 1, "rec-b/0": 2, "rec-b/1": 3, "rec-c/0": 4}
    assert keyed(make_loader(urls, batch_size=2, num_workers=0, fields=["y", "__key__"])) == expected
    pipeline.index_shards(urls, quiet=True)
    assert keyed(make_loader(tmp_path, batch_size=2, num_workers=0, fields=["y", "__key__"])) == expected
