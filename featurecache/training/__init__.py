"""Training: config, data loading for training, distributed setup, checkpoints, CUDA graphs, loop.

    python -m featurecache.training --cache DIR --preset tiny --steps 100 --out runs/tiny
"""

from featurecache.training.loop import TrainConfig, train, train_command

__all__ = ["TrainConfig", "train", "train_command"]
