"""A human-readable summary of a shard set: schema, counts, sizes and a few decoded samples."""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .index import INDEX_NAME, DatasetIndex, load_index
from .packing import sample_keys, unpack_rows
from .records import decode_fields, iter_records


def _show(value: Any, width: int = 100) -> str:
    if isinstance(value, np.generic):
        text = f"{value.dtype.name} {value.item()!r}"
    elif isinstance(value, np.ndarray):
        body = np.array2string(value, threshold=8, edgeitems=3, max_line_width=width)
        text = f"{value.dtype.name}{list(value.shape)} {body}"
    elif isinstance(value, bytes):
        text = f"bytes[{len(value)}] {value[:24]!r}"
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3] + "..."


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def iter_samples(index_path: Path, index: DatasetIndex) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(key, sample)`` in index order, packed records unpacked (for inspection)."""
    for info in index.shards:
        with open(index_path.parent / info.url, "rb") as src:
            for record in iter_records(src, info.url):
                fields = decode_fields(record, info.url)
                yield from zip(sample_keys(record.key, fields), unpack_rows(fields, record.key))


def describe(index_path: str | os.PathLike[str], samples: int = 3) -> str:
    """The text ``python -m pipeline inspect`` prints."""
    index_path = Path(index_path)
    if index_path.is_dir():
        index_path = index_path / INDEX_NAME
    index = load_index(index_path)
    sizes = index.shards.nbytes if len(index.shards) else np.zeros(1, np.int64)
    lines = [
        f"index    {index_path}",
        f"samples  {index.samples:,} in {len(index.shards)} shards, {index.records:,} records (pack={index.pack})",
        f"bytes    {human_bytes(index.bytes)}; shard sizes min {human_bytes(int(sizes.min()))} / "
        f"mean {human_bytes(int(sizes.mean()))} / max {human_bytes(int(sizes.max()))}",
        "fields",
    ]
    for name, spec in index.fields.items():
        shape = "" if spec.shape is None else " [" + ", ".join("?" if d is None else str(d) for d in spec.shape) + "]"
        lines.append(f"  {name:<16} {spec.dtype}{shape}")
    if samples:
        lines.append(f"first {samples} samples")
        for key, sample in islice(iter_samples(index_path, index), samples):
            lines.append(f"  {key}")
            lines.extend(f"    {name:<14} {_show(value)}" for name, value in sample.items())
    return "\n".join(lines)
