"""Prediction: structures from a trained checkpoint for targets of a cache.

    featurecache predict --cache DIR KEY... --checkpoint RUN_DIR/checkpoint-00000100.pt --out DIR

Modules: `mmcif` (predicted atoms as mmCIF, through gemmi), `run` (load the model, sample,
write), `command` (the click command).
"""

from featurecache.prediction.command import predict_command
from featurecache.prediction.run import PredictError, PredictOptions, load_model, predict

__all__ = ["PredictError", "PredictOptions", "load_model", "predict", "predict_command"]
