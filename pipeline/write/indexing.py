"""Index shards written by other tools in place: ``pipeline index SHARDS...``.

A shard written by ``webdataset.ShardWriter``, ``tar`` or any other tool is a plain tar whose
members group into records by key. Scanning it once (:func:`~pipeline.format.scan.scan_stream`)
gives everything an index holds: its size and sha256, the byte offset and checksum of every
record, its samples, and the fields with their types (``.npy`` dtype and shape, ``.cls`` ints,
``.json``, ``.txt``, other extensions as bytes; a field that some samples lack is optional).
With that index beside them, the shards have every promise of the shards this library writes
(exact epochs, equal batches on every rank, ranged reads, resume, record checksums), and not a
byte of them changes: webdataset still reads them as before.
"""

from __future__ import annotations

import os
import posixpath
from concurrent.futures import Executor
from typing import Sequence

from braceexpand import braceexpand

from ..caller_warning import warn_caller
from ..format.errors import IndexFormatError
from ..format.index import INDEX_NAME, DatasetIndex, Schema, ShardInfo, merge_schema
from ..format.scan import scan_stream
from ..storage import is_remote, join, open_stream, parent, redact, scheme
from ..storage.destination import Destination, destination
from ..storage.indexes import load_index
from ..storage.location_hints import SHARD_SUFFIXES, stopped_build
from ..storage.opener import local_path
from .engines import check_engine, open_workers
from .output import OutputExistsError, hold_output, part_index_names, save_index
from .progress import BuildProgress
from .source import check_limits


def _is_folder(url: str) -> bool:
    if not is_remote(url):
        return os.path.isdir(url)
    return url.endswith("/") or (scheme(url) == "s3" and not url.endswith((*SHARD_SUFFIXES, *COMPRESSED_SUFFIXES)))


def shard_urls(shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """The shards named: paths or URLs, brace patterns expanded (``x-{000000..000009}.tar``), and
    a folder (local, or an ``s3://`` prefix) standing for the ``.tar`` files directly in it."""
    given = [shards] if isinstance(shards, (str, os.PathLike)) else list(shards)
    urls: list[str] = []
    for item in map(os.fspath, given):
        for url in map(local_path, braceexpand(item)):  # a file:// URL as the path it names
            if not _is_folder(url):
                urls.append(url)
                continue
            if scheme(url) in ("http", "https"):
                raise ValueError(f"{redact(url)}: an HTTP folder cannot be listed; name its shards (a brace "
                                 f"pattern: .../train-{{000000..000099}}.tar)")
            names = destination(url).list("")
            plain = [name for name in names if name.endswith(".tar")]
            _refuse_compressed(url, [name for name in names if name.endswith(COMPRESSED_SUFFIXES)], len(plain))
            urls.extend(join(url, name) for name in plain)
    if not urls:
        raise ValueError(f"no shards (.tar files) in {', '.join(map(os.fspath, given))}")
    for url in urls:
        if scheme(url) == "pipe":
            raise ValueError(f"{redact(url)}: a pipe: command cannot be indexed (an index names files to read by "
                             f"byte ranges)")
        if not is_remote(url) and not os.path.isfile(url):
            raise FileNotFoundError(f"{url}: no such shard")
    seen: dict[str, str] = {}
    for url in urls:
        key = _canonical(url)
        if key in seen:
            also = f" (also as {redact(seen[key])})" if seen[key] != url else ""
            raise ValueError(f"{redact(url)} is named twice{also}: each shard must be indexed once")
        seen[key] = url
    return urls


#: Shards compressed whole, which stream in order but cannot be read by byte ranges.
COMPRESSED_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


def _refuse_compressed(folder: str, compressed: list[str], plain: int) -> None:
    """Refuse a folder holding compressed shards: only the plain ones could be indexed, and the
    others' samples would be left out without a word."""
    if not compressed:
        return
    if not plain:
        raise ValueError(f"{redact(folder)} holds compressed shards only: an index needs plain tar files "
                         f"(decompress them: gunzip, unxz, unzstd); gzip-compressed ones stream without one as they are")
    shown = ", ".join(compressed[:3]) + (", ..." if len(compressed) > 3 else "")
    raise ValueError(f"{redact(folder)} holds {len(compressed)} compressed shards ({shown}) beside {plain} plain "
                     f"one{'s' if plain > 1 else ''}: an index needs plain tar files; decompress them (gunzip, unxz, unzstd) "
                     f"and index the folder again, or move them out of it")


def _canonical(url: str) -> str:
    """One spelling per file: ``./wds/a.tar``, ``wds/a.tar`` and its absolute path are one shard."""
    return url if is_remote(url) else os.path.realpath(url)


def scan_url(url: str) -> tuple[ShardInfo, Schema, list[int]]:
    """Scan one shard, read once from its URL (the task each worker runs)."""
    with open_stream(url) as stream:
        return scan_stream(stream, redact(url))


def relative_name(url: str, folder: str) -> str:
    """How an index in ``folder`` names the shard at ``url``: relative when both are on the same
    disk, host or bucket, else the whole URL."""
    if is_remote(url) != is_remote(folder):
        if is_remote(folder):  # (a remote index is refused what names this machine's files: see storage.opener.join)
            raise ValueError(f"{url} is a file on this machine, which an index at {folder} cannot name (a remote "
                             f"index names shards over HTTP(S), S3 or its own scheme): upload the shards beside "
                             f"the index first and index them there, or write the index to a local folder")
        return url
    if not is_remote(url):  # (as the system resolves '..': past a folder that is a link, from where it points)
        path = os.path.abspath(local_path(url))  # (its last name, a link or not, is followed from there)
        real = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        return os.path.relpath(real, os.path.realpath(local_path(folder)))
    head, _, path = url.partition("://")
    base_head, _, base = folder.rstrip("/").partition("://")
    if head != base_head or path.split("/", 1)[0] != base.split("/", 1)[0]:
        return url
    return posixpath.relpath(path, base)


def _refuse_stopped_builds(urls: list[str]) -> None:
    """Refuse to index the shards of a build of this library that stopped part way (or is
    writing them now), found by the plan it keeps in their folder (or in that of the index):
    indexed, the shards it finished pass for a whole set, and its resume then refuses that set."""
    for folder in sorted({parent(url) for url in urls if not is_remote(url)}):
        stopped = stopped_build(folder or ".")
        if stopped:
            raise OutputExistsError(stopped)


def _metadata_kept(target: Destination, name: str, names: list[str]) -> dict:
    """The metadata of the index ``name`` that a re-index replaces (a build's class names, by
    which mixes of sets that number classes differently are refused): the shards' bytes say
    nothing of it. Kept only where that index names one of the shards indexed now (``names``):
    the folder may hold another set by now. Nothing from an index that cannot be read."""
    if not target.exists(name):
        return {}
    try:
        old = load_index(target.url(name))
    except Exception:  # noqa: BLE001 - an index damaged or of another version: nothing to keep
        return {}
    return dict(old.metadata) if set(old.shards.names) & set(names) else {}


def _pack(rows: list[list[int]], urls: list[str]) -> int:
    """The samples per record of the set: 1 (one sample a record, as other tools write), or the
    ``K`` of packed records (each shard's last record may hold fewer)."""
    pack = max((r[0] for r in rows if r), default=1)
    for url, shard in zip(urls, rows):
        if any(n != pack for n in shard[:-1]) or (shard and shard[-1] > pack):
            raise IndexFormatError(f"{redact(url)}: records hold {sorted(set(shard))} samples, other shards "
                                   f"{pack}: an index needs one record size (every record but a shard's last)")
    return pack


def _warn_of_copies(urls: list[str], entries: list[ShardInfo]) -> None:
    """Shards of the same bytes (a copy made beside the shards) give their samples twice an
    epoch: a warning naming the first such pair (mixing sets with weights= repeats samples on
    purpose)."""
    first: dict[str, str] = {}
    copies = []
    for url, info in zip(urls, entries):
        original = first.setdefault(info.sha256, url) if info.samples else url
        if original != url:
            copies.append((original, url))
    if copies:
        original, copy = copies[0]
        warn_caller(f"{len(copies)} shard(s) hold the same bytes as another, e.g. {redact(copy)} and "
                    f"{redact(original)}: the index names both, so each of their samples comes twice an epoch; "
                    f"index the shards without the copies to read each sample once")


def index_shards(
    shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str] | None = None,
    *,
    workers: int = 1,
    engine: str = "local",
    scheduler: str | None = None,
    executor: Executor | None = None,
    overwrite: bool = False,
    quiet: bool = False,
) -> DatasetIndex:
    """Write ``index.json`` and ``index.bin`` for existing shards (see the module docstring):
    beside them (they must then share a folder) or at ``output`` (a folder, or the path of the
    index file: ``DIR/index.json``; local or ``s3://``). The shards are read once each, in
    ``workers`` processes or on Dask, as a build runs (``engine``, ``scheduler``). Returns the
    index."""
    check_engine(engine, scheduler, executor)  # before the output is touched
    check_limits(None, None, workers)
    urls = shard_urls(shards)
    if output is None:
        folders = {_canonical(parent(url)): parent(url) for url in urls}
        if len(folders) > 1:
            shown = ", ".join(sorted(map(redact, folders.values()))[:3])
            raise ValueError(f"the shards are in {len(folders)} folders ({shown}...): give the index a place with --output")
        folder, name = folders.popitem()[1], INDEX_NAME
    else:
        text = os.fspath(output)
        folder, name = (text.rpartition("/")[0] or ".", text.rpartition("/")[2]) if text.endswith(".json") \
            else (text, INDEX_NAME)
    if scheme(folder) in ("http", "https"):
        raise ValueError(f"{redact(folder)}: an index cannot be written over HTTP; write it locally or to s3:// "
                         f"with --output (it may name shards by their URLs)")
    names = [relative_name(url, folder) for url in urls]  # (before the shards are read: a name may be refused)
    target = destination(folder)
    try:
        _refuse_stopped_builds([*urls, join(folder, name)])  # (before the lock is taken: this one's is no build's)
        hold_output(target)
        if target.exists(name) and not overwrite:
            raise OutputExistsError(f"{target.url(name)} already exists; pass overwrite=True (--overwrite) to replace it")
        parts = part_index_names(target)
        if parts and not overwrite:  # a build in parts: its shards indexed here would make a set of those written
            raise OutputExistsError(f"{target.url(parts[0])}: {target.url('')} holds the partial indexes of a build in "
                                    f"parts; join them with 'pipeline merge-index', which checks that every part is "
                                    f"there, or pass overwrite=True (--overwrite) to index the shards as they are")
        metadata = _metadata_kept(target, name, names)  # (read before the index is written over)
        progress = BuildProgress(None, f"indexing {len(urls)} shards", quiet, verb="indexed")
        results = []
        with open_workers(engine, workers, scheduler, executor) as pool:
            if pool.executor is None:
                scans = map(scan_url, urls)
            else:  # a running cluster's workers work in folders of their own: local paths go absolute
                sent = [os.path.abspath(local_path(u)) if pool.elsewhere and not is_remote(u) else u for u in urls]
                scans = pool.executor.map(scan_url, sent)
            for info, schema, rows in scans:
                progress.update(info.samples, info.bytes)
                results.append((info, schema, rows))
        schema_all: Schema | None = None
        entries = []
        for url, name_in_index, (info, schema, _) in zip(urls, names, results):
            if info.samples:
                schema_all = merge_schema(schema_all, schema, redact(url), optional=True)
            info.url = name_in_index
            entries.append(info)
        _warn_of_copies(urls, entries)
        index = DatasetIndex(schema_all or {}, entries, _pack([rows for _, _, rows in results], urls),
                             metadata=metadata)
        where = save_index(target, index, name)
        progress.close(where)
        return index
    finally:
        target.close()
