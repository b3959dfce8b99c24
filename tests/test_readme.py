"""Every ``python`` and ``bash`` block of README.md runs as written, in README order, in one
folder that holds small inputs under the names the blocks use (so that a block may use what an
earlier one built). A block that needs what a test cannot start here (a cluster, a GPU, the
set-up command itself) is marked in README.md, on the line before it, with
``<!-- readme-test: skip: <reason> -->``.

``pip install`` lines are checked, not run (the test environment has every extra already): the
extras they name must exist.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import joblib
import numpy as np
import pytest
import torch
import webdataset as wds

ROOT = Path(__file__).resolve().parent.parent
SKIP = re.compile(r"<!-- readme-test: skip: (?P<reason>.+?) -->")


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    line: int  # where the block starts in README.md
    skip: str | None  # the reason, for a block marked to be skipped


def readme_blocks() -> list[Block]:
    blocks: list[Block] = []
    lines = (ROOT / "README.md").read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.fullmatch(r"```(\w+)", lines[i])
        if fence is None:
            i += 1
            continue
        start = i
        end = lines.index("```", start + 1)
        marker = SKIP.fullmatch(lines[start - 1]) if start else None
        if fence.group(1) in ("python", "bash"):
            blocks.append(Block(fence.group(1), "\n".join(lines[start + 1:end]) + "\n", start + 1,
                                marker["reason"] if marker else None))
        i = end + 1
    return blocks


def make_inputs(folder: Path) -> None:
    """The files the README's blocks start from, small."""
    import pyarrow as pa  # from the parquet extra
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1, (10, 16))
    y = rng.integers(0, 10, 3000)
    x = (centres[y] + rng.normal(0, 1, (3000, 16))).astype(np.float32)
    np.save(folder / "features.npy", x)
    np.save(folder / "labels.npy", y)
    np.savez(folder / "data.npz", x=x[:500], y=y[:500])
    (folder / "out").mkdir()  # the joblib batch recipe's files: lists of batches of 4, float64
    joblib.numpy_pickle.dump([x[i:i + 4].astype(np.float64) for i in range(0, 2000, 4)], folder / "out" / "x_4.job")
    joblib.numpy_pickle.dump([y[i:i + 4].astype(np.float64) for i in range(0, 2000, 4)], folder / "out" / "y_4.job")
    (folder / "data").mkdir()  # one torch.save'd tensor per sample, for the IDs the README's dicts name
    for n in range(600):
        torch.save(torch.from_numpy(np.tile(x[n], (3, 1))), folder / "data" / f"id-{n}.pt")
    from PIL import Image  # from the images extra

    for n in range(20):  # an image folder: photos/<class>/<image>.jpg
        (folder / "photos" / ("cat", "dog")[n % 2]).mkdir(parents=True, exist_ok=True)
        picture = np.clip(rng.normal(128, 40, (48 + n, 64, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(picture).save(folder / "photos" / ("cat", "dog")[n % 2] / f"{n:04d}.jpg", quality=90)
    (folder / "images").mkdir()
    for n in range(20):
        (folder / "images" / f"{n:04d}.jpg").write_bytes(rng.bytes(100 + n))
        (folder / "images" / f"{n:04d}.json").write_text(json.dumps({"n": n}))
    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1]), "y": y})
    pq.write_table(table, folder / "table.parquet", row_group_size=1000)  # x: fixed_size_list<float32>[16]
    with pa.ipc.new_file(folder / "table.arrow", table.schema) as writer:
        writer.write_table(table, max_chunksize=1000)
    (folder / "wds").mkdir()  # shards written by webdataset: .npy, .cls and (most samples) .txt members
    for s, count in enumerate((300, 120, 260, 80)):
        with wds.TarWriter(str(folder / "wds" / f"w-{s:06d}.tar")) as sink:
            for n in range(count):
                sample = {"__key__": f"{s}-{n:05d}", "npy": x[n], "cls": int(y[n])}
                sink.write({**sample, "txt": f"caption {n}"} if n % 5 else sample)
    (folder / "scripts").symlink_to(ROOT / "scripts")


def check_pip_installs(code: str) -> str:
    """The block without its ``pip install`` lines, once the extras they name are known."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    kept = []
    for line in code.splitlines():
        if line.startswith("pip install"):
            for extra in re.findall(r"\.\[([\w,]+)\]", line):
                for name in extra.split(","):
                    assert name in extras, f"README installs extra {name!r}, which pyproject.toml lacks"
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def run_block(block: Block, folder: Path, number: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONWARNINGS": "ignore"}
    if block.language == "python":
        script = folder / f"readme_block_{number}.py"
        script.write_text(block.code)
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-euo", "pipefail", "-c", check_pip_installs(block.code)]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def test_every_python_and_bash_block_of_the_readme_runs(tmp_path: Path) -> None:
    blocks = readme_blocks()
    make_inputs(tmp_path)
    ran = 0
    for number, block in enumerate(blocks):
        if block.skip is not None:
            continue
        result = run_block(block, tmp_path, number)
        report = (f"README.md line {block.line} ({block.language}):\n{block.code}\n"
                  f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")
        assert result.returncode == 0, "failed: " + report
        # an error printed and ignored (at exit, in a __del__) leaves the exit status alone
        assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, report
        ran += 1
    skipped = [b for b in blocks if b.skip is not None]
    print(f"README blocks: {ran} run, {len(skipped)} skipped: " + "; ".join(f"line {b.line}: {b.skip}" for b in skipped))
    # the README is mostly runnable, and this test ran it (skipped: the two set-up commands, and what needs
    # machines, servers or frameworks CI has not: a Dask cluster, S3, 4 nodes, Lightning, transformers)
    assert ran >= 12 and len(skipped) <= 7


def test_skip_markers_sit_on_a_block_and_say_why() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    for i, line in enumerate(lines):
        if "readme-test" in line:
            assert SKIP.fullmatch(line), f"README.md line {i + 1}: a marker reads <!-- readme-test: skip: reason -->"
            assert re.fullmatch(r"```(python|bash)", lines[i + 1]), f"README.md line {i + 1}: no block follows"


@pytest.mark.parametrize("block", [b for b in readme_blocks() if b.language == "python"],
                         ids=lambda b: f"line{b.line}")
def test_python_blocks_compile(block: Block) -> None:
    compile(block.code, f"README.md:{block.line}", "exec")


def test_every_public_name_is_in_the_readme() -> None:
    """``pipeline/__init__.py`` says its names are documented in README.md: each is there, in code."""
    import pipeline

    text = (ROOT / "README.md").read_text()
    missing = [name for name in pipeline.__all__ if not re.search(rf"`{re.escape(name)}[(`.\[]", text)]
    assert missing == []
