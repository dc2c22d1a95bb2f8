"""Prediction: structures from a trained model for targets of a cache.

    featurecache predict --cache DIR KEY... --checkpoint RUN_DIR/weights.pt --out DIR

    featurecache evaluate PREDICTED.cif... --truth TRUE.cif

Modules: `mmcif` (predicted atoms as mmCIF, through gemmi), `run` (load the model, sample,
write), `command` (the click command), `evaluate` (CA-RMSD, lDDT and ligand RMSD against a true
structure, and its click command).
"""

from featurecache.prediction.command import predict_command
from featurecache.prediction.evaluate import Scores, compare, evaluate_command
from featurecache.prediction.run import PredictError, PredictOptions, load_model, predict

__all__ = [
    "Scores",
    "compare",
    "evaluate_command",
    "PredictError",
    "PredictOptions",
    "load_model",
    "predict",
    "predict_command",
]
