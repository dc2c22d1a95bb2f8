"""AF3 on top of featurecache.kernels: the structure model (AF3Model: atom attention, the recycled
trunk with its distogram, diffusion, confidence), its configuration in parts (ModelConfig) with the
presets `tiny`, `small` and `af3`, one switch for the kernels."""

from featurecache.kernels.runtime import KERNEL_CHOICES
from featurecache.model.af3 import AF3Model, sample_num_cycles
from featurecache.model.config import PRESETS, ModelConfig, preset
from featurecache.model.network.heads import distogram_loss

__all__ = ["AF3Model", "KERNEL_CHOICES", "ModelConfig", "PRESETS", "distogram_loss", "preset", "sample_num_cycles"]
