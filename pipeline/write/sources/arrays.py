"""Array sources: in-memory arrays, ``.npy`` and ``.npz`` files, ``np.memmap``, torch tensors.

File-backed columns are read with ``pread`` into fresh buffers, a chunk at a time, instead of
through a memory map: pages of a memory map stay resident in the process until unmapped, so
a 4 GB memmap read end to end makes a 4 GB RSS, while reads keep the build within a few chunks.

A torch ``bfloat16`` tensor, which NumPy cannot hold, is kept as the NumPy array of its bits
(int16), so that it slices and travels to workers as any array does, and read back as
``bfloat16`` tensors, one a sample: the codec stores those as they are (extension type 2).
They are not packed (packing stacks samples with NumPy), so ``pack="auto"`` gives one a record.
"""

from __future__ import annotations

import mmap
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import numpy as np

from ...format import npy
from ...format.codec import check_dtype, check_field_names
from ...format.errors import SampleError
from ...format.numbers import inexact_int
from ...format.tensors import resolved
from ..rows import RowBlock, check_key
from ..source import Source
from .pandas_values import is_pandas, pandas_values
from .unchanged import Version, check_unchanged, version_of


@dataclass(frozen=True)
class FileColumn:
    """A C-ordered array stored raw in a file at ``offset`` (a ``.npy`` body, a memmap). The
    path is a ``Path``, so that a task sent to a running cluster carries it absolute (see
    :mod:`..portable`). Each read opens the file anew (in whichever process runs the task), so
    ``version``, the file's when it was opened, tells one changed meanwhile (see :mod:`.unchanged`)."""

    path: Path
    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]
    version: Version | None = None

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def rows(self, start: int, stop: int) -> "FileColumn":
        """The column of rows ``[start, stop)``, still in the file."""
        return FileColumn(self.path, self.offset + start * self.row_bytes, self.dtype,
                          (stop - start,) + self.shape[1:], self.version)

    def read(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((stop - start,) + self.shape[1:], dtype=self.dtype)
        view = memoryview(out).cast("B") if out.nbytes else memoryview(b"")
        position = self.offset + start * self.row_bytes
        with open(self.path, "rb", buffering=0) as src:
            check_unchanged(self.path, self.version, version_of(os.fstat(src.fileno())))
            done = 0
            while done < len(view):
                n = os.preadv(src.fileno(), [view[done:]], position + done)
                if n == 0:
                    raise SampleError(f"{self.path}: file ends at byte {position + done}, "
                                      f"the array needs bytes up to {position + len(view)}")
                done += n
        return out


Column = Union[np.ndarray, FileColumn]


def _npy_column(path: Path, src: Any, base: int) -> FileColumn:
    """Parse a ``.npy`` header from ``src`` (positioned at its start, ``base`` in the file)."""
    origin = src.tell()
    try:
        dtype, shape, fortran, start = npy.read_header(src.read)
    except SampleError as exc:
        raise SampleError(f"{path}: {exc}") from None
    if fortran and len(shape) > 1:
        raise SampleError(f"{path}: Fortran-ordered arrays cannot be streamed; save it with "
                          f"np.save(path, np.ascontiguousarray(a))")
    if not shape:
        raise SampleError(f"{path}: a 0-d array has no rows")
    return FileColumn(path, base + origin + start, np.dtype(dtype), shape, version_of(os.fstat(src.fileno())))


def open_npy(path: str | os.PathLike[str]) -> FileColumn:
    """A column over a ``.npy`` file, without loading it."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: a folder, not a .npy file: name the .npy file that holds the field")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such .npy file")
    with open(path, "rb") as src:
        return _npy_column(path, src, 0)


def open_npz(path: str | os.PathLike[str]) -> dict[str, Column]:
    """Columns of every array in an ``.npz``. Arrays stored uncompressed (``np.savez``) are
    read in place; compressed ones (``np.savez_compressed``) must be loaded whole into RAM."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such .npz file")
    columns: dict[str, Column] = {}
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:  # a .npy given for an .npz, or a truncated file
        raise ValueError(f"{path}: not a whole .npz archive ({exc}; a truncated one has lost its table of "
                         f"contents): pass a file written by np.savez, or a .npy as an array (--array NAME=PATH)"
                         ) from None
    with archive, open(path, "rb") as raw:
        for info in archive.infolist():
            name = info.filename.removesuffix(".npy")
            if info.compress_type != zipfile.ZIP_STORED:
                with archive.open(info) as member:
                    columns[name] = np.lib.format.read_array(member, allow_pickle=False)
                continue
            raw.seek(info.header_offset + 26)
            name_len, extra_len = np.frombuffer(raw.read(4), dtype="<u2")
            data_start = info.header_offset + 30 + int(name_len) + int(extra_len)
            raw.seek(data_start)
            member = _npy_column(path / info.filename, raw, 0)
            columns[name] = FileColumn(path, member.offset, member.dtype, member.shape, member.version)
    return columns


def as_column(value: Any, name: str) -> Column:
    """A column from an array, a memmap, a torch tensor (a ``bfloat16`` one as its bits: see the
    module docstring), or a path to a ``.npy`` file."""
    if isinstance(value, FileColumn):
        return value
    if isinstance(value, (str, os.PathLike)):
        return open_npy(value)
    if isinstance(value, np.memmap) and isinstance(value.base, mmap.mmap) and value.filename \
            and value.flags.c_contiguous and value.ndim > 0 and value.mode != "c":
        # an unsliced memmap whose edits reach its file (not copy-on-write): read the file
        # instead of faulting its pages into our RSS
        return FileColumn(Path(value.filename), value.offset, value.dtype, value.shape)
    if type(value).__module__ == "torch":
        tensor = resolved(value)
        value = _bfloat16_bits(tensor) if _is_bfloat16(tensor) else tensor.numpy()
    if is_pandas(value):
        value = pandas_values(value, f"field {name!r}")
    try:
        array = np.asarray(value)
    except ValueError:  # a list of arrays (or lists) of several shapes: NumPy makes no array of them
        raise SampleError(f"field {name!r}: its rows differ in shape; write_shards takes one array a field, each "
                          f"row a sample of one shape; write samples of several shapes (sequences of different "
                          f"lengths) with pipeline.ShardWriter, one write() a sample") from None
    if array.ndim == 0:
        raise SampleError(f"field {name!r}: a 0-d array has no rows")
    if isinstance(value, (list, tuple)) and array.dtype.kind in "US":
        # kept as objects: NumPy would turn every value into a string as wide as the longest
        # ('a', 1 -> 'a', '1'), where the column's check names the value that is not a string
        return np.asarray(value, dtype=object)
    if isinstance(value, (list, tuple)):
        lost = inexact_int(np.asarray(value, dtype=object).ravel(), array)
        if lost is not None:
            raise SampleError(f"field {name!r}: NumPy makes this list float64, which does not hold {lost} exactly; "
                              f"pass an array of the dtype it needs (np.array(values, dtype=np.uint64) for IDs "
                              f"under 2**64), or str")
    return array


class ArraySource(Source):
    """Rows of several equally long arrays, one per field."""

    fixed_shape = True

    def __init__(self, columns: Mapping[str, Any], keys: list[str] | None = None,
                 description: str = "arrays") -> None:
        self.bfloat16 = frozenset(name for name, v in columns.items() if _is_bfloat16(v))
        self.fixed_shape = not self.bfloat16
        self.columns: dict[str, Column] = {name: as_column(v, name) for name, v in columns.items()}
        if not self.columns:
            raise SampleError("no arrays given")
        self.text = frozenset(name for name, col in self.columns.items() if _is_text(name, col))
        for name, col in self.columns.items():
            try:
                check_field_names({name: None}, name)
                if name not in self.text:
                    check_dtype(col.dtype)
            except SampleError:
                raise SampleError(f"field {name!r} ({_where(col)}): names starting with '__' are reserved, and a "
                                  f"name cannot be empty: give the array another name") from None
            except TypeError as exc:
                raise SampleError(f"field {name!r} ({_where(col)}): {exc}{_times_hint(col.dtype)}") from None
        lengths = {name: len(col) for name, col in self.columns.items()}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{n} has {k} rows ({_where(self.columns[n])})" for n, k in lengths.items())
            raise SampleError(f"arrays of different lengths: {detail}")
        if keys is not None:
            if len(keys) != len(self):
                raise SampleError(f"{len(keys)} keys for {len(self)} rows")
            _check_keys(keys)
        self.keys = keys
        self.description = description

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def read(self, start: int, stop: int) -> RowBlock:
        columns = {}
        for name, col in self.columns.items():
            rows = col.read(start, stop) if isinstance(col, FileColumn) else col[start:stop]
            if name in self.text:
                rows = rows.tolist()
            columns[name] = _bfloat16_rows(rows) if name in self.bfloat16 else rows
        return RowBlock(columns, None if self.keys is None else self.keys[start:stop])

    def window(self, start: int, stop: int) -> Source:
        """Rows ``[start, stop)``: arrays sliced, file columns narrowed, so that a task sent
        to a worker carries only its own rows (or just a path)."""
        window = ArraySource.__new__(ArraySource)
        window.columns = {n: c.rows(start, stop) if isinstance(c, FileColumn) else c[start:stop]
                          for n, c in self.columns.items()}
        window.keys = None if self.keys is None else self.keys[start:stop]
        window.bfloat16, window.text, window.fixed_shape = self.bfloat16, self.text, self.fixed_shape
        window.description = self.description
        return window

    def approx_row_bytes(self) -> int:
        return sum(_row_bytes(col) for col in self.columns.values())


def _check_keys(keys: Sequence[Any]) -> None:
    """Every given key a valid key and given once; an error names the key and its rows in
    ``keys``, since a list of a million keys gives no other way to find it."""
    rows: dict[str, int] = {}
    for row, key in enumerate(keys):
        try:
            check_key(key)
        except SampleError as exc:
            raise SampleError(f"keys[{row}]: {exc}") from None
        if key in rows:
            raise SampleError(f"sample key {key!r} is given twice, keys[{rows[key]}] and keys[{row}]: "
                              f"every sample needs a key of its own")
        rows[key] = row


def _is_bfloat16(value: Any) -> bool:
    return type(value).__module__ == "torch" and str(value.dtype) == "torch.bfloat16"


def _bfloat16_bits(tensor: Any) -> np.ndarray:
    """The bits of a CPU ``bfloat16`` tensor as an int16 array (no copy when contiguous)."""
    import torch

    return tensor.contiguous().view(torch.int16).numpy()


def _bfloat16_rows(bits: np.ndarray) -> list[Any]:
    """Rows of bfloat16 bits as ``bfloat16`` tensors, one a sample, as the codec stores them."""
    import torch

    return list(torch.from_numpy(bits).view(torch.bfloat16))


def _is_text(name: str, col: Column) -> bool:
    """Whether ``col`` is a column of one string (``str``) or one ``bytes`` a row: a NumPy string
    array (``<U``, ``S``), or an object array of ``str`` only or ``bytes`` only (a pandas column's
    ``.values``). Its rows are written as those values (a packed record holds them as a list)."""
    kind = col.dtype.kind
    if kind not in "USO":
        return False
    if len(col.shape) != 1:
        raise SampleError(f"field {name!r} ({_where(col)}): a {len(col.shape)}-d array of strings or objects; give one "
                          f"string a row (a 1-d array), or join each row's strings into one")
    if kind == "O":
        expected = type(col[0]) if len(col) and type(col[0]) in (str, bytes) else str
        wrong = next((row for row, value in enumerate(col) if type(value) is not expected), None)
        if wrong is not None:
            raise SampleError(f"field {name!r} ({_where(col)}): row {wrong} is {type(col[wrong]).__name__} "
                              f"{_shown(col[wrong])}, where a column of objects may hold only str, or only bytes; "
                              f"{_object_fix(col[wrong], expected)}")
    return True


def _times_hint(dtype: np.dtype) -> str:
    """How to store NumPy times (``datetime64``, ``timedelta64``), which shards do not hold as such."""
    if dtype.kind not in "mM":
        return ""
    unit = np.datetime_data(dtype)[0]
    counted = f"{unit} since 1970" if dtype.kind == "M" else f"a count of {unit}"
    return f"; store times as numbers: values.astype('int64') ({counted})"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _object_fix(value: Any, expected: type) -> str:
    """What to give instead of a column of objects that holds ``value`` (beside ``expected`` ones)."""
    if isinstance(value, (np.ndarray, list, tuple)) or type(value).__module__ == "torch":
        return ("give arrays of one shape as one array (np.stack(values)), and arrays of several shapes with "
                "pipeline.ShardWriter, a sample at a time")
    if isinstance(value, (str, bytes)):
        return f"make them all {expected.__name__} (encode the str, or decode the bytes)"
    if hasattr(value, "timestamp") or isinstance(value, np.datetime64):
        return "store times as numbers (a pandas column: values.astype('int64'), in its unit since 1970)"
    return "give numbers as an array of numbers (np.asarray(values, dtype=np.float32))"


#: Rows of a column of objects whose sizes estimate a row's (as a build sizes its reads by it).
_SIZED_ROWS = 1000


def _row_bytes(col: Column) -> int:
    if isinstance(col, FileColumn):
        return col.row_bytes
    if col.dtype.kind == "O" and len(col):  # strings or bytes (see _is_text): what they hold, not their pointers,
        # or a build of long texts reads chunks of 16 MB of pointers, gigabytes of text
        step = max(len(col) // _SIZED_ROWS, 1)
        return max(int(np.mean([len(value.encode("utf-8", "surrogatepass") if type(value) is str else value)
                                for value in col[::step]])), 1)
    return int(np.prod(col.shape[1:], dtype=np.int64)) * col.dtype.itemsize


def _where(col: Column) -> str:
    return col.path if isinstance(col, FileColumn) else "in memory"
