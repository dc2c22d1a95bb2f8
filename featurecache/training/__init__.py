"""Training: config, distributed setup, data, checkpoints, schedule, CUDA graphs, loop, command.

    python -m featurecache.training --cache DIR --preset tiny --steps 100 --out runs/tiny

Modules, bottom up: `config` (TrainConfig), `distributed` (devices and ranks), `data` (datasets,
featurecache.sampler's order and the DataLoader of a run), `buckets` (the padded sizes of
--static-shapes batches, the atom buckets), `checkpoint` (save, load, RNG
states), `schedule` (AF3's warm-up and step decay, the CUDA-graph learning rate), `ema` (the weights' moving average),
`validation` (lDDT on held-out targets), `determinism` (--deterministic), `cuda_graph`
(CapturedStep), `interrupt` (Ctrl-C and SIGTERM: stop after a checkpoint), `loop` (train) and
`command` (the click command).
"""

__all__ = [
    "CapturedStep",
    "EpochBatchSampler",
    "SampleConfig",
    "TrainConfig",
    "TrainSetupError",
    "WeightedSampler",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
    "train",
    "train_command",
]


def __getattr__(name):
    """Each name imported from its module on first use (as featurecache/__init__.py does):
    `featurecache plot` reads a run's log through training.run_plot and must not import torch."""
    if name == "CapturedStep":
        from featurecache.training import cuda_graph as module
    elif name in ("EpochBatchSampler", "WeightedSampler"):
        from featurecache import sampler as module
    elif name == "SampleConfig":
        from featurecache import config as module
    elif name in ("TrainConfig", "TrainSetupError"):
        from featurecache.training import config as module
    elif name in ("latest_checkpoint", "load_checkpoint", "save_checkpoint"):
        from featurecache.training import checkpoint as module
    elif name == "train":
        from featurecache.training import loop as module
    elif name == "train_command":
        from featurecache.training import command as module
    else:
        raise AttributeError(f"module 'featurecache.training' has no attribute {name!r}")
    return getattr(module, name)
