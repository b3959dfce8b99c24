"""Warnings point at the user's line, or at the package's own where no user's line called it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pipeline.write.sources.class_list as class_list

IN_A_STARTED_PROCESS = """
import multiprocessing, sys
from pipeline.write.sources.class_list import warn_of_renumbered_numbers

if __name__ == "__main__":
    started = multiprocessing.get_context(sys.argv[1]).Process(target=warn_of_renumbered_numbers,
                                                                args=(["10", "2"], "labels", "keep them"))
    started.start()
    started.join()
"""


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_warning_in_a_spawned_process_points_at_the_package_not_at_multiprocessings_command(
        tmp_path: Path, context: str) -> None:
    """Beneath multiprocessing's frames, a spawned process's stack holds only the command that
    started it (python -c "from multiprocessing.spawn import spawn_main; ..."): the warning pointed
    at <string>:1."""
    (tmp_path / "start.py").write_text(IN_A_STARTED_PROCESS)
    result = subprocess.run([sys.executable, str(tmp_path / "start.py"), context], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(f"{class_list.__file__}:"), result.stderr
    assert "UserWarning: labels: the class names read as whole numbers ('10', '2')" in result.stderr
