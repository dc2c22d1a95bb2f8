"""Pair-representation sharding: one sample's Pairformer and MSA module spread over the P ranks
of a process group, after FastFold's dynamic axial parallelism (DAP). docs/SHARDING.md has the
design, the communication volume and the memory it predicts; featurecache.model.parallel.collectives the
collectives.

Layout: each rank holds a block of n = L/P rows of the pair, z[:, rows, :, :] ([B, n, L, C];
L padded to a multiple of P), and the same rows of the single representation ([B, n, C_s]).
Per Pairformer block:
- triangle multiplication, outgoing (x_ij = sum_k a_ik b_jk): a is local, b is all-gathered;
- incoming (x_ij = sum_k a_ki b_kj): a transposed by an all-to-all, b all-gathered;
- triangle attention around the starting node: rows are local, the per-head bias b_jk all-gathered;
- around the ending node: the starting node on z^T, reached by an all-to-all transpose and back;
- the transitions are local;
- attention with pair bias: queries are this rank's rows, whose bias rows are already local;
  only the keys and values (L x 2 x 384 numbers) are all-gathered, not the bias (L x L x 16).
The MSA module splits the MSA by tokens, token i with the pair's row i: the outer product mean
gathers its right factor (S x L x 32), the pair-weighted averaging its values (S x L x 64); the
weights of token i come from the pair's row i, which is local.

Gradients: every collective is an autograd Function whose backward is its adjoint (all-gather
-> reduce-scatter, the all-to-all transpose -> itself). Inside the sharded region each rank's
parameter gradients are its share: `reduce_gradients` sums them over the group.
Outside it (its input and output) the representation is whole and the same on every rank.

The blocks and parameters are the stacks' own, so a checkpoint loads either way, on both
kernel paths ("triton": the LayerNorm+Linear, Transition and EvoAttention kernels; "torch": the
references), with or without activation checkpointing.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from featurecache.kernels.reference import evo_attention_reference, layernorm_linear_reference
from featurecache.model.network.layers import (
    SITES_PER_BLOCK,
    attention_fn,
    dropout_seed,
    shared_dropout,
    gate_fn,
)
from featurecache.model.network.msa import MSAModule, embed_msa
from featurecache.model.network.pairformer import ROWWISE, Pairformer, PairformerBlock, run_blocks
from featurecache.model.parallel.collectives import (
    GatheredProduct,
    gather,
    gather_partial,
    group_size,
    own_block,
    scatter,
    transpose_rows,
)

# --------------------------------------------------------------------------------------------
# The Pairformer's updates on row blocks
# --------------------------------------------------------------------------------------------


def _autocast(x: torch.Tensor) -> torch.Tensor:
    """x in autocast's dtype while autocast is on (what the kernel modules' pre-hook does)."""
    if x.is_floating_point() and torch.is_autocast_enabled(x.device.type):
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


def _layernorm_linear_fn(kernels: str):
    if kernels == "triton":
        from featurecache.kernels.layernorm_linear import layernorm_linear

        return layernorm_linear
    return layernorm_linear_reference


def triangle_multiplication(module: nn.Module, z: torch.Tensor, mask: torch.Tensor, group) -> torch.Tensor:
    """A TriangleMultiplication's update of this rank's rows z [B, n, L, C] (mask [B, n, L])."""
    z = _autocast(z)
    hidden = module.linear_a_p.weight.shape[0]
    layernorm_linear = _layernorm_linear_fn(module.kernels)
    # the five projections from one LayerNorm and one product
    weight = torch.cat(
        [
            module.linear_a_p.weight,
            module.linear_a_g.weight,
            module.linear_b_p.weight,
            module.linear_b_g.weight,
            module.linear_g.weight,
        ]
    )
    proj = layernorm_linear(z, module.norm_in.weight, module.norm_in.bias, weight, None, module.norm_in.eps)
    a_p, a_g, b_p, b_g, g = proj.split([hidden] * 4 + [z.shape[-1]], dim=-1)
    keep = mask.unsqueeze(-1).to(proj.dtype)
    a = torch.sigmoid(a_g) * a_p * keep
    b = torch.sigmoid(b_g) * b_p * keep
    if module.direction == "incoming":
        a = transpose_rows(a, group)
    x = GatheredProduct.apply(a.contiguous(), b.contiguous(), module.direction, group)
    out = layernorm_linear(
        x, module.norm_out.weight, module.norm_out.bias, module.linear_z.weight, None, module.norm_out.eps
    )
    return torch.sigmoid(g) * out


def triangle_attention(module: nn.Module, z: torch.Tensor, mask: torch.Tensor, kernels: str, group) -> torch.Tensor:
    """A TriangleAttention's starting-node update of this rank's rows z [B, n, L, C]: rows i,
    queries j, keys k, the bias b_jk of every row gathered. The ending node is this on z^T."""
    heads, dim = module.num_heads, module.head_dim
    inner = heads * dim
    packed = module.proj(z)  # [B, n, L, >= 4 * inner + heads], one split as in the unsharded op
    *qkvg, bias, _ = packed.split([inner] * 4 + [heads, packed.shape[-1] - 4 * inner - heads], dim=-1)
    *qkv, gate = qkvg
    q, k, v = (t.unflatten(-1, (heads, dim)) for t in qkv)
    bias = gather_partial(bias.contiguous(), 1, group)  # [B, L, L, H]
    bias = bias.permute(0, 3, 1, 2).unsqueeze(1).contiguous()
    out = attention_fn(kernels)(q, k, v, bias=bias, mask=mask.contiguous())
    return module.linear_out(gate_fn(kernels)(gate, out.flatten(-2)))


def single_attention(
    module: nn.Module, s: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor, group
) -> torch.Tensor:
    """AttentionPairBias for this rank's query rows s [B, n, C_s] with their own bias rows from
    z [B, n, L, C_z]; keys and values of every row gathered. token_mask [B, L] (all keys).

    The queries are fewer than the keys, which EvoAttention does not take; this attention is
    O(L^2) against the triangle ops' O(L^3), so it runs the PyTorch reference on both paths."""
    heads, dim = module.num_heads, module.head_dim
    inner = heads * dim
    *qkv, gate = (t.unsqueeze(1) for t in module.proj(s).split(inner, dim=-1))
    q, k, v = (t.unflatten(-1, (heads, dim)) for t in qkv)
    k, v = gather_partial(torch.cat([k, v], dim=-1), 2, group).split(dim, dim=-1)
    bias = module.pair_bias(z).permute(0, 3, 1, 2).unsqueeze(1)  # [B, 1, H, n, L]
    out = evo_attention_reference(q, k, v, bias=bias, mask=token_mask.unsqueeze(1))
    return module.linear_out(module.gate(gate, out.flatten(-2)).squeeze(1))


def pair_updates(
    pair: nn.Module,
    group,
    z: torch.Tensor,
    rows_mask: torch.Tensor,
    columns_mask: torch.Tensor,
    seed: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PairStack.updates on this rank's rows z [B, n, L, C]; rows_mask and columns_mask [B, n, L]
    are the pair mask's rows and its transpose's rows.

    Dropout as PairStack draws it: a mask is a function of (seed, site, indices), and a rowwise
    mask does not depend on the row, so every rank draws the same one. The ending node's
    columnwise mask is the rowwise one of z^T, applied before the transpose back."""
    kernels = pair.tri_mul_out.kernels
    rate = pair.dropout if pair.training else 0.0

    def dropped(update, site):
        return shared_dropout(update, rate, seed, site, ROWWISE)

    z, z_low = pair.residual(z, dropped(triangle_multiplication(pair.tri_mul_out, z, rows_mask, group), 0))
    z, z_low = pair.residual(z, dropped(triangle_multiplication(pair.tri_mul_in, z_low, rows_mask, group), 1))
    z, z_low = pair.residual(z, dropped(triangle_attention(pair.tri_att_start, z_low, rows_mask, kernels, group), 2))
    ending = triangle_attention(pair.tri_att_end, transpose_rows(z_low, group), columns_mask, kernels, group)
    z, z_low = pair.residual(z, transpose_rows(dropped(ending, 3), group))
    return pair.residual(z, pair.transition(z_low))


def pairformer_block(
    block: PairformerBlock,
    group,
    s: torch.Tensor,
    z: torch.Tensor,
    token_mask: torch.Tensor,
    rows_mask: torch.Tensor,
    columns_mask: torch.Tensor,
    seed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One PairformerBlock on this rank's rows: s [B, n, C_s], z [B, n, L, C_z]."""
    z, z_low = pair_updates(block.pair, group, z, rows_mask, columns_mask, seed)
    s = s + single_attention(block.attention, s, z_low, token_mask, group)
    s = s + block.transition(s)
    return s, z


class _ShardedStack(nn.Module):
    """What the sharded stacks share: the original stack's blocks (so the same state_dict),
    padding to a multiple of P, the pair mask's row blocks, the dropout seed, and the gradient sum."""

    def __init__(self, stack: nn.Module, group) -> None:
        super().__init__()
        self.blocks = stack.blocks
        self.checkpoint_blocks = stack.checkpoint_blocks
        self.dropout = stack.dropout
        self.group = group

    def padding(self, length: int) -> int:
        """Padded tokens are masked out of every update, as a collated batch's padding is."""
        return -length % group_size(self.group)

    def pair_masks(self, pair_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of the pair mask and of its transpose."""
        rows = own_block(pair_mask, 1, self.group).contiguous()
        return rows, own_block(pair_mask, 2, self.group).transpose(1, 2).contiguous()

    def seed(self, generator: torch.Generator | None, device: torch.device) -> torch.Tensor | None:
        """The stack's dropout seed, drawn as the unsharded stack draws it: the ranks of a group
        run the same step with the same generators, so they draw the same seed."""
        return dropout_seed(generator, device) if self.training and self.dropout > 0 else None

    def run(self, block_fn, *state, masks: tuple, seed: torch.Tensor | None) -> tuple:
        blocks = [functools.partial(block_fn, block, self.group) for block in self.blocks]
        return run_blocks(blocks, self.checkpoint_blocks and self.training, *state, masks=masks, seed=seed)

    def reduce_gradients(self) -> None:
        """Sum the blocks' parameter gradients over the group (each rank holds its rows' share),
        as one all-reduce. Once per optimizer step, after the last backward."""
        grads = [p.grad for p in self.blocks.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        for grad, reduced in zip(grads, flat.split([g.numel() for g in grads])):
            grad.copy_(reduced.view_as(grad))


class ShardedPairformer(_ShardedStack):
    """A Pairformer run with its pair and single representations split by rows over `group`.

    Takes and returns whole s [B, L, C_s] and z [B, L, L, C_z], the same on every rank, as
    Pairformer does; in between each rank holds L/P rows. After backward, `reduce_gradients`.
    """

    def __init__(self, pairformer: Pairformer, group) -> None:
        super().__init__(pairformer, group)

    def forward(
        self,
        s: torch.Tensor,
        z: torch.Tensor,
        token_mask: torch.Tensor,
        pair_mask: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As Pairformer.forward, whole tensors on every rank: s [B, N_token, c_s], z [B, N_token,
        N_token, c_z], token_mask [B, N_token] bool, pair_mask [B, N_token, N_token] bool. Returns
        (s [B, N_token, c_s], z [B, N_token, N_token, c_z])."""
        length, group = z.shape[1], self.group
        seed = self.seed(generator, z.device)
        pad = self.padding(length)
        if pad:
            s, z = F.pad(s, (0, 0, 0, pad)), F.pad(z, (0, 0, 0, pad, 0, pad))
            token_mask, pair_mask = F.pad(token_mask, (0, pad)), F.pad(pair_mask, (0, pad, 0, pad))
        s, z = self.run(
            pairformer_block,
            scatter(s, 1, group),
            scatter(z, 1, group),
            masks=(token_mask, *self.pair_masks(pair_mask)),
            seed=seed,
        )
        s, z = gather(s, 1, group), gather(z, 1, group)
        return (s[:, :length], z[:, :length, :length]) if pad else (s, z)


# --------------------------------------------------------------------------------------------
# The MSA module, its tokens split as the pair's rows
# --------------------------------------------------------------------------------------------


def outer_product_mean(module: nn.Module, m: torch.Tensor, msa_mask: torch.Tensor, group) -> torch.Tensor:
    """OuterProductMean for this rank's tokens m [B, S, n, C_m] -> the pair's rows [B, n, L, C_z];
    msa_mask [B, S, L] whole. The right factor b [B, S, L, c] is gathered (S x L x 32 numbers)."""
    local_mask = own_block(msa_mask, 2, group).unsqueeze(-1).to(m.dtype)
    a, b = (t * local_mask for t in module.proj(m).split(module.hidden_dim, dim=-1))
    outer = torch.einsum("bsic,bsjd->bijcd", a, gather_partial(b.contiguous(), 2, group)).flatten(-2)
    count = torch.einsum("bsi,bsj->bij", local_mask.squeeze(-1).float(), msa_mask.float())
    return module.linear_out(outer / (count.unsqueeze(-1) + 1e-3).to(outer.dtype))


def pair_weighted_averaging(
    module: nn.Module, m: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor, group
) -> torch.Tensor:
    """PairWeightedAveraging for this rank's tokens: the weights of token i come from z's row i
    (local), the values of every token are gathered ([B, S, L, H * D])."""
    inner = module.num_heads * module.head_dim
    value, gate = module.proj(m).split(inner, dim=-1)
    value = gather_partial(value.contiguous(), 2, group).unflatten(-1, (module.num_heads, module.head_dim))
    logits = module.pair_bias(z).float().permute(0, 3, 1, 2)  # [B, H, n, L]
    logits = logits.masked_fill(~token_mask[:, None, None, :], float("-inf"))
    logits = logits.masked_fill(~own_block(token_mask, 1, group)[:, None, :, None], 0.0)
    weights = torch.softmax(logits, dim=-1).to(value.dtype)
    out = torch.einsum("bhij,bsjhd->bsihd", weights, value).flatten(-2)
    return module.linear_out(module.gate(gate, out))


def msa_block(
    block: nn.Module,
    group,
    m: torch.Tensor,
    z: torch.Tensor,
    msa_mask: torch.Tensor,
    token_mask: torch.Tensor,
    rows_mask: torch.Tensor,
    columns_mask: torch.Tensor,
    seed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One MSABlock on this rank's tokens m [B, S, n, C_m] and rows z [B, n, L, C_z]."""
    z = z + outer_product_mean(block.outer_product_mean, m, msa_mask, group)
    if not block.last:
        update = pair_weighted_averaging(block.pair_weighted_averaging, m, z, token_mask, group)
        rate = block.msa_dropout if block.training else 0.0
        # MSABlock's rowwise mask over every token, then this rank's tokens of it
        keep = shared_dropout(
            update.new_ones(m.shape[0], 1, token_mask.shape[1], m.shape[-1]), rate, seed, SITES_PER_BLOCK - 1, ROWWISE
        )
        m = m + update * own_block(keep, 2, group)
        m = m + block.msa_transition(m)
    return m, pair_updates(block.pair, group, z, rows_mask, columns_mask, seed)[0]


class ShardedMSAModule(_ShardedStack):
    """An MSAModule run with the MSA split by tokens and the pair by rows over `group` (token i
    of the MSA with row i of the pair). Takes and returns whole z, as MSAModule does."""

    def __init__(self, msa_module: MSAModule, group) -> None:
        super().__init__(msa_module, group)
        self.from_msa = msa_module.from_msa
        self.from_single = msa_module.from_single

    def forward(
        self,
        batch: dict,
        inputs: torch.Tensor,
        z: torch.Tensor,
        token_mask: torch.Tensor,
        pair_mask: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """As MSAModule.forward, whole tensors on every rank: inputs [B, N_token, c_s_inputs],
        z [B, N_token, N_token, c_z], token_mask [B, N_token] bool, pair_mask [B, N_token,
        N_token] bool. Returns the new z [B, N_token, N_token, c_z]."""
        length, group = z.shape[1], self.group
        msa_mask = batch["msa_row_mask"][:, :, None] & token_mask[:, None, :]  # [B, S, L]
        m = embed_msa(self.from_msa, batch) + self.from_single(inputs).unsqueeze(1)
        seed = self.seed(generator, z.device)
        pad = self.padding(length)
        if pad:
            m, z = F.pad(m, (0, 0, 0, pad)), F.pad(z, (0, 0, 0, pad, 0, pad))
            msa_mask, token_mask = F.pad(msa_mask, (0, pad)), F.pad(token_mask, (0, pad))
            pair_mask = F.pad(pair_mask, (0, pad, 0, pad))
        _, z = self.run(
            msa_block,
            scatter(m, 2, group),
            scatter(z, 1, group),
            masks=(msa_mask, token_mask, *self.pair_masks(pair_mask)),
            seed=seed,
        )
        z = gather(z, 1, group)
        return z[:, :length, :length] if pad else z


def shard_trunk(model: nn.Module, group) -> nn.Module:
    """Replace the MSA module and the Pairformers of `model` (an AF3Model; the confidence
    head's too, where there is one) by their sharded forms over `group`, in place; the
    state_dict keeps its keys."""
    if not isinstance(model.msa_module, ShardedMSAModule):
        model.msa_module = ShardedMSAModule(model.msa_module, group)
    for owner in (model, getattr(model, "confidence_head", None)):
        if owner is not None and not isinstance(owner.pairformer, ShardedPairformer):
            owner.pairformer = ShardedPairformer(owner.pairformer, group)
    return model


def reduce_gradients(model: nn.Module) -> None:
    """Sum the gradients of every sharded stack in `model` over its group (nothing if none)."""
    for module in model.modules():
        if isinstance(module, _ShardedStack):
            module.reduce_gradients()
