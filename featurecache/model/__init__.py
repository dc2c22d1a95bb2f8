"""AF3 trunk on top of featurecache.kernels: presets `tiny` and `af3`, one switch for the kernels."""

from featurecache.kernels.runtime import KERNEL_CHOICES
from featurecache.model.config import PRESETS, ModelConfig, preset
from featurecache.model.heads import distogram_loss
from featurecache.model.trunk import AF3Trunk

__all__ = ["AF3Trunk", "KERNEL_CHOICES", "ModelConfig", "PRESETS", "distogram_loss", "preset"]
