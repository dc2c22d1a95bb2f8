"""Training: config, distributed setup, data, checkpoints, schedule, CUDA graphs, loop, command.

    python -m featurecache.training --cache DIR --preset tiny --steps 100 --out runs/tiny

Modules, bottom up: `config` (TrainConfig), `distributed` (devices and ranks), `data` (datasets,
featurecache.sampler's order and the DataLoader of a run), `checkpoint` (save, load, RNG
states), `schedule` (AF3's warm-up and step decay, the CUDA-graph learning rate), `ema` (the weights' moving average),
`validation` (lDDT on held-out targets), `determinism` (--deterministic), `cuda_graph`
(CapturedStep), `loop` (train) and `command` (the click command).
"""

import importlib

# name -> the module that defines it, imported on first use (as featurecache/__init__.py does):
# `featurecache plot` reads a run's log through training.run_plot and must not import torch.
_EXPORTS = {
    "CapturedStep": "featurecache.training.cuda_graph",
    "EpochBatchSampler": "featurecache.sampler",
    "SampleConfig": "featurecache.config",
    "TrainConfig": "featurecache.training.config",
    "TrainSetupError": "featurecache.training.config",
    "WeightedSampler": "featurecache.sampler",
    "latest_checkpoint": "featurecache.training.checkpoint",
    "load_checkpoint": "featurecache.training.checkpoint",
    "save_checkpoint": "featurecache.training.checkpoint",
    "train": "featurecache.training.loop",
    "train_command": "featurecache.training.command",
}

__all__ = ["CapturedStep", "EpochBatchSampler", "SampleConfig", "TrainConfig", "TrainSetupError",
           "WeightedSampler", "latest_checkpoint", "load_checkpoint", "save_checkpoint", "train", "train_command"]


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'featurecache.training' has no attribute {name!r}")
