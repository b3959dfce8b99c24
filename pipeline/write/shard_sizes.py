"""Shards far from ``shard_bytes``, said after a build.

Shards are cut before any row is read, by sizes known then: a source of arrays or a table by
the size of its first record, a source of files by the files' sizes. Rows that vary in size
(bytes, lists) may then make shards far larger than ``shard_bytes``; files that hold more than
their samples (a ``.pt`` of a view of a larger tensor, ``torch.save(x[i])``, holds all of ``x``,
200 times its sample) far smaller ones: 40 shards of 24 KB where one of 1 MB was asked for. A
build says so, with the ``shard_samples`` that bounds them.
"""

from __future__ import annotations

from ..caller_warning import warn_caller
from ..format.index import ShardInfo
from ..format.tar import END_OF_ARCHIVE
from ..storage.destination import Destination


def warn_of_shard_sizes(shards: list[ShardInfo], shard_bytes: int | None, shard_samples: int | None,
                        target: Destination) -> None:
    """Warn of shards of several records over twice ``shard_bytes``, and of a set whose shards
    (but the last), not cut by ``shard_samples``, average under a quarter of it."""
    if not shard_bytes:
        return
    large = [info for info in shards if info.records > 1 and info.bytes > 2 * shard_bytes]
    if large:
        worst = max(large, key=lambda info: info.bytes)
        warn_caller(f"{len(large)} shard(s) hold more than twice shard_bytes={shard_bytes:,} (the largest, "
                    f"{target.url(worst.url)}, {worst.bytes:,} bytes in {worst.samples:,} samples): shards are cut by "
                    f"the size of the first record, and these rows vary in size; give shard_samples (--shard-samples) "
                    f"to bound them")
    full = shards[:-1]
    if len(full) < 2:
        return
    average = sum(info.bytes for info in full) // len(full)
    samples = sum(info.samples for info in full)
    if average < shard_bytes // 4 and samples and (shard_samples is None or samples < shard_samples * len(full)):
        records = sum(info.bytes - len(END_OF_ARCHIVE) for info in full)  # (each shard ends with 1 KiB of zeros)
        fitting = max((shard_bytes - len(END_OF_ARCHIVE)) * samples // max(records, 1), 1)
        warn_caller(f"{len(shards)} shards average {average:,} bytes, under a quarter of shard_bytes={shard_bytes:,}: "
                    f"shards are cut by sizes known before the build reads them (the input files' sizes, or a "
                    f"table's or arrays' first record), and these samples are smaller (a .pt of a view of a larger "
                    f"tensor, torch.save(x[i]), holds all of it: save x[i].clone(); a table sorted longest first); "
                    f"for shards of about shard_bytes, give shard_samples={fitting} and shard_bytes=None "
                    f"(--shard-samples {fitting} --shard-bytes none)")
