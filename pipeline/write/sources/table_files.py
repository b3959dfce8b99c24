"""Which files a table build reads: files as given, folders expanded, in a stable order.

A folder of Parquet files (as Spark, Dask or pandas write them) is read in name order; a folder
written by ``datasets.Dataset.save_to_disk`` in the order its ``state.json`` lists its files,
which is the order of the dataset's rows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Sequence, Union

from ...caller_warning import warn_caller
from ...format.errors import SampleError

Inputs = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]

_ARROW_SUFFIXES = (".arrow", ".arrows", ".feather", ".ipc")


def input_files(inputs: Inputs, folder_files: Callable[[Path], list[Path]], what: str) -> list[Path]:
    """The files named by ``inputs`` (files, and folders expanded by ``folder_files``), in order;
    a file named twice is refused (its rows would be built twice)."""
    if not isinstance(inputs, (str, os.PathLike, list, tuple)):  # a datasets.Dataset would be iterated row by row
        raise TypeError(f"inputs are the paths of {what} files or folders, got a {type(inputs).__name__}: save a "
                        f"datasets.Dataset with its save_to_disk(FOLDER), or a pyarrow Table with "
                        f"pyarrow.parquet.write_table(table, FILE), and give that")
    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = folder_files(path)
            if not found:
                raise FileNotFoundError(f"{path}: no {what} files in this folder{_nested_hint(path, folder_files)}")
            below = _files_in_subfolders(path, folder_files)
            if below:
                warn_caller(f"{path}: {len(found)} {what} file(s) are read in it, not the {len(below)} in its "
                            f"subfolders ({below[0]}, ...): give those too, or a list of the files to read")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    if not files:
        raise FileNotFoundError(f"no {what} files given")
    seen: set[Path] = set()
    for path in files:
        if path.resolve() in seen:
            raise SampleError(f"{path} is given twice: its rows would be built twice")
        seen.add(path.resolve())
    return files


def _nested_hint(folder: Path, folder_files: Callable[[Path], list[Path]]) -> str:
    """Where such files are when only ``folder``'s subfolders hold them: a dataset partitioned
    into folders (``year=2020/part-0.parquet``), as Spark and ``write_to_dataset`` write it."""
    nested = _files_in_subfolders(folder, folder_files, deep=True)
    if not nested:
        return ""
    return (f"; its subfolders hold {len(nested)} ({nested[0]}, ...), a partitioned dataset?: give the files "
            f"themselves; a value in a folder's name (year=2020) is in no file, so it is not built")


def _data_file(path: Path) -> bool:
    """Not a hidden file, nor one of a writer's own (``_SUCCESS``, ``_metadata``, a ``.part``
    being written): what Spark and ``pyarrow.dataset`` skip in a dataset's folder."""
    return not path.name.startswith((".", "_")) and path.is_file()


def _files_in_subfolders(folder: Path, folder_files: Callable[[Path], list[Path]], deep: bool = False) -> list[Path]:
    """The files of ``folder``'s subfolders that would be read were they given: of every folder
    below it when ``deep`` (where an error points), else of its own data subfolders (one level:
    a warning's, not a search of the tree). A subfolder that could not be read (a saved
    dataset's split, say) holds no such files."""
    subfolders = (p for p in folder.rglob("*") if p.is_dir()) if deep else \
        (p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    found: list[Path] = []
    for sub in sorted(subfolders):
        try:
            found += folder_files(sub)
        except (SampleError, OSError):
            continue
    return found


def parquet_files(inputs: Inputs) -> list[Path]:
    """Parquet files, folders holding ``*.parquet`` files."""
    return input_files(inputs, lambda folder: sorted(filter(_data_file, folder.glob("*.parquet"))),
                       "Parquet (.parquet)")


def arrow_files(inputs: Inputs) -> list[Path]:
    """Arrow IPC files or streams, ``save_to_disk`` folders, folders of IPC files."""
    return input_files(inputs, _arrow_folder, "Arrow IPC (.arrow, .feather)")


def _arrow_folder(folder: Path) -> list[Path]:
    if (folder / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in folder.iterdir() if (p / "state.json").is_file())
        raise SampleError(f"{folder} holds a DatasetDict (splits {', '.join(splits)}): give one split's folder, "
                          f"e.g. {folder / (splits[0] if splits else 'train')}")
    state = folder / "state.json"
    if not state.is_file():
        return sorted(p for p in folder.iterdir() if p.suffix in _ARROW_SUFFIXES and _data_file(p))
    try:
        listed = [entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise SampleError(f"{state}: not the state.json of a saved dataset ({exc!r})") from None
    if not listed:
        raise SampleError(f"{folder}: the saved dataset holds no rows (its state.json lists no data files): "
                          f"nothing to build")
    for name in listed:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name}: listed in {state}, but not there")
    return [folder / name for name in listed]
