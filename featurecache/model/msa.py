"""MSA module (AF3 Algorithm 8): the MSA talks to the pair through the outer product mean and
reads it back through pair-weighted averaging; the pair runs the triangle updates."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from featurecache.schema import NUM_RESTYPES
from featurecache.model.config import ModelConfig
from featurecache.model.embedders import SINGLE_INPUT_DIM
from featurecache.model.layers import OuterProductMean, PairWeightedAveraging, kernel_module
from featurecache.model.pairformer import PairStack, run_blocks

MSA_FEATURE_DIM = NUM_RESTYPES + 2  # class one-hot, has_deletion, deletion_value


def msa_features(batch: dict) -> torch.Tensor:
    """[B, S, N, MSA_FEATURE_DIM]: one-hot class, has_deletion, 2/pi * arctan(deletions / 3)."""
    deletions = batch["deletion_matrix"].float()
    return torch.cat(
        [
            F.one_hot(batch["msa"].long(), NUM_RESTYPES).float(),
            (deletions > 0).float().unsqueeze(-1),
            (torch.atan(deletions / 3.0) * (2.0 / math.pi)).unsqueeze(-1),
        ],
        dim=-1,
    )


class MSABlock(nn.Module):
    """One MSA-module block; the last one only updates the pair, since nothing reads its MSA."""

    def __init__(self, config: ModelConfig, last: bool) -> None:
        super().__init__()
        kernels = config.kernels
        self.last = last
        self.outer_product_mean = OuterProductMean(config.c_m, config.c_z, config.outer_product_dim, kernels=kernels)
        if not last:
            self.pair_weighted_averaging = PairWeightedAveraging(
                config.c_m, config.c_z, config.msa_heads, config.msa_head_dim, kernels=kernels)
            self.msa_transition = kernel_module(
                "Transition", config.c_m, expansion=config.transition_expansion, kernels=kernels)
        self.pair = PairStack(config.c_z, config.pair_heads, config.pair_head_dim,
                              config.transition_expansion, kernels=kernels)

    def forward(self, m: torch.Tensor, z: torch.Tensor, msa_mask: torch.Tensor, token_mask: torch.Tensor,
                pair_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = z + self.outer_product_mean(m, msa_mask)
        if not self.last:
            m = m + self.pair_weighted_averaging(m, z, token_mask)
            m = m + self.msa_transition(m)
        z = self.pair(z, pair_mask)
        return m, z


class MSAModule(nn.Module):
    def __init__(self, config: ModelConfig, single_input_dim: int = SINGLE_INPUT_DIM) -> None:
        """single_input_dim: width of the per-token inputs (the trunk's token features, or the
        atom-aware s_inputs of AF3Model)."""
        super().__init__()
        self.checkpoint_blocks = config.checkpoint_blocks
        self.from_msa = nn.Linear(MSA_FEATURE_DIM, config.c_m, bias=False)
        self.from_single = nn.Linear(single_input_dim, config.c_m, bias=False)
        num_blocks = config.num_msa_blocks
        self.blocks = nn.ModuleList(MSABlock(config, last=i == num_blocks - 1) for i in range(num_blocks))

    def forward(self, batch: dict, inputs: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor,
                pair_mask: torch.Tensor) -> torch.Tensor:
        """Update the pair z [B, N, N, c_z] from the MSA; returns the new z."""
        msa_mask = batch["msa_row_mask"][:, :, None] & token_mask[:, None, :]  # [B, S, N]
        m = self.from_msa(msa_features(batch)) + self.from_single(inputs).unsqueeze(1)
        _, z = run_blocks(self.blocks, self.checkpoint_blocks and self.training, m, z,
                          masks=(msa_mask, token_mask, pair_mask))
        return z
