"""Training: config, distributed setup, sampler, data, checkpoints, schedule, CUDA graphs, loop, command.

    python -m featurecache.training --cache DIR --preset tiny --steps 100 --out runs/tiny

Modules, bottom up: `config` (TrainConfig), `distributed` (devices and ranks), `sampler`
(EpochBatchSampler, WeightedBatchSampler: one global order of samples per epoch), `data`
(datasets and DataLoader of a run), `checkpoint` (save, load, RNG states), `schedule` (AF3's
warm-up and step decay, the CUDA-graph learning rate), `ema` (the weights' moving average),
`validation` (lDDT on held-out targets), `determinism` (--deterministic), `cuda_graph`
(CapturedStep), `loop` (train) and `command` (the click command).
"""

from featurecache.config import SampleConfig
from featurecache.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from featurecache.training.command import train_command
from featurecache.training.config import TrainConfig, TrainSetupError
from featurecache.training.cuda_graph import CapturedStep
from featurecache.training.loop import train
from featurecache.training.sampler import EpochBatchSampler, WeightedBatchSampler

__all__ = ["CapturedStep", "EpochBatchSampler", "SampleConfig", "TrainConfig", "TrainSetupError",
           "WeightedBatchSampler", "latest_checkpoint", "load_checkpoint", "save_checkpoint", "train", "train_command"]
