"""Which library a run measures: a snapshot of ``pipeline/`` (as it is, or at a git revision)
imported by the run and its child processes, so that editing the checkout during a long run
cannot mix versions."""

from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from .common import ROOT


def library_revision() -> str:
    """The git commit of the working tree, with ``+changes`` when ``pipeline/`` has
    uncommitted edits."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+changes" if git("status", "--porcelain", "--", "pipeline") else "")


def snapshot_library(work: Path, rev: str | None) -> str:
    """Copy the library into the run's folder and import it from there, here and in every
    child process (through ``PYTHONPATH``, ahead of the editable install): each case starts
    a fresh interpreter, so a run of half an hour would otherwise mix the versions of a
    package edited meanwhile. Returns the revision benchmarked."""
    dest = work / "library"
    if rev:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "pipeline"], capture_output=True,
                                 check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
        revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True,
                                  text=True, check=True).stdout.strip()
    else:
        revision = library_revision()
        shutil.copytree(ROOT / "pipeline", dest / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(dest))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(dest), os.environ.get("PYTHONPATH")]))
    return revision


def environment(revision: str) -> dict[str, Any]:
    import msgpack
    import torch
    import webdataset

    import pipeline

    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "numpy": np.__version__, "torch": torch.__version__, "msgpack": ".".join(map(str, msgpack.version)),
            "webdataset": getattr(webdataset, "__version__", "?"), "pipeline": pipeline.__version__,
            "pipeline_revision": revision, "pipeline_imported_from": str(Path(pipeline.__file__).parent)}
