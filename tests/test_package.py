"""The package as a user's project sees it: marked as typed (PEP 561), so that mypy or pyright
read its hints rather than refuse it ("missing library stubs or py.typed marker"), and with the
names it imports only on first use (the torch-based reader) visible to them too."""

from __future__ import annotations

import ast
import inspect
import os
import shutil
import subprocess
import sys
import typing
import zipfile
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import pipeline
from pipeline.stream.shards import Location
from pipeline.stream.sources import Sources

ROOT = Path(pipeline.__file__).parent.parent


def test_the_built_wheel_holds_the_py_typed_marker(tmp_path: Path) -> None:
    assert (resources.files("pipeline") / "py.typed").is_file()
    tree = tmp_path / "tree"  # (a copy: the build writes its build/ and egg-info beside the sources)
    shutil.copytree(ROOT / "pipeline", tree / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    code = f"from setuptools import build_meta; print(build_meta.build_wheel({str(tmp_path / 'dist')!r}))"
    built = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = tmp_path / "dist" / built.stdout.split()[-1]
    assert "pipeline/py.typed" in zipfile.ZipFile(wheel).namelist()


def test_the_build_meets_no_deprecation_of_setuptools(tmp_path: Path) -> None:
    """The license as a TOML table (``{ text = "MIT" }``) is deprecated by setuptools 77 and
    refused once its date passes (2027-02-18): every install from source, editable ones
    included, then fails. Its metadata is built here with setuptools' deprecations as errors."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "pipeline", tree / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    (tmp_path / "meta").mkdir()
    code = ("import warnings; from setuptools import build_meta; "
            "from setuptools.warnings import SetuptoolsDeprecationWarning; "
            "warnings.simplefilter('error', SetuptoolsDeprecationWarning); "
            f"print(build_meta.prepare_metadata_for_build_wheel({str(tmp_path / 'meta')!r}))")
    built = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr[-2000:]
    metadata = (tmp_path / "meta" / built.stdout.split()[-1] / "METADATA").read_text()
    assert "License-Expression: MIT\n" in metadata


def test_a_type_checker_sees_every_lazily_imported_name() -> None:
    """The ``if TYPE_CHECKING:`` block of ``__init__.py`` imports what ``__getattr__`` imports on
    first use, each from the same module: a name added to one and not the other would reach a
    user's checker as an error, or as ``Any``."""
    module = ast.parse((ROOT / "pipeline" / "__init__.py").read_text())
    block = next(node for node in module.body
                 if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    seen = {alias.name: statement.module for statement in block.body if isinstance(statement, ast.ImportFrom)
            for alias in statement.names}
    assert seen == pipeline._LAZY
    assert [name for name in pipeline.__all__ if name not in vars(pipeline) and name not in seen] == []
    assert set(seen) <= set(pipeline.__all__)


SPLITTING = [pipeline.build_shards, pipeline.write_shards, pipeline.build_npz, pipeline.build_joblib,
             pipeline.build_folder, pipeline.build_parquet, pipeline.build_arrow]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="typing.get_overloads is new in Python 3.11")
@pytest.mark.parametrize("build", SPLITTING, ids=lambda build: build.__name__)
def test_a_type_checker_is_told_a_split_build_returns_a_dict_of_indexes(build: Callable[..., Any]) -> None:
    """``validation`` left out: one index; given: ``{"train": ..., "validation": ...}``, which a
    union of the two made every caller narrow (``splits.items()`` was a checker's error). Each
    overload takes what the function takes, ``validation`` apart."""
    def shape(function: Callable[..., Any]) -> list[tuple[str, Any, str, bool]]:
        return [(p.name, p.kind, p.annotation, p.default is not p.empty)
                for p in inspect.signature(function).parameters.values() if p.name != "validation"]

    told = {inspect.signature(overload).parameters["validation"].annotation:
            inspect.signature(overload).return_annotation for overload in typing.get_overloads(build)}
    assert told == {"None": "DatasetIndex", "SplitSize": "dict[str, DatasetIndex]"}
    assert all(shape(overload) == shape(build) for overload in typing.get_overloads(build))


def test_the_hints_of_what_a_loader_reads_take_paths_where_the_loader_does(tmp_path: Path) -> None:
    """``tune(Path(...))``, ``ShardDataset([Path(...)])`` and a mix of a list of shards worked, but
    their hints said ``str``: a checker refused them."""
    location = typing.get_args(Sources)
    assert typing.Sequence[str | os.PathLike[str]] in location and typing.Mapping[str, Location] in location
    assert typing.get_type_hints(pipeline.tune)["data"] == Sources
    assert typing.get_type_hints(pipeline.ShardDataset.__init__)["source"] == Sources
    pipeline.write_shards(tmp_path, {"x": np.arange(20)}, shard_samples=10, quiet=True)
    listed = sorted(tmp_path.glob("*.tar"))
    assert len(pipeline.ShardDataset(listed, batch_size=5)) == 4
    assert len(pipeline.ShardDataset({"a": listed[:1], "b": tmp_path}, batch_size=5)) == 6
