"""AF3 on top of featurecache.kernels: the trunk (AF3Trunk, distogram only) and the full structure
model (AF3Model: atom attention, recycling, diffusion), presets `tiny` and `af3`, one switch for
the kernels."""

from featurecache.kernels.runtime import KERNEL_CHOICES
from featurecache.model.af3 import AF3Model, sample_num_cycles
from featurecache.model.config import PRESETS, ModelConfig, preset
from featurecache.model.heads import distogram_loss
from featurecache.model.trunk import AF3Trunk

__all__ = ["AF3Model", "AF3Trunk", "KERNEL_CHOICES", "ModelConfig", "PRESETS", "distogram_loss", "preset",
           "sample_num_cycles"]
