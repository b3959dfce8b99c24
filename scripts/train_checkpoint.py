"""The example's checkpoints: saving one whole or not at all, and continuing one with a message,
not a traceback, when it cannot be continued (a damaged file, another file under the name, a
model trained on other data or for another task, a loader whose plan differs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline import ShardLoader

#: What a checkpoint of this script holds.
PARTS = ("model", "optimizer", "loader")


class CannotResume(Exception):
    """A checkpoint that this run cannot continue; the message says why and what to do."""


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, loader_state: dict,
                    epoch_so_far: tuple[float, float] = (0.0, 0.0)) -> None:
    """Write the checkpoint beside ``path`` and rename it over ``path``: a run killed while it
    saves leaves the previous checkpoint whole. ``epoch_so_far``: the loss summed over the samples
    the epoch trained on before it, and their number, for the resumed epoch's train loss."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader_state,
                "epoch_so_far": list(epoch_so_far)}, tmp)
    os.replace(tmp, path)


def resume(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, loader: ShardLoader,
           device: torch.device) -> tuple[float, float]:
    """Load the model, optimizer and loader of the checkpoint at ``path`` (the optimizer keeping
    this run's learning rate: a new ``--lr`` applies), and return what its epoch trained on so
    far (see :func:`save_checkpoint`); raise :class:`CannotResume` naming the file and what
    differs."""
    state = _read(path, device)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise CannotResume(f"cannot resume from {path}: its model does not fit this data and task "
                           f"({_shapes(state['model'], model)}): it was trained on other data, or with another "
                           f"--task or --classes; give the same ones, or another --checkpoint to start afresh") from exc
    try:
        rates = [group["lr"] for group in optimizer.param_groups]  # (this run's --lr: the checkpoint's would win)
        optimizer.load_state_dict(state["optimizer"])
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate
        loader.load_state_dict(state["loader"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CannotResume(f"cannot resume from {path}: {str(exc).removeprefix('cannot resume: ')}") from exc
    loss_sum, samples = state.get("epoch_so_far", (0.0, 0.0))
    return float(loss_sum), float(samples)


def _read(path: Path, device: torch.device) -> dict[str, Any]:
    """The checkpoint at ``path``, once it is known to be one of this script's."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except OSError as exc:
        raise CannotResume(f"cannot resume: cannot read {path}: {exc.strerror or exc}") from exc
    except Exception as exc:  # torch.load's words for a damaged file vary: zip, pickle, KeyError, EOFError
        first_sentence = (str(exc).splitlines() or [""])[0].split(". ")[0]
        raise CannotResume(f"cannot resume: {path} is not a checkpoint that torch can read (damaged, cut short, or "
                           f"another kind of file: {type(exc).__name__}: {first_sentence}); give the right file, or leave "
                           f"out --resume to start afresh") from exc
    missing = [part for part in PARTS if not isinstance(state, dict) or part not in state]
    if missing:
        raise CannotResume(f"cannot resume: {path} is not a checkpoint of this script (it has no "
                           f"{', '.join(map(repr, missing))}); give the file its --checkpoint saved")
    return state


def _shapes(saved: dict[str, Any], model: nn.Module) -> str:
    """Where the saved weights and the model's differ, e.g. ``weight 10x32 saved, 1x32 here``."""
    mine = model.state_dict()
    differing = [f"{name} {_shape(value)} saved, {_shape(mine[name]) if name in mine else 'none'} here"
                 for name, value in saved.items()
                 if not isinstance(value, torch.Tensor) or name not in mine or value.shape != mine[name].shape]
    return "; ".join(differing) or "other parameter names"


def _shape(value: Any) -> str:
    return "x".join(map(str, value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__
