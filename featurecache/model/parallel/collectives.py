"""Collectives with autograd for the sharded pair (featurecache.model.parallel.sharding), over a
torch.distributed process group of P ranks, each holding one block of rows.

Each forward has its adjoint as backward: an all-gather whose result every rank uses for its
own rows (`gather_partial`) sums the ranks' gradient shares back (reduce-scatter); the way into
and out of the sharded region (`scatter`, `gather`) moves between a tensor every rank holds whole
and its row blocks; the all-to-all transpose (`transpose_rows`) is its own inverse and adjoint.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# torch >= 2.13 renamed the tensor collectives; the GPU machine's torch 2.11 has the old names.
_all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_into = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# The triangle products x = einsum(product, a, b) and their gradients da = einsum(grad_a, dx, b),
# db = einsum(grad_b, dx, a), per direction: (product, grad_a, grad_b).
_PRODUCTS = {
    # x_ij = sum_k a_ik b_jk: a local rows, b gathered rows
    "outgoing": ("bikc,bjkc->bijc", "bijc,bjkc->bikc", "bijc,bikc->bjkc"),
    # x_ij = sum_k aT_ik b_kj with aT = a^T's local rows (a_ki), b gathered rows
    "incoming": ("bikc,bkjc->bijc", "bijc,bkjc->bikc", "bijc,bikc->bkjc"),
}


def group_size(group) -> int:
    return dist.get_world_size(group)


def group_rank(group) -> int:
    return dist.get_rank(group)


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


def own_block(x: torch.Tensor, dim: int, group) -> torch.Tensor:
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
        return own_block(x, dim, group).contiguous()

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
        return own_block(grad, ctx.dim, ctx.group).contiguous(), None, None


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


class GatheredProduct(torch.autograd.Function):
    """x = einsum(a, all-gather(b)) for one triangle direction. Only the local a and b are kept
    for backward, which gathers b again: the gathered b is as large as a whole-pair tensor, and
    keeping it would undo the sharding's saving."""

    @staticmethod
    def forward(ctx, a, b, direction, group):
        """a, b: [B, n, L, c], this rank's n rows of the projections (channels last). Returns x
        [B, n, L, c], this rank's rows of the triangle product."""
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
        db = _reduce_scatter_dim(torch.einsum(grad_b, dx, a), 1, ctx.group)
        return da, db, None, None


def gather_partial(x, dim, group):
    return _GatherPartial.apply(x, dim, group)


def scatter(x, dim, group):
    return _Scatter.apply(x, dim, group)


def gather(x, dim, group):
    return _Gather.apply(x, dim, group)


def transpose_rows(x, group):
    return _TransposeRows.apply(x, group)
