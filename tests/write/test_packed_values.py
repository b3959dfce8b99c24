"""Python numbers keep their values in packed records, and a loader reads the same batches from
a set packed K to a record as from one sample a record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import pipeline
from pipeline.format.errors import SampleError

COLUMNS = {
    "ints": [7, -2, 2**62 + 1, 12345678901234567],
    "bools": [True, False, False, True],
    "floats": [0.5, 1e300, -2.25, 3.0],
    "bool_and_int": [True, 2, 3, 4],
    "int_and_float": [1, 2.5, 3, 4],
    "large_int_and_float": [12345678901234567, 2.5, 3, 4],  # float64 would make it ...568: a list keeps it
    "with_none": [1, None, 3, 4],
    "int_and_str": [1, "a", 3, 4],
}


def _write(folder: Path, column: list[Any], pack: int) -> None:
    with pipeline.ShardWriter(folder, pack=pack, quiet=True) as writer:
        for value in column:
            writer.write({"v": value})


def _stored(folder: Path) -> list[Any]:
    """The values as the records hold them (no loader between)."""
    shard = next(folder.glob("*.tar"))
    with open(shard, "rb") as stream:
        return [row["v"] for record in pipeline.iter_records(stream, str(shard))
                for row in pipeline.unpack_rows(pipeline.decode_fields(record, str(shard)))]


def _batch(folder: Path) -> Any:
    return next(iter(pipeline.make_loader(folder, batch_size=4, shuffle=False)))["v"]


@pytest.mark.parametrize("name", COLUMNS)
def test_packed_python_values_are_stored_exactly_and_load_as_one_sample_a_record_does(tmp_path: Path,
                                                                                        name: str) -> None:
    column = COLUMNS[name]
    _write(tmp_path / "one", column, pack=1)
    _write(tmp_path / "packed", column, pack=4)
    stored = _stored(tmp_path / "packed")
    assert [type(value) if not isinstance(value, np.generic) else type(value.item()) for value in stored] == \
        [type(value) for value in column]
    assert [value if not isinstance(value, np.generic) else value.item() for value in stored] == column
    one, packed = _batch(tmp_path / "one"), _batch(tmp_path / "packed")
    if isinstance(one, torch.Tensor):
        assert packed.dtype == one.dtype and torch.equal(packed, one)
        assert [value.item() for value in packed] == column or name in ("bool_and_int", "int_and_float")
    else:
        assert packed == one == column


def test_an_int_beyond_int64_is_refused_at_the_build_with_what_to_write_instead(tmp_path: Path) -> None:
    """A batch's tensor cannot hold it: the loader made float64 of such IDs (2**64 - 1 read back
    as 2**64), and a packed record stored them so."""
    for pack in (1, 4):
        with pytest.raises(SampleError, match=r"field 'id': 18446744073709551615 does not fit int64.*"
                                              r"np\.uint64 .* or str"):
            with pipeline.ShardWriter(tmp_path / f"out{pack}", pack=pack, quiet=True) as writer:
                for i, value in enumerate([7, 2**64 - 1, 3, 4]):
                    writer.write({"id": value}, key=f"s{i}")
    with pytest.raises(SampleError, match=r"field 'id': NumPy makes this list float64, which does not hold "
                                          r"18446744073709551615 exactly; .*np\.uint64"):
        pipeline.write_shards(tmp_path / "arrays", {"id": [7, 2**64 - 1]}, quiet=True)


def test_ids_that_need_64_unsigned_bits_stream_exactly_as_a_uint64_array(tmp_path: Path) -> None:
    ids = np.array([7, 2**63 + 1, 2**64 - 1, 12345678901234567], dtype=np.uint64)
    pipeline.write_shards(tmp_path / "out", {"id": ids}, pack=4, quiet=True)
    batch = _batch_of(tmp_path / "out", "id")
    assert batch.dtype == torch.uint64 and [int(v) for v in batch.numpy()] == [int(v) for v in ids]


def _batch_of(folder: Path, field: str) -> Any:
    return next(iter(pipeline.make_loader(folder, batch_size=4, shuffle=False)))[field]


@pytest.mark.parametrize("pack", [1, 8])
def test_large_ints_beside_floats_keep_their_values_through_shuffled_windows_and_workers(tmp_path: Path,
                                                                                         pack: int) -> None:
    """Records, windows and messages of such a column are joined several times on the way."""
    column = [2**62 + i if i % 3 else i + 0.5 for i in range(300)]
    _write(tmp_path / "out", column, pack=pack)
    loader = pipeline.make_loader(tmp_path / "out", batch_size=16, num_workers=2, shuffle=True, seed=3)
    seen = [value.item() if hasattr(value, "item") else value for batch in loader for value in batch["v"]]
    assert sorted(seen) == sorted(column)
    assert [type(value) for value in sorted(seen)] == [type(value) for value in sorted(column)]
