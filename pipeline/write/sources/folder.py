"""A folder of files grouped by stem: ``0001.jpg`` + ``0001.json`` -> one sample.

This is what ``tar`` users expect of webdataset: the key is the file name up to its first
dot, each extension is a field, and the bytes are kept exactly as they are (decode images
or JSON in your transform). Every sample must have the same set of extensions.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Iterable

from ...caller_warning import warn_caller
from ...format.errors import SampleError
from ...format.index import INDEX_NAME, table_name_for
from ...format.tar import split_name
from ..rows import RowBlock, check_key
from ..source import FileRowsSource, require_folder


class FolderSource(FileRowsSource):
    """The files of ``folder`` (and its subfolders when ``recursive``; a subfolder path joins
    the key with ``_`` since keys cannot hold ``/``), sorted by key."""

    row_lists = ("paths", "keys", "sizes")

    def __init__(self, folder: str | os.PathLike[str], recursive: bool = False) -> None:
        self.folder = Path(folder)
        require_folder(self.folder)
        files = sorted(self.folder.rglob("*") if recursive else self.folder.iterdir())
        groups: dict[str, dict[str, Path]] = {}
        root = self.folder.resolve()
        for path in files:
            if not path.is_file() or path.name.startswith("."):
                continue
            if not path.resolve().is_relative_to(root):  # shards would carry a file from elsewhere
                raise SampleError(f"{path}: a link to {path.resolve()}, outside {self.folder}: refused")
            _refuse_built_shards(path)
            relative = path.relative_to(self.folder).as_posix()
            key, ext = split_name(relative)
            if key is None or ext is None:
                raise SampleError(f"{path}: a file name needs a stem and an extension (key.ext): a sample is the "
                                  f"files of one stem, a field each extension; move files that are no samples (a "
                                  f"README, a LICENSE) out of the folder, or rename this one")
            try:
                key = check_key(key.replace("/", "_"))
            except SampleError as exc:  # named by the file, which the user can rename
                raise SampleError(f"{path}: {exc}; rename it") from None
            if ext in groups.setdefault(key, {}):  # sub/q.jpg beside sub_q.jpg, say
                raise SampleError(f"{groups[key][ext]} and {path} both make field {ext!r} of sample {key!r} "
                                  f"(a subfolder's path joins the key with '_'): rename one of them")
            groups[key][ext] = path
        if not groups:
            raise FileNotFoundError(f"{self.folder}: no files to build from{_subfolders_hint(self.folder, recursive)}")
        unread = [] if recursive else sorted(  # (a shard set built there is no data)
            path.name for path in self.folder.iterdir() if path.is_dir() and not path.name.startswith(".")
            and any(path.iterdir()) and not (path / INDEX_NAME).is_file())
        if unread:
            warn_caller(f"{self.folder}: the files of its subfolders ({', '.join(unread[:3])}"
                        f"{', ...' if len(unread) > 3 else ''}) are not read: pass --recursive (recursive=True) to "
                        f"take them too, keyed by their paths")
        self.keys = sorted(groups)
        # the extensions most samples have: a stray file (a README) is then the one named
        sets = Counter(tuple(sorted(groups[key])) for key in self.keys)
        fields = list(max(sets, key=lambda exts: (sets[exts], exts == tuple(sorted(groups[self.keys[0]])))))
        for key in self.keys:
            if sorted(groups[key]) != fields:
                holders = [k for k in self.keys if sorted(groups[k]) == fields]
                others = (f"samples {holders[0]!r}, ... ({len(holders)})" if len(holders) > 1
                          else f"sample {holders[0]!r}")
                raise SampleError(
                    f"{self.folder}: sample {key!r} has files {sorted(groups[key])}, {others} "
                    f"{'have' if len(holders) > 1 else 'has'} {fields}; every sample needs the same "
                    f"extensions{_dots_hint(groups[key], fields)}: move files that are no samples (a README, say) "
                    f"out of the folder, or give every sample the same files"
                )
        self.fields = fields
        self.paths = [[groups[key][ext] for ext in fields] for key in self.keys]
        self.sizes = [sum(p.stat().st_size for p in paths) for paths in self.paths]
        self.description = f"folder {self.folder}"

    def __len__(self) -> int:
        return len(self.keys)

    def read(self, start: int, stop: int) -> RowBlock:
        rows = self.paths[start:stop]
        columns = {ext: [paths[j].read_bytes() for paths in rows] for j, ext in enumerate(self.fields)}
        return RowBlock(columns, self.keys[start:stop])


def _refuse_built_shards(path: Path) -> None:
    """Refuse the index of a shard set found among the files: an earlier build written into
    the folder it read (or into a subfolder, read with ``recursive``) would otherwise have its
    shards and index read as samples, refused only as samples of other extensions."""
    if path.name == INDEX_NAME and path.with_name(table_name_for(INDEX_NAME)).is_file():
        raise SampleError(f"{path}: the index of a shard set (an earlier build written into the folder it "
                          f"reads?): its shards would be read as samples; write the shards outside the folder, "
                          f"and move this set out of it")


def _subfolders_hint(folder: Path, recursive: bool) -> str:
    """What to do when ``folder`` holds no files of its own but its subfolders do."""
    if recursive or not any(path.is_dir() and not path.name.startswith(".") for path in folder.iterdir()):
        return ""
    return "; its files are in subfolders: pass --recursive (recursive=True) to take them, keyed by their paths"


def _dots_hint(*extensions: Iterable[str]) -> str:
    """Why extensions differ when a file's stem holds dots: the key ends at the first dot, so
    ``2021.03.01.jpg`` is field ``03.01.jpg`` of sample ``2021``."""
    if not any("." in ext for exts in extensions for ext in exts):
        return ""
    return (" (a key is the name up to its first dot, as in webdataset's tars: 'a.seg.png' is field 'seg.png' of "
            "sample 'a'; rename files whose stems hold dots, '2021.03.01.jpg' to '2021-03-01.jpg')")
