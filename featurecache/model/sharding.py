"""Pair-representation sharding: one sample's Pairformer spread over the P ranks of a process
group, after FastFold's dynamic axial parallelism (DAP). docs/SHARDING.md has the design, the
communication volume and the memory it predicts.

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

Gradients: every collective is an autograd Function whose backward is its adjoint (all-gather
-> reduce-scatter, the all-to-all transpose -> itself). Inside the sharded region each rank's
parameter gradients are its share: `ShardedPairformer.reduce_gradients` sums them over the group.
Outside it (its input and output) the representation is whole and the same on every rank.

The blocks and parameters are the Pairformer's own, so a checkpoint loads either way, on both
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
from featurecache.model.layers import attention_fn, dropout_seed, shared_dropout
from featurecache.model.pairformer import ROWWISE, Pairformer, PairformerBlock, run_blocks

# torch >= 2.13 renamed the tensor collectives; the GPU machine's torch 2.11 has the old names.
_all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_into = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# The triangle products, x = einsum(forward, a, b), and their gradients for a and b.
_PRODUCTS = {
    # x_ij = sum_k a_ik b_jk: a local rows, b gathered rows
    "outgoing": ("bikc,bjkc->bijc", "bijc,bjkc->bikc", "bijc,bikc->bjkc"),
    # x_ij = sum_k aT_ik b_kj with aT = a^T's local rows (a_ki), b gathered rows
    "incoming": ("bikc,bkjc->bijc", "bijc,bkjc->bikc", "bikc,bijc->bkjc"),
}


def group_size(group) -> int:
    return dist.get_world_size(group)


def group_rank(group) -> int:
    return dist.get_rank(group)


# --------------------------------------------------------------------------------------------
# Collectives with autograd
# --------------------------------------------------------------------------------------------


def _gather_dim(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Every rank's x concatenated along dim, in rank order."""
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((group_size(group) * front.shape[0], *front.shape[1:]))
    _all_gather_into(out, front, group=group)
    return out.movedim(0, dim)


def _reduce_scatter_dim(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """The sum over ranks of x, this rank's block along dim."""
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((front.shape[0] // group_size(group), *front.shape[1:]))
    _reduce_scatter_into(out, front, group=group)
    return out.movedim(0, dim)


def _own_block(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    size = x.shape[dim] // group_size(group)
    return x.narrow(dim, group_rank(group) * size, size)


class _GatherPartial(torch.autograd.Function):
    """All-gather along dim of a tensor each rank goes on to use in full for its own rows: the
    gradients the ranks compute are shares, so the backward sums them (reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _gather_dim(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_dim(grad, ctx.dim, ctx.group), None, None


class _Scatter(torch.autograd.Function):
    """Into the sharded region: this rank's block of a tensor every rank holds whole. Backward:
    the rows' gradients gathered, whole on every rank again."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _own_block(x, dim, group).contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _gather_dim(grad, ctx.dim, ctx.group), None, None


class _Gather(torch.autograd.Function):
    """Out of the sharded region: the blocks gathered into the whole tensor, which every rank
    then uses alike; so each rank's gradient is already the whole one and the backward keeps
    this rank's block."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _gather_dim(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _own_block(grad, ctx.dim, ctx.group).contiguous(), None, None


def _transpose_rows(x: torch.Tensor, group) -> torch.Tensor:
    """[B, n, L, C], rows of z -> [B, n, L, C], the same rows of z^T, by one all-to-all."""
    size = group_size(group)
    batch, n, length, channels = x.shape
    send = x.movedim(2, 0).contiguous()  # [L (block q goes to rank q), B, n, C]
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    # block r holds z[rows of r, my columns] as [my columns, B, rows of r, C]
    received = received.view(size, n, batch, n, channels)
    return received.permute(2, 1, 0, 3, 4).reshape(batch, n, length, channels)


class _TransposeRows(torch.autograd.Function):
    """The all-to-all transpose; a transpose is its own inverse and adjoint, so is the backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _transpose_rows(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _transpose_rows(grad, ctx.group), None


class _GatheredProduct(torch.autograd.Function):
    """x = einsum(a, all-gather(b)) for one triangle direction. Only the local a and b are kept
    for backward, which gathers b again: the gathered b is as large as a whole-pair tensor, and
    keeping it would undo the sharding's saving."""

    @staticmethod
    def forward(ctx, a, b, direction, group):
        ctx.direction, ctx.group = direction, group
        ctx.save_for_backward(a, b)
        return torch.einsum(_PRODUCTS[direction][0], a, _gather_dim(b, 1, group))

    @staticmethod
    def backward(ctx, dx):
        a, b = ctx.saved_tensors
        _, grad_a, grad_b = _PRODUCTS[ctx.direction]
        b_full = _gather_dim(b, 1, ctx.group)
        dx = dx.to(a.dtype)
        da = torch.einsum(grad_a, dx, b_full)
        db = _reduce_scatter_dim(torch.einsum(grad_b, dx if ctx.direction == "outgoing" else a,
                                              a if ctx.direction == "outgoing" else dx), 1, ctx.group)
        return da, db, None, None


def gather_partial(x, dim, group):
    return _GatherPartial.apply(x, dim, group)


def scatter(x, dim, group):
    return _Scatter.apply(x, dim, group)


def gather(x, dim, group):
    return _Gather.apply(x, dim, group)


def transpose_rows(x, group):
    return _TransposeRows.apply(x, group)


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
    weight = torch.cat([module.linear_a_p.weight, module.linear_a_g.weight, module.linear_b_p.weight,
                        module.linear_b_g.weight, module.linear_g.weight])
    proj = layernorm_linear(z, module.norm_in.weight, module.norm_in.bias, weight, None, module.norm_in.eps)
    a_p, a_g, b_p, b_g, g = proj.split([hidden] * 4 + [z.shape[-1]], dim=-1)
    keep = mask.unsqueeze(-1).to(proj.dtype)
    a = torch.sigmoid(a_g) * a_p * keep
    b = torch.sigmoid(b_g) * b_p * keep
    if module.direction == "incoming":
        a = transpose_rows(a, group)
    x = _GatheredProduct.apply(a.contiguous(), b.contiguous(), module.direction, group)
    out = layernorm_linear(x, module.norm_out.weight, module.norm_out.bias, module.linear_z.weight, None,
                           module.norm_out.eps)
    return torch.sigmoid(g) * out


def triangle_attention(module: nn.Module, z: torch.Tensor, mask: torch.Tensor, kernels: str, group) -> torch.Tensor:
    """A TriangleAttention's starting-node update of this rank's rows z [B, n, L, C]: rows i,
    queries j, keys k, the bias b_jk of every row gathered. The ending node is this on z^T."""
    heads, dim = module.num_heads, module.head_dim
    inner = heads * dim
    packed = module.proj(z)  # [B, n, L, >= 4 * inner + heads], one split as in the unsharded op
    *qkvg, bias, _ = packed.split([inner] * 4 + [heads, packed.shape[-1] - 4 * inner - heads], dim=-1)
    q, k, v, gate = (t.unflatten(-1, (heads, dim)) for t in qkvg)
    bias = gather_partial(bias.contiguous(), 1, group)  # [B, L, L, H]
    bias = bias.permute(0, 3, 1, 2).unsqueeze(1).contiguous()
    out = attention_fn(kernels)(q, k, v, bias=bias, mask=mask.contiguous())
    return module.linear_out((torch.sigmoid(gate) * out).flatten(-2))


def single_attention(module: nn.Module, s: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor,
                     group) -> torch.Tensor:
    """AttentionPairBias for this rank's query rows s [B, n, C_s] with their own bias rows from
    z [B, n, L, C_z]; keys and values of every row gathered. token_mask [B, L] (all keys).

    The queries are fewer than the keys, which EvoAttention does not take; this attention is
    O(L^2) against the triangle ops' O(L^3), so it runs the PyTorch reference on both paths."""
    heads, dim = module.num_heads, module.head_dim
    inner = heads * dim
    q, k, v, gate = (t.unflatten(-1, (heads, dim)).unsqueeze(1) for t in module.proj(s).split(inner, dim=-1))
    k, v = gather_partial(torch.cat([k, v], dim=-1), 2, group).split(dim, dim=-1)
    bias = module.pair_bias(z).permute(0, 3, 1, 2).unsqueeze(1)  # [B, 1, H, n, L]
    out = evo_attention_reference(q, k, v, bias=bias, mask=token_mask.unsqueeze(1))
    out = (torch.sigmoid(gate) * out).squeeze(1)
    return module.linear_out(out.flatten(-2))


def block_forward(block: PairformerBlock, group, s: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor,
                  rows_mask: torch.Tensor, columns_mask: torch.Tensor,
                  seed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One PairformerBlock on this rank's rows: s [B, n, C_s], z [B, n, L, C_z]; rows_mask and
    columns_mask [B, n, L] are the pair mask's rows and its transpose's rows.

    Dropout as PairStack.updates draws it: a mask is a function of (seed, site, indices), and a
    rowwise mask does not depend on the row, so every rank draws the same one. The ending node's
    columnwise mask is the rowwise one of z^T, applied before the transpose back."""
    pair = block.pair
    kernels = pair.tri_mul_out.kernels
    rate = pair.dropout if pair.training else 0.0

    def dropped(update, site):
        return shared_dropout(update, rate, seed, site, ROWWISE)

    z, z_low = pair.residual(z, dropped(triangle_multiplication(pair.tri_mul_out, z, rows_mask, group), 0))
    z, z_low = pair.residual(z, dropped(triangle_multiplication(pair.tri_mul_in, z_low, rows_mask, group), 1))
    z, z_low = pair.residual(z, dropped(triangle_attention(pair.tri_att_start, z_low, rows_mask, kernels, group), 2))
    ending = triangle_attention(pair.tri_att_end, transpose_rows(z_low, group), columns_mask, kernels, group)
    z, z_low = pair.residual(z, transpose_rows(dropped(ending, 3), group))
    z, z_low = pair.residual(z, pair.transition(z_low))
    s = s + single_attention(block.attention, s, z_low, token_mask, group)
    s = s + block.transition(s)
    return s, z


class ShardedPairformer(nn.Module):
    """A Pairformer run with its pair and single representations split by rows over `group`.

    Takes and returns whole s [B, L, C_s] and z [B, L, L, C_z], the same on every rank, as
    Pairformer does; in between each rank holds L/P rows. Its `blocks` are the Pairformer's, so
    its state_dict is the Pairformer's. After backward, call `reduce_gradients`.
    """

    def __init__(self, pairformer: Pairformer, group) -> None:
        super().__init__()
        self.blocks = pairformer.blocks
        self.checkpoint_blocks = pairformer.checkpoint_blocks
        self.dropout = pairformer.dropout
        self.group = group

    def forward(self, s: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor, pair_mask: torch.Tensor,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """As Pairformer.forward; `generator` draws the dropout seed, the same on every rank
        (the ranks of a group run the same step with the same generators)."""
        group, shards = self.group, group_size(self.group)
        length = z.shape[1]
        pad = -length % shards
        if pad:  # padded tokens are masked out of every update, as a collated batch's padding is
            s, z = F.pad(s, (0, 0, 0, pad)), F.pad(z, (0, 0, 0, pad, 0, pad))
            token_mask, pair_mask = F.pad(token_mask, (0, pad)), F.pad(pair_mask, (0, pad, 0, pad))
        rows = _own_block(pair_mask, 1, group).contiguous()
        columns = _own_block(pair_mask, 2, group).transpose(1, 2).contiguous()
        seed = dropout_seed(generator, z.device) if self.training and self.dropout > 0 else None
        blocks = [functools.partial(block_forward, block, group) for block in self.blocks]
        s, z = run_blocks(blocks, self.checkpoint_blocks and self.training, scatter(s, 1, group),
                          scatter(z, 1, group), masks=(token_mask, rows, columns), seed=seed)
        s, z = gather(s, 1, group), gather(z, 1, group)
        if pad:
            s, z = s[:, :length], z[:, :length, :length]
        return s, z

    def reduce_gradients(self) -> None:
        """Sum the blocks' parameter gradients over the group (each rank holds its rows' share),
        as one all-reduce."""
        grads = [p.grad for p in self.blocks.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        for grad, reduced in zip(grads, flat.split([g.numel() for g in grads])):
            grad.copy_(reduced.view_as(grad))


def shard_pairformer(model: nn.Module, group) -> nn.Module:
    """Replace `model.pairformer` (AF3Model, AF3Trunk) by its ShardedPairformer over `group`, in place."""
    if not isinstance(model.pairformer, ShardedPairformer):
        model.pairformer = ShardedPairformer(model.pairformer, group)
    return model
