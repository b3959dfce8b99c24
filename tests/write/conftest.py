"""Inputs shared by the build tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


@pytest.fixture
def npy_inputs(tmp_path: Path) -> dict[str, str]:
    """``x`` (5000 x 16 float32) and ``y`` (5000 labels) as .npy files."""
    rng = np.random.default_rng(3)
    paths = {"x": str(tmp_path / "x.npy"), "y": str(tmp_path / "y.npy")}
    np.save(paths["x"], rng.random((5000, 16), dtype=np.float32))
    np.save(paths["y"], rng.integers(0, 10, 5000))
    return paths
