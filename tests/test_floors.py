"""The lowest versions ``pyproject.toml`` claims are ones the package runs on. CI runs one
Python and the newest libraries, so what only the oldest would show is checked here from the
claims themselves: the grammar of the lowest Python, and floors that what the code calls (or
what the other floors allow) rules out."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _floors(requirements: list[str]) -> dict[str, tuple[int, ...]]:
    """``{"urllib3": (2, 1), ...}`` from requirements such as ``"urllib3>=2.1"``."""
    found = (re.fullmatch(r"([A-Za-z0-9_.-]+)>=([\d.]+)", text.split(";")[0].strip()) for text in requirements)
    return {match[1]: tuple(map(int, match[2].split("."))) for match in found if match}


#: Every requirement: the core's and each extra's.
REQUIREMENTS = PROJECT["dependencies"] + [text for extra in PROJECT["optional-dependencies"].values() for text in extra]
FLOORS = _floors(REQUIREMENTS)


def test_the_package_parses_with_the_grammar_of_its_lowest_python() -> None:
    lowest = tuple(map(int, PROJECT["requires-python"].removeprefix(">=").split(".")))
    assert lowest == (3, 11)
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        ast.parse(path.read_text(), filename=str(path), feature_version=lowest)  # raises SyntaxError


@pytest.mark.parametrize(("name", "needed", "why"), [
    ("urllib3", (2, 2), "HTTP bodies are read with HTTPResponse.read1, which urllib3 2.0 and 2.1 lack"),
    ("boto3", (1, 34), "botocore before 1.34 holds urllib3 below 2.1 (read1 came in 2.2)"),
])
def test_a_floor_is_no_lower_than_what_the_code_needs(name: str, needed: tuple[int, ...], why: str) -> None:
    assert FLOORS[name] >= needed, f"{name}>={'.'.join(map(str, FLOORS[name]))}: {why}"


def test_every_library_the_package_imports_is_declared() -> None:
    """A library imported by the package but not declared (braceexpand, which came only as a
    dependency of webdataset's) breaks the install of a user whose other packages bring another
    webdataset, or none; an extra's library is declared in that extra."""
    from importlib.metadata import packages_distributions

    distributions = packages_distributions()
    imported: set[str] = set()
    for path in (ROOT / "pipeline").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    brought = {"botocore": "boto3's own, pinned by it ([s3])", "cloudpickle": "distributed's own ([dask])",
               "fsspec": "the user's, for the schemes only fsspec opens: an error says to install it"}
    third_party = imported - set(sys.stdlib_module_names) - {"pipeline", "__future__"} - set(brought)
    declared = {re.split(r"[<>=~!;\[ ]", text)[0].lower() for text in REQUIREMENTS}
    undeclared = {name: distributions.get(name, [name]) for name in third_party
                  if not any(d.lower() in declared for d in distributions.get(name, [name]))}
    assert undeclared == {}
