"""Checkpoints that continue a run exactly where it stopped.

A checkpoint holds the model, optimizer and scheduler states, the EMA of the weights
("ema": the averaged parameters by name; `predict` loads them), the step, the data position
(epoch and samples of it taken over all ranks), the RNG states of every rank, and the run's
settings. It is written to a temporary file, fsynced and renamed, so a crash never leaves a
half-written checkpoint.

Beside each checkpoint the run writes `weights.pt` (WEIGHTS_FILE), what inference needs and
nothing more: the model's state with the EMA in place of every averaged parameter, the model
settings and the step; no optimizer state (a quarter of a checkpoint's size with AdamW's two
moments and the live weights), no RNG states, so it loads with torch.load(weights_only=True).
It is rewritten with every checkpoint: the run's newest weights.
"""

from __future__ import annotations

import pathlib
import pickle
import random

import numpy as np
import torch

from featurecache.store.files import write_atomic
from featurecache.training.config import TrainSetupError

CHECKPOINT_PREFIX = "checkpoint-"
WEIGHTS_FILE = "weights.pt"
# "format" of a weights file (a training checkpoint has none)
WEIGHTS_FORMAT = "featurecache-weights-1"
# What a resumed run reads from a checkpoint (its data position "sample_in_epoch" is derived when absent).
_RESUMED_PARTS = ("model", "optimizer", "scheduler", "step", "epoch", "rng", "world_size")


def rng_state() -> dict:
    """This process's Python, NumPy, torch and CUDA RNG states."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_path(run_dir: pathlib.Path, step: int) -> pathlib.Path:
    return run_dir / f"{CHECKPOINT_PREFIX}{step:08d}.pt"


def latest_checkpoint(path: pathlib.Path) -> pathlib.Path:
    """`path` itself if it is a file, else the newest checkpoint in that run directory."""
    if path.is_file():
        return path
    found = sorted(path.glob(f"{CHECKPOINT_PREFIX}*.pt")) if path.is_dir() else []
    if not found:
        raise TrainSetupError(f"--resume {path}: no checkpoint file and no {CHECKPOINT_PREFIX}*.pt in it")
    return found[-1]


def save_checkpoint(path: pathlib.Path, state: dict) -> None:
    """Write `state` durably and atomically (store.files.write_atomic: a temporary file beside
    `path`, fsynced, renamed, the folder fsynced): readers see the old file or the new one, and a
    full disk or Ctrl-C leaves no partial file in the run folder."""
    write_atomic(path, lambda handle: torch.save(state, handle), binary=True)


def load_checkpoint(path: pathlib.Path) -> dict:
    """The state saved in `path` (a file, or a run directory's newest).

    A checkpoint resumes on any number of ranks: its data position counts the samples of the
    epoch taken by all ranks together (featurecache.sampler). Checkpoints are read with
    weights_only=False: they hold the RNG states (Python tuples and NumPy arrays), so only
    resume from checkpoints you wrote.
    """
    source = latest_checkpoint(path)
    try:
        state = torch.load(source, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise TrainSetupError(f"--resume {source}: not a readable checkpoint ({reason})") from None
    if not isinstance(state, dict):
        raise TrainSetupError(f"--resume {source}: not a featurecache training checkpoint")
    missing = [name for name in _RESUMED_PARTS if name not in state]
    if missing:
        raise TrainSetupError(f"--resume {source}: not a featurecache training checkpoint (no {', '.join(missing)})")
    if "sample_in_epoch" not in state:  # written before positions counted samples: batches of every rank
        config = state.get("train_config", {})
        state["sample_in_epoch"] = state.get("batch_in_epoch", 0) * config.get("batch_size", 1) * state["world_size"]
    return state


def load_initial_weights(path: pathlib.Path) -> dict:
    """The model a run starts from with --init-from: a checkpoint file's "model" weights and
    "model_config" settings (and "ema" where it has one), from `featurecache convert` or a run.
    Read with weights_only=False, as --resume: only checkpoints you wrote or converted."""
    if not path.is_file():
        raise TrainSetupError(
            f"--init-from {path}: {'is a folder, expected a checkpoint file' if path.is_dir() else 'no such file'}"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise TrainSetupError(f"--init-from {path}: not a readable checkpoint ({reason})") from None
    if (
        not isinstance(state, dict)
        or not isinstance(state.get("model"), dict)
        or not isinstance(state.get("model_config"), dict)
    ):
        hint = (
            " (a Protenix checkpoint? convert it first: featurecache convert FILE OUT --to featurecache)"
            if isinstance(state, dict) and "model" in state
            else ""
        )
        raise TrainSetupError(f"--init-from {path}: not a featurecache checkpoint (no model and model_config){hint}")
    return state


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state_dict with a tensor learning rate written as a float, so that a
    checkpoint of a CUDA-graph run resumes in any mode (a non-capturable AdamW refuses tensor lr)."""
    state = optimizer.state_dict()
    for group in state["param_groups"]:
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])
    return state


def inference_weights(model_state: dict, model_config: dict, step: int) -> dict:
    """A weights file's contents: `model_state` (the EMA in place of the averaged parameters),
    the model settings it was trained with, the step; plain tensors, numbers and strings only."""
    return {"format": WEIGHTS_FORMAT, "model": model_state, "model_config": model_config, "step": step}
