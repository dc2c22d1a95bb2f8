"""Model configuration and the two presets.

`af3` follows the AlphaFold3 supplement (Abramson et al. 2024): 48 Pairformer blocks with
c_s = 384 and c_z = 128, 4 MSA-module blocks with c_m = 64, 2 template blocks with c = 64, and the
paper's head counts. `tiny` keeps every module but shrinks every width so that CPU tests run in
seconds.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

from featurecache.kernels.runtime import KERNEL_CHOICES


@dataclass(frozen=True)
class ModelConfig:
    c_s: int = 384                  # single representation
    c_z: int = 128                  # pair representation
    c_m: int = 64                   # MSA representation
    c_template: int = 64            # template pair representation
    num_pairformer_blocks: int = 48
    num_msa_blocks: int = 4
    num_template_blocks: int = 2
    single_heads: int = 16          # attention with pair bias: 16 heads of 24
    single_head_dim: int = 24
    pair_heads: int = 4             # triangle attention: 4 heads of 32
    pair_head_dim: int = 32
    template_pair_heads: int = 4
    template_pair_head_dim: int = 16
    msa_heads: int = 8              # pair-weighted averaging: 8 heads of 8
    msa_head_dim: int = 8
    outer_product_dim: int = 32
    transition_expansion: int = 4
    template_transition_expansion: int = 2
    relpos_max_residue: int = 32    # r_max of AF3's relative position encoding
    relpos_max_chain: int = 2       # s_max
    distogram_bins: int = 64
    distogram_min: float = 2.0      # Angstrom; 64 bins from 2 to 22 as in AF3
    distogram_max: float = 22.0
    kernels: str = "triton"         # "triton": featurecache.kernels; "torch": pure-PyTorch references
    checkpoint_blocks: bool = True  # activation checkpointing per block while training

    def __post_init__(self) -> None:
        if self.kernels not in KERNEL_CHOICES:
            raise ValueError(f"ModelConfig.kernels is {self.kernels!r}, expected one of {KERNEL_CHOICES}")
        for name in ("c_s", "c_z", "c_m", "c_template", "single_heads", "pair_heads", "msa_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        for name in ("num_pairformer_blocks", "num_msa_blocks", "num_template_blocks"):
            if getattr(self, name) < 0:
                raise ValueError(f"ModelConfig.{name} must be >= 0, got {getattr(self, name)}")

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, ModelConfig] = {
    "af3": ModelConfig(),
    "tiny": ModelConfig(
        c_s=32, c_z=16, c_m=8, c_template=8,
        num_pairformer_blocks=2, num_msa_blocks=1, num_template_blocks=1,
        single_heads=2, single_head_dim=8,
        pair_heads=2, pair_head_dim=8,
        template_pair_heads=2, template_pair_head_dim=8,
        msa_heads=2, msa_head_dim=4,
        outer_product_dim=4,
    ),
}


def preset(name: str, **overrides) -> ModelConfig:
    """The named preset, with any field overridden (e.g. `kernels="torch"`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}, expected one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)


def __getattr__(name: str):
    # KERNEL_IMPLS is the old name of featurecache.kernels.runtime.KERNEL_CHOICES.
    if name == "KERNEL_IMPLS":
        warnings.warn("featurecache.model.config.KERNEL_IMPLS is deprecated, use "
                      "featurecache.kernels.runtime.KERNEL_CHOICES", DeprecationWarning, stacklevel=2)
        return KERNEL_CHOICES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
