"""MSA module (AF3 Algorithm 8): the MSA talks to the pair through the outer product mean and
reads it back through pair-weighted averaging; the pair runs the triangle updates. Dropout while
training (AF3): rowwise, one mask for every MSA row, after pair-weighted averaging
(config.msa.msa_dropout), and the pair stack's (config.trunk.pair_dropout)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from featurecache.kernels.transition import Transition
from featurecache.kernels.reference import DropoutSite
from featurecache.model.config import ModelConfig
from featurecache.schema import NUM_RESTYPES
from featurecache.model.network.layers import (
    SITES_PER_BLOCK,
    Linear,
    OuterProductMean,
    PairWeightedAveraging,
    dropout_seed,
    kernel_module,
    residual_fn,
)
from featurecache.model.network.pairformer import ROWWISE, PairStack, run_blocks

MSA_FEATURE_DIM = NUM_RESTYPES + 2  # class one-hot, has_deletion, deletion_value


def msa_features(batch: dict) -> torch.Tensor:
    """[B, S, N, MSA_FEATURE_DIM]: one-hot class, then the deletion features (deletion_features)."""
    return torch.cat([F.one_hot(batch["msa"].long(), NUM_RESTYPES).float(), deletion_features(batch)], dim=-1)


def deletion_features(batch: dict) -> torch.Tensor:
    """[B, S, N, 2]: has_deletion, 2/pi * arctan(deletions / 3)."""
    deletions = batch["deletion_matrix"].float().unsqueeze(-1)
    return torch.cat([(deletions > 0).float(), torch.atan(deletions / 3.0) * (2.0 / math.pi)], dim=-1)


def embed_msa(linear: nn.Linear, batch: dict) -> torch.Tensor:
    """linear(msa_features(batch)) [B, S, N, out] without the one-hot: the weight column of each
    row's residue class plus the deletion features times theirs. The one-hot form is [B, S, N, 34]
    floats whatever the width (53 MB at 1,024 rows of 384 tokens), kept for the weight's gradient.
    Under autocast, in the autocast dtype, as the linear layer's output would be."""
    columns = linear.weight.t()  # [MSA_FEATURE_DIM, out], its rows in the order of msa_features
    out = (
        F.embedding(batch["msa"].long(), columns[:NUM_RESTYPES])
        + deletion_features(batch).to(columns.dtype) @ columns[NUM_RESTYPES:]
    )
    if linear.bias is not None:
        out = out + linear.bias
    device = out.device.type
    return out.to(torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else out


# The loader's per-cycle MSA rows: an input the model reads where the batch has it (a hand-built
# batch without it uses its whole MSA in every cycle); a captured step must copy it in too.
OPTIONAL_INPUTS = ("msa_cycle_rows",)


def msa_of_cycle(batch: dict, cycle: int) -> dict:
    """`batch` with the MSA rows recycling cycle `cycle` reads (AF3's fresh draw per cycle): rows
    `msa_cycle_rows[:, cycle mod C]` of the loader's pool gathered into msa, deletion_matrix and
    msa_row_mask [B, R, ...]; a -1 position is a masked row. Gathers only (no host sync, fixed
    shapes), so a captured CUDA graph replays it. A batch without msa_cycle_rows is returned as is."""
    cycle_rows = batch.get("msa_cycle_rows")
    if cycle_rows is None:
        return batch
    rows = cycle_rows[:, cycle % cycle_rows.shape[1]].long()  # [B, R]
    valid = rows >= 0
    rows = rows.clamp(min=0)
    msa_index = rows[:, :, None].expand(-1, -1, batch["msa"].shape[2])  # [B, R, N]
    return dict(
        batch,
        msa=torch.gather(batch["msa"], 1, msa_index),
        deletion_matrix=torch.gather(batch["deletion_matrix"], 1, msa_index),
        msa_row_mask=valid & torch.gather(batch["msa_row_mask"], 1, rows),
    )


class MSABlock(nn.Module):
    """One MSA-module block; the last one only updates the pair, since nothing reads its MSA."""

    def __init__(self, config: ModelConfig, last: bool) -> None:
        super().__init__()
        kernels, msa, trunk = config.runtime.kernels, config.msa, config.trunk
        self.last = last
        self.msa_dropout = msa.msa_dropout
        self.outer_product_mean = OuterProductMean(
            msa.c_m,
            trunk.c_z,
            msa.outer_product_dim,
            kernels=kernels,
            bias_divided=config.dialect.outer_product_bias_divided,
        )
        self.residual = residual_fn(kernels)
        if not last:
            self.pair_weighted_averaging = PairWeightedAveraging(
                msa.c_m, trunk.c_z, msa.msa_heads, msa.msa_head_dim, kernels=kernels
            )
            self.msa_transition = kernel_module(
                Transition, msa.c_m, expansion=trunk.transition_expansion, kernels=kernels
            )
        self.pair = PairStack(
            trunk.c_z,
            trunk.pair_heads,
            trunk.pair_head_dim,
            trunk.transition_expansion,
            kernels=kernels,
            dropout=trunk.pair_dropout,
            mult_hidden=config.dialect.triangle_mult_hidden,
        )

    def forward(
        self,
        m: torch.Tensor,
        z: torch.Tensor,
        msa_mask: torch.Tensor,
        token_mask: torch.Tensor,
        pair_mask: torch.Tensor,
        seed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block of Algorithm 8: the outer product mean into z, pair-weighted averaging and a
        transition on m (not in the last block), then the pair stack on z.

        m: [B, N_msa, N_token, c_m]; z: [B, N_token, N_token, c_z]; msa_mask: [B, N_msa, N_token]
        bool; token_mask: [B, N_token] bool; pair_mask: [B, N_token, N_token] bool; seed: [] int64,
        this block's dropout seed (None, or eval mode: no dropout). Returns (m, z) in their shapes.
        """
        z = z + self.outer_product_mean(m, msa_mask)
        if not self.last:
            rate = self.msa_dropout if self.training and seed is not None else 0.0
            # the pair stack's sites are 0-3; the MSA's mask is [B, 1, L, C_m], shared by the rows,
            # drawn in the residual add's kernel
            dropout = DropoutSite(rate, seed, SITES_PER_BLOCK - 1, ROWWISE) if rate > 0.0 else None
            m = self.residual(m, self.pair_weighted_averaging(m, z, token_mask), dropout)[0]
            m = m + self.msa_transition(m)
        z = self.pair(z, pair_mask, seed)
        return m, z


class MSAModule(nn.Module):
    def __init__(self, config: ModelConfig, single_input_dim: int) -> None:
        """single_input_dim: width of the per-token inputs (AF3Model's atom-aware s_inputs)."""
        super().__init__()
        self.checkpoint_blocks = config.runtime.checkpoint_blocks
        self.checkpoint_group = config.runtime.checkpoint_group  # as the Pairformer's: 4 blocks, one group
        self.dropout = max(config.msa.msa_dropout, config.trunk.pair_dropout)
        self.from_msa = Linear(MSA_FEATURE_DIM, config.msa.c_m, bias=False)
        self.from_single = Linear(single_input_dim, config.msa.c_m, bias=False)
        num_blocks = config.msa.msa_blocks
        self.blocks = nn.ModuleList(MSABlock(config, last=i == num_blocks - 1) for i in range(num_blocks))

    def forward(
        self,
        batch: dict,
        inputs: torch.Tensor,
        z: torch.Tensor,
        token_mask: torch.Tensor,
        pair_mask: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Algorithm 8: update the pair from the MSA.

        batch: the collated batch (msa, deletion_matrix, msa_row_mask [B, N_msa, ...], the rows
        of this cycle: msa_of_cycle); inputs: [B, N_token, c_s_inputs]; z: [B, N_token, N_token,
        c_z]; token_mask: [B, N_token] bool; pair_mask: [B, N_token, N_token] bool; `generator`:
        the step's, for the dropout seed (None: the device's default generator). Returns the new
        z [B, N_token, N_token, c_z].
        """
        msa_mask = batch["msa_row_mask"][:, :, None] & token_mask[:, None, :]  # [B, S, N]
        m = embed_msa(self.from_msa, batch) + self.from_single(inputs).unsqueeze(1)
        seed = dropout_seed(generator, z.device) if self.training and self.dropout > 0 else None
        _, z = run_blocks(
            self.blocks,
            self.checkpoint_blocks and self.training,
            m,
            z,
            masks=(msa_mask, token_mask, pair_mask),
            seed=seed,
            group=self.checkpoint_group,
        )
        return z
