"""A human-readable summary of a shard set: schema, counts, sizes and a few decoded samples.

Made from an index and samples already read (:mod:`pipeline.check.describe` reads them by path
or URL), and the samples of one shard read from a stream.
"""

from __future__ import annotations

import re
from typing import Any, BinaryIO, Iterator, Sequence

import numpy as np

from .index import DatasetIndex, Schema, ShardInfo
from .packing import sample_keys, unpack_rows
from .walk import walk_shard


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
    text = re.sub(r"\s*\n\s*", " ", text)  # an array's lines as one; a text's spaces as they are
    return text if len(text) <= width else text[:width - 3] + "..."


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def stream_samples(stream: BinaryIO, where: str, entry: ShardInfo | None = None,
                   schema: Schema | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(key, sample)`` of one shard read from ``stream``, packed records unpacked (for
    inspection); ``where`` names the shard in errors. Given the shard's index ``entry`` (and the
    index's ``schema``), every record is checked against it as a loader checks it (its offset,
    its checksum): what is shown of a damaged shard is an error, not its damaged values."""
    for walked in walk_shard(stream, where, schema=schema, entry=entry):
        yield from zip(sample_keys(walked.key, walked.fields), unpack_rows(walked.fields, walked.key))


def _metadata_lines(metadata: dict[str, Any]) -> list[str]:
    """The build's metadata: a class list as its count and first names, anything else as it is."""
    lines = []
    for name, value in metadata.items():
        if name == "classes" and isinstance(value, list):
            shown = ", ".join(map(str, value[:8])) + (", ..." if len(value) > 8 else "")
            lines.append(f"classes  {len(value)}: {shown}")
        else:
            lines.append(f"{name:<8} {_show(value)}")
    return lines


def describe_index(index: DatasetIndex, where: str, samples: Sequence[tuple[str, dict[str, Any]]] = ()) -> str:
    """The text ``python -m pipeline inspect`` prints for ``index``, read from ``where``, with
    ``samples`` (its first few, as ``(key, sample)``)."""
    sizes = index.shards.nbytes if len(index.shards) else np.zeros(1, np.int64)
    lines = [
        f"index    {where}",
        f"samples  {index.samples:,} in {len(index.shards)} shards, {index.records:,} records (pack={index.pack})",
        f"bytes    {human_bytes(index.bytes)}; shard sizes min {human_bytes(int(sizes.min()))} / "
        f"mean {human_bytes(int(sizes.mean()))} / max {human_bytes(int(sizes.max()))}",
    ]
    lines.extend(_metadata_lines(index.metadata))
    lines.append("fields")
    for name, spec in index.fields.items():
        shape = "" if spec.shape is None else " [" + ", ".join("?" if d is None else str(d) for d in spec.shape) + "]"
        lines.append(f"  {name:<16} {spec.dtype}{shape}{'  (optional: some samples lack it)' if spec.optional else ''}")
    if samples:
        lines.append(describe_samples(samples))
    return "\n".join(lines)


def describe_samples(samples: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """The part of :func:`describe_index`'s text that shows ``samples``: apart, so that the rest
    can be shown before they are read (and when reading them fails)."""
    lines = [f"first {len(samples)} samples"]
    for key, sample in samples:
        lines.append(f"  {key}")
        lines.extend(f"    {name:<14} {_show(value)}" for name, value in sample.items())
    return "\n".join(lines)
