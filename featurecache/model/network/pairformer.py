"""Pairformer (AF3 Algorithm 17) and the pair-only stack shared with the MSA and template modules.

Dropout as AF3 places it: rowwise after the triangle multiplications and the starting-node
attention, columnwise after the ending-node attention (`dropout`, 0.25 in AF3), only while
training. Each stack draws one seed per call from the step's generator and every block derives
its masks from it (kernels/reference.py shared_dropout_reference; the residual add's kernel
draws them in its own pass), so checkpointed blocks recompute the same masks.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from featurecache.kernels.reference import DropoutSite
from featurecache.kernels.transition import Transition
from featurecache.kernels.triangle_mult import TriangleMultiplication
from featurecache.model.network import checkpointing
from featurecache.model.network.layers import (
    AttentionPairBias,
    TriangleAttention,
    derived_seeds,
    dropout_seed,
    kernel_module,
    residual_fn,
)

ROWWISE, COLUMNWISE = 1, 2  # the axis of z [B, i, j, C] along which one dropout mask is shared


class PairStack(nn.Module):
    """The pair half of a Pairformer block: triangle multiplications (outgoing, incoming),
    triangle attentions (starting, ending node) and a pair transition, each a residual update.

    Each residual add also returns the new z in autocast's dtype, which the next update reads:
    one fused kernel instead of an add and a cast (featurecache.kernels.residual).

    `recompute_attention` (ModelConfig.checkpoint_group > 1): while autograd records, each triangle
    attention keeps only its input and is re-run in backward. Its projections [B, L, L, 4 C + H]
    and output are ~6 pair-sized tensors of the ~21 a block re-run in backward holds (Triton path):
    ~10 GB less at crop 2,560, for one more forward of the two attentions.

    `mult_hidden`: the triangle multiplications' inner width (None: c_z, as AF3; Protenix 128)."""

    def __init__(
        self,
        c_z: int,
        num_heads: int,
        head_dim: int,
        transition_expansion: int,
        kernels: str = "triton",
        dropout: float = 0.0,
        recompute_attention: bool = False,
        mult_hidden: int | None = None,
    ) -> None:
        super().__init__()
        self.dropout = dropout
        self.recompute_attention = recompute_attention
        self.tri_mul_out = kernel_module(
            TriangleMultiplication, c_z, mult_hidden, direction="outgoing", kernels=kernels
        )
        self.tri_mul_in = kernel_module(TriangleMultiplication, c_z, mult_hidden, direction="incoming", kernels=kernels)
        self.tri_att_start = TriangleAttention(c_z, num_heads, head_dim, node="starting", kernels=kernels)
        self.tri_att_end = TriangleAttention(c_z, num_heads, head_dim, node="ending", kernels=kernels)
        self.transition = kernel_module(Transition, c_z, expansion=transition_expansion, kernels=kernels)
        self.residual = residual_fn(kernels)

    def forward(self, z: torch.Tensor, pair_mask: torch.Tensor, seed: torch.Tensor | None = None) -> torch.Tensor:
        """z: [B, N_token, N_token, c_z]; pair_mask: [B, N_token, N_token] bool; seed: [] int64
        (None: no dropout). Returns the updated z [B, N_token, N_token, c_z]."""
        return self.updates(z, pair_mask, seed)[0]

    def updates(
        self, z: torch.Tensor, pair_mask: torch.Tensor, seed: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The updated z, and the same in autocast's dtype (z itself without autocast). `seed`:
        this block's dropout seed (None, or eval mode: no dropout)."""
        rate = self.dropout if self.training and seed is not None else 0.0

        def dropout(site: int, shared_dim: int) -> DropoutSite | None:  # drawn in the residual add
            return DropoutSite(rate, seed, site, shared_dim) if rate > 0.0 else None

        z, z_low = self.residual(z, self.tri_mul_out(z, pair_mask), dropout(0, ROWWISE))
        z, z_low = self.residual(z, self.tri_mul_in(z_low, pair_mask), dropout(1, ROWWISE))
        z, z_low = self.residual(z, self._attention(self.tri_att_start, z_low, pair_mask), dropout(2, ROWWISE))
        z, z_low = self.residual(z, self._attention(self.tri_att_end, z_low, pair_mask), dropout(3, COLUMNWISE))
        return self.residual(z, self.transition(z_low))

    def _attention(self, attention: nn.Module, z_low: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        # dropout stays outside: its mask comes from the seed, the checkpoint needs no RNG state
        return checkpointing.maybe_checkpointed(self.recompute_attention, attention, z_low, pair_mask)


class PairformerBlock(nn.Module):
    def __init__(
        self,
        c_s: int,
        c_z: int,
        single_heads: int,
        single_head_dim: int,
        pair_heads: int,
        pair_head_dim: int,
        transition_expansion: int,
        kernels: str = "triton",
        dropout: float = 0.0,
        recompute_attention: bool = False,
        mult_hidden: int | None = None,
    ) -> None:
        super().__init__()
        self.pair = PairStack(
            c_z,
            pair_heads,
            pair_head_dim,
            transition_expansion,
            kernels=kernels,
            dropout=dropout,
            recompute_attention=recompute_attention,
            mult_hidden=mult_hidden,
        )
        self.attention = AttentionPairBias(c_s, c_z, single_heads, single_head_dim, kernels=kernels)
        self.transition = kernel_module(Transition, c_s, expansion=transition_expansion, kernels=kernels)

    def forward(
        self,
        s: torch.Tensor,
        z: torch.Tensor,
        token_mask: torch.Tensor,
        pair_mask: torch.Tensor,
        seed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block of Algorithm 17: the pair stack on z, then attention with pair bias and a
        transition on s.

        s: [B, N_token, c_s]; z: [B, N_token, N_token, c_z]; token_mask: [B, N_token] bool;
        pair_mask: [B, N_token, N_token] bool; seed: [] int64, this block's dropout seed (None,
        or eval mode: no dropout). Returns (s [B, N_token, c_s], z [B, N_token, N_token, c_z]).
        """
        z, z_low = self.pair.updates(z, pair_mask, seed)
        s = s + self.attention(s, z_low, token_mask)
        s = s + self.transition(s)
        return s, z


def run_blocks(
    blocks: nn.ModuleList, checkpointed: bool, *state, masks: tuple, seed: torch.Tensor | None = None, group: int = 1
) -> tuple:
    """Apply blocks in order; with `checkpointed`, keep only each block's input for backward.
    `seed` (a dropout_seed): each block gets its own seed derived from it, as its last argument.
    `group` > 1 (with `checkpointed`): keep only the input of every `group`-th block; backward
    re-runs each group, a checkpoint per block inside (the sqrt(N) scheme: N / group + group
    inputs held instead of N, for one more forward of the stack).

    Activation checkpointing per block is what lets the 48-block trunk train at crop 384+: the
    activations of one block at L = 384 are several GB, the block inputs a few hundred MB.
    """
    seeds = [()] * len(blocks) if seed is None else [(block_seed,) for block_seed in derived_seeds(seed, len(blocks))]
    calls = list(zip(blocks, seeds))
    if not (checkpointed and torch.is_grad_enabled()):
        return _run_plain(calls, state, masks)
    if group > 1 and len(calls) > 1:
        for start in range(0, len(calls), group):
            chunk = calls[start : start + group]
            if len(chunk) == 1:  # a group of one block is that block's checkpoint
                state = _run_checkpointed(chunk, state, masks)
            else:
                state = checkpointing.checkpointed(functools.partial(_run_group, chunk, masks), *state)
        return state
    return _run_checkpointed(calls, state, masks)


def _run_group(calls: list, masks: tuple, *state) -> tuple:
    """One group of blocks: plain in the first forward (no grad), a checkpoint per block when
    backward re-runs it."""
    if torch.is_grad_enabled():
        return _run_checkpointed(calls, state, masks)
    return _run_plain(calls, state, masks)


def _run_checkpointed(calls: list, state: tuple, masks: tuple) -> tuple:
    for block, block_seed in calls:
        state = _as_tuple(checkpointing.checkpointed(block, *state, *masks, *block_seed))
    return state


def _run_plain(calls: list, state: tuple, masks: tuple) -> tuple:
    for block, block_seed in calls:
        state = _as_tuple(block(*state, *masks, *block_seed))
    return state


def _as_tuple(state) -> tuple:
    return state if isinstance(state, tuple) else (state,)


class Pairformer(nn.Module):
    def __init__(
        self,
        num_blocks: int,
        c_s: int,
        c_z: int,
        single_heads: int,
        single_head_dim: int,
        pair_heads: int,
        pair_head_dim: int,
        transition_expansion: int,
        checkpoint_blocks: bool = True,
        kernels: str = "triton",
        dropout: float = 0.0,
        checkpoint_group: int = 1,
        recompute_attention: bool = False,
        mult_hidden: int | None = None,
    ) -> None:
        """`recompute_attention` (PairStack's): implied by checkpoint_group > 1; the confidence
        head, re-run whole with grouped checkpoints, asks for it with one group per block.
        `mult_hidden`: PairStack's."""
        super().__init__()
        self.checkpoint_blocks = checkpoint_blocks
        self.checkpoint_group = checkpoint_group
        self.dropout = dropout
        self.blocks = nn.ModuleList(
            PairformerBlock(
                c_s,
                c_z,
                single_heads,
                single_head_dim,
                pair_heads,
                pair_head_dim,
                transition_expansion,
                kernels=kernels,
                dropout=dropout,
                recompute_attention=checkpoint_blocks and (checkpoint_group > 1 or recompute_attention),
                mult_hidden=mult_hidden,
            )
            for _ in range(num_blocks)
        )

    def forward(
        self,
        s: torch.Tensor,
        z: torch.Tensor,
        token_mask: torch.Tensor,
        pair_mask: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Algorithm 17, every block in order.

        s: [B, N_token, c_s]; z: [B, N_token, N_token, c_z]; token_mask: [B, N_token] bool;
        pair_mask: [B, N_token, N_token] bool; `generator`: the step's, for the dropout seed
        (None: the device's default generator). Returns (s [B, N_token, c_s],
        z [B, N_token, N_token, c_z]).
        """
        seed = dropout_seed(generator, z.device) if self.training and self.dropout > 0 else None
        s, z = run_blocks(
            self.blocks,
            self.checkpoint_blocks and self.training,
            s,
            z,
            masks=(token_mask, pair_mask),
            seed=seed,
            group=self.checkpoint_group,
        )
        return s, z
