"""Shards written by other tools (webdataset, GNU tar), indexed in place by ``pipeline index``: not a
byte of them changes, and they get every promise of the shards this library writes."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

import pipeline
from pipeline import ShardError
from pipeline.format.errors import IndexFormatError
from pipeline.format.index import FieldSpec
from pipeline.format.tar import iter_members
from pipeline.storage.indexes import NoIndexError
from tests.helpers import index_content

SIZES = [130, 47, 260, 11, 95]


def webdataset_shards(folder: Path, sizes: list[int] = SIZES, suffix: str = ".tar") -> list[str]:
    """Shards of the given sizes written by webdataset: sample ``n`` has ``npy`` (4 float32 of n),
    ``cls`` (n), ``json`` ({"n": n}), and ``txt`` except when n is a multiple of 7."""
    folder.mkdir(parents=True, exist_ok=True)
    urls, n = [], 0
    for s, count in enumerate(sizes):
        url = str(folder / f"w-{s:06d}{suffix}")
        with wds.TarWriter(url, compress=suffix.endswith(".gz")) as sink:
            for _ in range(count):
                sample = {"__key__": f"s{n:06d}", "npy": np.full(4, n, np.float32), "cls": n, "json": {"n": n}}
                if n % 7:
                    sample["txt"] = f"sample {n}"
                sink.write(sample)
                n += 1
        urls.append(url)
    return urls


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.tar*"))}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def indexed(tmp_path: Path) -> Path:
    folder = tmp_path / "wds"
    webdataset_shards(folder)
    before = digests(folder)
    result = cli("index", str(folder / "w-{000000..000004}.tar"), "--workers", "2")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().endswith(f"-> {folder / 'index.json'}") and "indexed 543 samples in 5 shards" \
        in result.stderr
    assert digests(folder) == before  # not a byte of the shards changed
    return folder


def every_sample(loader) -> list[int]:
    seen = []
    for batch in loader:
        cls = batch["cls"].tolist()
        assert batch["npy"][:, 0].tolist() == [float(n) for n in cls]  # every field of the right sample
        assert batch["txt"] == [None if n % 7 == 0 else f"sample {n}" for n in cls]
        assert [j["n"] for j in batch["json"]] == cls
        seen += cls
    return seen


def test_an_index_gives_webdataset_shards_exact_epochs_and_webdataset_still_reads_them(indexed: Path) -> None:
    index = pipeline.load_index(indexed)
    assert index.samples == sum(SIZES) and index.records == sum(SIZES) and index.pack == 1
    assert index.fields == {"cls": pipeline.FieldSpec("int", None), "json": pipeline.FieldSpec("dict", None),
                            "npy": pipeline.FieldSpec("float32", (4,)),
                            "txt": pipeline.FieldSpec("str", None, optional=True)}
    assert json.loads((indexed / "index.json").read_text())["fields"]["txt"]["optional"] is True
    for workers in (0, 2):
        loader = pipeline.make_loader(indexed, num_workers=workers, batch_size=32, seed=1, shuffle_buffer=100)
        assert sorted(every_sample(loader)) == list(range(sum(SIZES)))
    with pytest.raises(ValueError, match=r"fill keys \['caption'\] are not in the index \(it has \['cls', 'json', "
                                         r"'npy', 'txt'\]\)"):
        pipeline.make_loader(indexed, fill={"caption": ""})  # a misspelt name is an error, not a column
    lengths = {len(pipeline.make_loader(indexed, num_workers=2, batch_size=32, rank=r, world_size=3)) for r in range(3)}
    assert len(lengths) == 1  # equal batch counts on every rank
    assert pipeline.verify(indexed) == []
    samples = list(wds.WebDataset(sorted(map(str, indexed.glob("*.tar"))), shardshuffle=False).decode())
    assert [s["cls"] for s in samples] == list(range(sum(SIZES)))


def delivered_across_a_resume(source: str | Path, stop_after: int) -> list[int]:
    """The samples of one epoch read by 2 workers for ``stop_after`` batches, then by a loader
    of 1 worker resumed from the first one's state."""
    options = dict(batch_size=16, seed=3, shuffle_buffer=80)
    loader = pipeline.make_loader(source, num_workers=2, **options)
    head = []
    for n, batch in enumerate(loader, start=1):
        head += batch["cls"].tolist()
        if n == stop_after:
            state = loader.state_dict()
            break
    resumed = pipeline.make_loader(source, num_workers=1, **options)
    resumed.load_state_dict(state)
    return head + every_sample(resumed)


def test_a_resume_with_another_number_of_workers_delivers_the_rest_once(indexed: Path) -> None:
    assert sorted(delivered_across_a_resume(indexed, stop_after=9)) == list(range(sum(SIZES)))


def flip(shard: Path, at: int) -> None:
    data = bytearray(shard.read_bytes())
    data[at] ^= 0x10
    shard.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["payload", "header"])
def test_damage_costs_the_damaged_record_only(indexed: Path, where: str) -> None:
    """A flipped byte in a .npy member's data (its checksum fails) or in its tar header (the tar
    structure breaks there): an error naming shard and byte, or under the skip policy one sample
    lost and counted, every other one delivered."""
    shard = indexed / "w-000002.tar"
    lost = 130 + 47 + 100  # the 101st sample of the third shard
    data = shard.read_bytes()
    member = next(m for m in iter_members(data, str(shard)) if m.name == f"s{lost:06d}.npy")
    body = data.index(bytes(member.data), member.offset)  # after its headers (webdataset writes PAX ones)
    flip(shard, body + 130 if where == "payload" else member.offset + 20)  # a float of x; the header's name
    with pytest.raises(ShardError, match=r"w-000002\.tar at byte \d+: "):
        for _ in pipeline.make_loader(indexed, num_workers=0, batch_size=32, shuffle=False):
            pass
    loader = pipeline.make_loader(indexed, num_workers=2, batch_size=32, shuffle_buffer=100, on_error="skip")
    seen = every_sample(loader)
    assert len(seen) == sum(SIZES)  # another sample stands in for the lost one
    assert set(seen) == set(range(sum(SIZES))) - {lost}
    assert loader.stats()["skipped_pieces"] == 1 and loader.stats()["replaced_samples"] == 1


def test_gnu_tar_shards_with_their_padding_index_and_stream(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    for n in range(30):
        (files / f"{n:04d}.txt").write_text(f"text {n}")
        (files / f"{n:04d}.cls").write_text(str(n % 3))
    shards = tmp_path / "shards"
    shards.mkdir()
    names = sorted(p.name for p in files.iterdir())
    subprocess.run(["tar", "-cf", str(shards / "a.tar"), *names[:30]], cwd=files, check=True)
    subprocess.run(["tar", "-cf", str(shards / "b.tar"), *names[30:]], cwd=files, check=True)
    assert (shards / "a.tar").stat().st_size % 10240 == 0  # GNU tar pads the archive to its blocking factor
    index = pipeline.index_shards(shards, quiet=True)
    assert index.samples == 30 and index.fields["txt"] == pipeline.FieldSpec("str", None)
    texts = sorted(t for batch in pipeline.make_loader(shards, num_workers=0, batch_size=7) for t in batch["txt"])
    assert texts == sorted(f"text {n}" for n in range(30))


def test_our_own_shards_indexed_again_give_back_their_index(tmp_path: Path) -> None:
    x = np.arange(5000 * 3, dtype=np.float32).reshape(5000, 3)
    built = pipeline.write_shards(tmp_path / "set", {"x": x, "y": np.arange(5000)}, pack=64, shard_samples=1200,
                                  quiet=True)
    (tmp_path / "set" / "index.json").unlink()
    (tmp_path / "set" / "index.bin").unlink()
    again = pipeline.index_shards(tmp_path / "set", quiet=True)
    assert index_content(again) == index_content(built)


def test_a_copy_of_a_shard_beside_it_is_named_in_a_warning_when_indexed(tmp_path: Path) -> None:
    urls = webdataset_shards(tmp_path, [5, 7, 6])
    copy = tmp_path / "w-000009.tar"
    copy.write_bytes(Path(urls[1]).read_bytes())
    with pytest.warns(UserWarning, match=re.escape(f"1 shard(s) hold the same bytes as another, e.g. {copy} and "
                                                   f"{urls[1]}: the index names both, so each of their samples comes "
                                                   f"twice an epoch")):
        index = pipeline.index_shards(tmp_path, quiet=True)
    assert index.samples == 25
    copy.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pipeline.index_shards(tmp_path, overwrite=True, quiet=True).samples == 18


def test_gzipped_shards_stream_without_an_index_and_the_indexer_says_why_not(tmp_path: Path) -> None:
    urls = webdataset_shards(tmp_path / "gz", [40, 25], suffix=".tar.gz")
    fields = ["cls", "json", "npy", "txt"]  # without an index, the first sample's fields are all there is,
    with pytest.raises(ShardError, match=r"the first record, 's000000', has no field \['txt'\] \(it has \['cls', "
                                         r"'json', 'npy'\]\): check fields=, or give fill= a value for them"):
        every_sample(pipeline.make_loader(urls, num_workers=0, batch_size=8, fields=fields, shuffle=False))
    fill = {"txt": None}  # and a field it lacks needs a value (None is one): a misspelt name is not a column
    seen = every_sample(pipeline.make_loader(urls, num_workers=2, batch_size=8, fields=fields, fill=fill))
    assert sorted(seen) == list(range(65))
    with pytest.raises(ShardError, match=r"w-000000\.tar\.gz at byte 0: is gzip-compressed \(a \.tar\.gz\), not a "
                                         r"plain tar: .*decompress it \(gunzip\) to index it"):
        pipeline.index_shards(urls, quiet=True)
    folder = tmp_path / "gz"  # (the hint said to index them in place, which the indexer refuses)
    with pytest.raises(NoIndexError, match=re.escape(
            f"; {folder} holds 2 compressed shard(s) without an index: they stream as they are, by their paths (a "
            f"pattern: {folder}/name-{{000000..000009}}.tar.gz); an index needs plain tars (decompress them, then "
            f"'pipeline index {folder}')")):
        pipeline.make_loader(folder, num_workers=0)


def test_an_index_elsewhere_names_the_shards_relative_to_it(tmp_path: Path) -> None:
    urls = webdataset_shards(tmp_path / "data" / "a", [30]) + webdataset_shards(tmp_path / "data" / "b", [20])
    with pytest.raises(ValueError, match=r"the shards are in 2 folders .*give the index a place with --output"):
        pipeline.index_shards(urls, quiet=True)
    result = cli("index", *urls, "--output", tmp_path / "indexes" / "both.json")
    assert result.returncode == 0, result.stderr
    names = list(pipeline.load_index(tmp_path / "indexes" / "both.json").shards.names)
    assert names == ["../data/a/w-000000.tar", "../data/b/w-000000.tar"]
    loader = pipeline.make_loader(tmp_path / "indexes" / "both.json", num_workers=0, batch_size=16)
    assert sorted(every_sample(loader)) == sorted(list(range(30)) + list(range(20)))  # each set numbers from 0
    again = cli("index", *urls, "--output", tmp_path / "indexes" / "both.json")
    assert again.returncode == 1 and "already exists; pass --overwrite (overwrite=True in Python)" in again.stderr


def test_an_index_in_a_folder_that_is_a_link_names_the_shards_from_where_it_points(tmp_path: Path) -> None:
    """Names were made relative by the paths' text: from idx -> /scratch/indexes, '../data' is
    /scratch/data to the system, and the new index named shards that are not there (verify said
    missing a file that ls found); merge-index too."""
    urls = webdataset_shards(tmp_path / "data", [30])
    (tmp_path / "scratch" / "indexes").mkdir(parents=True)
    (tmp_path / "idx").symlink_to(tmp_path / "scratch" / "indexes")
    result = cli("index", *urls, "--output", tmp_path / "idx")
    assert result.returncode == 0, result.stderr
    assert list(pipeline.load_index(tmp_path / "idx").shards.names) == ["../../data/w-000000.tar"]
    assert pipeline.verify(tmp_path / "idx") == []
    for part in range(2):
        pipeline.write_shards(tmp_path / "parts", {"i": np.arange(100)}, shard_samples=50, part=pipeline.Part(part, 2),
                              quiet=True)
    (tmp_path / "idx" / "merged").mkdir()
    pipeline.merge_index_files([tmp_path / "parts"], tmp_path / "idx" / "merged" / "index.json")
    assert pipeline.verify(tmp_path / "idx" / "merged") == []



@pytest.mark.parametrize("form", ["pattern", "folder"])
def test_shards_named_by_file_urls_are_indexed_as_their_paths_are(tmp_path: Path, form: str) -> None:
    webdataset_shards(tmp_path / "da ta", [30, 20])
    given = (tmp_path / "da ta").as_uri() + "/" + ("w-{000000..000001}.tar" if form == "pattern" else "")  # da%20ta
    result = cli("index", given, "--output", tmp_path / "out" / "index.json")
    assert result.returncode == 0, result.stderr
    assert list(pipeline.load_index(tmp_path / "out").shards.names) == ["../da ta/w-000000.tar", "../da ta/w-000001.tar"]
    assert pipeline.load_index(tmp_path / "out").samples == 50

def test_bad_input_to_the_indexer_is_one_clear_line(tmp_path: Path) -> None:
    result = cli("index", tmp_path / "nope-{000000..000001}.tar")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{tmp_path / 'nope-000000.tar'}: no such shard" in result.stderr
    (tmp_path / "junk.tar").write_bytes(b"not a tar" * 100)
    result = cli("index", tmp_path / "junk.tar")
    assert result.returncode == 1 and "junk.tar at byte 0: non-numeric checksum b'a tarnot' in tar header: not a " \
        "tar file (or its first header is damaged)" in result.stderr


def test_the_indexing_benchmark_runs(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_indexing.py"
    result = subprocess.run([sys.executable, str(script), "--quick", "--out", str(tmp_path)],  # a folder, as for every bench
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    faults = {row["damage"]: row for row in json.loads((tmp_path / "indexing.json").read_text())["faults"]}
    assert faults["payload byte"]["lost_with_index"] == 1 and faults["payload byte"]["wrong_with_index"] == 0
    assert faults["header byte"]["lost_with_index"] == 1
    assert faults["payload byte"]["wrong_without"] == 1  # without an index, nothing checks the bytes


def test_without_an_index_a_member_that_does_not_decode_costs_its_sample_only(tmp_path: Path) -> None:
    folder = tmp_path / "wds"
    folder.mkdir()
    with wds.TarWriter(str(folder / "a.tar")) as sink:
        for n in range(40):
            sink.write({"__key__": f"s{n:03d}", "cls": n, "json": b"{not json" if n == 17 else b'{"n": 1}'})
    urls = [str(folder / "a.tar")]
    with pytest.raises(ShardError, match=r"a\.tar at byte \d+: record 's017', member 'json': JSONDecodeError"):
        list(pipeline.ShardDataset(urls, batch_size=8, shuffle=False))
    dataset = pipeline.ShardDataset(urls, batch_size=8, shuffle=False, on_error="skip")
    seen = [n for batch in dataset for n in batch["cls"].tolist()]
    assert seen == [n for n in range(40) if n != 17] and dataset.stats()["skipped_pieces"] == 1


def test_a_folder_of_plain_and_compressed_shards_is_refused_naming_the_compressed_ones(tmp_path: Path) -> None:
    """Indexing the plain ones alone would leave the others' samples out without a word."""
    webdataset_shards(tmp_path / "set", [30])
    webdataset_shards(tmp_path / "gz", [20, 10], suffix=".tar.gz")
    for path in (tmp_path / "gz").iterdir():
        (tmp_path / "set" / path.name.replace("w-", "z-")).write_bytes(path.read_bytes())
    with pytest.raises(ValueError, match=r"set holds 2 compressed shards \(z-000000\.tar\.gz, z-000001\.tar\.gz\) "
                                         r"beside 1 plain one: an index needs plain tar files; decompress them "
                                         r"\(gunzip, unxz, unzstd\) and index the folder again, or move them "
                                         r"out of it"):
        pipeline.index_shards(tmp_path / "set", quiet=True)
    assert not (tmp_path / "set" / "index.json").exists()
    with pytest.raises(ValueError, match=r"gz holds compressed shards only: .* gzip-compressed ones stream without one as they are"):
        pipeline.index_shards(tmp_path / "gz", quiet=True)


def test_a_compressed_shard_given_for_an_index_is_told_to_stream_as_it_is(tmp_path: Path) -> None:
    """The indexer refuses compressed shards: advising `pipeline index` for one led nowhere."""
    with pytest.raises(pipeline.IndexFormatError, match=r"x\.tar\.gz is a shard \(gzip-compressed\), not an index: "
                                                        r"a loader streams it as it is \(make_loader\)"):
        pipeline.load_index(tmp_path / "x.tar.gz")


def test_keys_with_dots_that_split_a_sample_are_told_where_a_key_ends(tmp_path: Path) -> None:
    with wds.TarWriter(str(tmp_path / "w-000000.tar")) as sink:
        for key in ("img.000", "img_001", "img.002"):  # keys "img", "img_001", "img": the dot ends a key
            sink.write({"__key__": key, "cls": 1})
    with pytest.raises(ShardError, match=re.escape("record key 'img' appears twice (first at byte 0): a key ends at "
                                                   "the first dot of a member's name (img.002.cls): replace the dots "
                                                   "in the names' keys")):
        pipeline.index_shards(tmp_path, quiet=True)


def test_shards_whose_field_changes_dtype_are_told_to_be_written_again_not_given_a_build_option(
        tmp_path: Path) -> None:
    """The indexer suggested --dtype ... (dtypes=), which only a build takes."""
    with wds.TarWriter(str(tmp_path / "w-000000.tar")) as sink:
        for n, dtype in enumerate((np.float64, np.float32)):
            sink.write({"__key__": f"s{n}", "npy": np.zeros(3, dtype)})
    with pytest.raises(ShardError, match=re.escape(
            "w-000000.tar at byte 2048: record 's1': field 'npy' has dtype float32, earlier samples float64; a field needs one dtype: write the "
            "shards again with the values cast to one (shards of this library: build them again from your data with "
            "--dtype npy=float64 (dtypes=))")):
        pipeline.index_shards(tmp_path, quiet=True)


def _tar_of(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_extensions_are_fields_in_lower_case_as_webdataset_reads_them(tmp_path: Path) -> None:
    """Samples of cat.jpg beside dog.JPG (a camera's, a Windows tool's): two optional fields,
    "jpg" and "JPG", and the loader handed None for "jpg" in every other sample."""
    folder = tmp_path / "set"
    folder.mkdir()
    _tar_of(folder / "w-000000.tar", [member for i, ext in enumerate(["jpg", "JPG", "Jpg", "jpg"])
                                      for member in ((f"s{i}.{ext}", b"image %d" % i), (f"s{i}.CLS", b"%d" % i))])
    expected = [sorted(k for k in sample if not k.startswith("__"))
                for sample in wds.WebDataset(str(folder / "w-000000.tar"), shardshuffle=False)]
    assert expected == [["cls", "jpg"]] * 4
    index = pipeline.index_shards(folder, quiet=True)
    assert {name: spec.optional for name, spec in index.fields.items()} == {"jpg": False, "cls": False}
    for source in (folder, [str(folder / "w-000000.tar")]):  # indexed, and read without the index
        batch = next(iter(pipeline.ShardDataset(source, batch_size=4, shuffle=False, allow_uneven=True)))
        assert batch["jpg"] == [b"image %d" % i for i in range(4)] and batch["cls"].tolist() == [0, 1, 2, 3]
    _tar_of(folder / "w-000000.tar", [("s0.jpg", b"a"), ("s0.JPG", b"b")])
    with pytest.raises(ShardError, match="record 's0' has two 'jpg' members"):
        pipeline.index_shards(folder, overwrite=True, quiet=True)


def test_an_int_member_that_int64_cannot_hold_makes_its_field_lists_in_every_batch(tmp_path: Path) -> None:
    """A .id of 2**63 among small ones: the index called the field "int", and its batches were a
    tensor, then a list of NumPy scalars."""
    folder = tmp_path / "set"
    folder.mkdir()
    _tar_of(folder / "w-000000.tar", [(f"k{i}.id", str(value).encode()) for i, value in enumerate([1, 2, 3, 2**63])])
    assert pipeline.index_shards(folder, quiet=True).fields["id"].dtype == "any"
    batches = [batch["id"] for batch in pipeline.ShardDataset(folder, batch_size=2, shuffle=False)]
    assert batches == [[1, 2], [3, 2**63]]


def test_a_batch_of_ints_int64_cannot_hold_only_is_a_list_indexed_or_not(tmp_path: Path) -> None:
    """A batch whose every .id is 2**63 or more (64-bit hashes: a batch of one, half the time)
    was stacked as uint64, which no tensor holds: the loader died at it, naming nothing."""
    folder = tmp_path / "set"
    folder.mkdir()
    values = [17, 2**63 + 5, 2**64 - 1]
    _tar_of(folder / "w-000000.tar", [(f"k{i}.id", str(value).encode()) for i, value in enumerate(values)])
    shard = [str(folder / "w-000000.tar")]
    for source in (shard, folder):
        if source is folder:
            pipeline.index_shards(folder, quiet=True)
        for batch_size in (1, 3):
            loader = pipeline.make_loader(source, num_workers=0, batch_size=batch_size, shuffle=False)
            assert [int(i) for batch in loader for i in batch["id"]] == values


def test_npy_text_arrays_of_any_width_are_indexed_and_read_as_they_are(tmp_path: Path) -> None:
    """NumPy gives a text array the width of its longest string (<U3, <U8): the index refused
    them as a field of two dtypes (str96, str256), offering a --dtype that cut 'elephant' short."""
    tags = [["cat", "dog"], ["bird", "elephant"], ["ox"], [b"raw"]]
    (tmp_path / "tags").mkdir()
    with wds.TarWriter(str(tmp_path / "tags" / "t-000000.tar")) as sink:
        for n, words in enumerate(tags[:3]):
            sink.write({"__key__": f"t{n}", "cls": n, "npy": np.array(words)})
    pipeline.index_shards(tmp_path / "tags", quiet=True)
    assert pipeline.load_index(tmp_path / "tags").fields["npy"] == FieldSpec("str256", (None,))
    assert pipeline.verify(tmp_path / "tags") == []
    batch = next(iter(pipeline.make_loader(tmp_path / "tags", num_workers=0, batch_size=3, shuffle=False)))
    assert [words.tolist() for words in batch["npy"]] == tags[:3]
    with wds.TarWriter(str(tmp_path / "tags" / "t-000001.tar")) as sink:  # bytes beside str: two kinds
        sink.write({"__key__": "t3", "cls": 3, "npy": np.array(tags[3])})
    with pytest.raises(IndexFormatError, match=r"field 'npy' has dtype (bytes24, earlier samples str256|str256, "
                                               r"earlier samples bytes24)"):
        pipeline.index_shards(tmp_path / "tags", overwrite=True, quiet=True)


def test_a_set_indexed_again_in_place_keeps_its_class_names(tmp_path: Path) -> None:
    """pipeline index --overwrite dropped metadata["classes"], which the shards do not hold: a mix
    of sets that number their classes differently was no longer refused."""
    for n in range(4):
        np.save(tmp_path / f"s{n}.npy", np.full(3, n, np.float32))
    labels = {f"s{n}": ["cat", "dog"][n % 2] for n in range(4)}
    pipeline.build_sample_files(tmp_path, labels, {"train": list(labels)}, tmp_path / "out", quiet=True)
    assert pipeline.index_shards(tmp_path / "out" / "train", overwrite=True, quiet=True).metadata == {
        "classes": ["cat", "dog"]}
    assert pipeline.load_index(tmp_path / "out" / "train").metadata == {"classes": ["cat", "dog"]}
    for shard in (tmp_path / "out" / "train").glob("*.tar"):  # the folder holds another set by now
        shard.unlink()
    webdataset_shards(tmp_path / "out" / "train", [5, 7])
    assert pipeline.index_shards(tmp_path / "out" / "train", overwrite=True, quiet=True).metadata == {}
