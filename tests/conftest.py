"""Fixtures shared by the tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def tabular() -> dict[str, np.ndarray]:
    """3000 rows of 10 float32 features and an int64 label."""
    rng = np.random.default_rng(1)
    return {"x": rng.random((3000, 10), dtype=np.float32), "y": rng.integers(0, 10, 3000)}
