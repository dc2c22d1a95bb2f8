"""LayerNorm fused into the prologue of a Linear: y = linear(layer_norm(x)).

The normalized input never goes to memory in the forward: each [BLOCK_M, K] tile is normalized
in registers and fed to tl.dot, and only the per-row mean and rstd (8 bytes a row) are saved.
The backward's dx kernel recomputes it from x. For the weight gradient there are two strategies
(WEIGHT_GRADS in configs/fused_ops.json): "matmul", where the dx kernel also writes LN(x) (a
transient [rows, K] buffer, 36 MiB at 147,456 rows x 128 in bf16) and cuBLAS forms dy^T @ LN(x),
and "recompute", a Triton kernel that re-normalizes x for every output tile and writes nothing
[rows, K]. "recompute" re-reads x once per BLOCK_N outputs, so it loses where outputs are wide
(the sweep's figures: benchmarks/NOTES-fused_ops.md).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import nn

from featurecache.kernels import runtime
from featurecache.kernels.primitives import (
    cast,
    layernorm_backward,
    layernorm_params,
    layernorm_prologue,
    layernorm_prologue_saved,
    mma,
    row_block,
)
from featurecache.kernels.reference import layernorm_linear_reference

_OP = "layernorm_linear"

# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _layernorm_linear_fwd_kernel(
    X, NORM_W, NORM_B, W, BIAS, Y, MEAN, RSTD,
    n_rows, n_in, n_out, stride_y, eps,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    N_TILES: tl.constexpr,
):
    """Programs own a row tile and N_TILES output tiles: x is loaded and normalized once per
    program, so with few programs per row tile x is read from memory about once, not once per
    BLOCK_N outputs."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows, row_mask = row_block(pid_m, BLOCK_M, n_rows)
    cols_k = tl.arange(0, BLOCK_K)
    k_mask = cols_k < n_in

    # x [BLOCK_M, BLOCK_K]
    x = tl.load(X + rows[:, None] * n_in + cols_k[None, :],
                mask=row_mask[:, None] & k_mask[None, :], other=0.0)
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols_k, k_mask)
    xn, _, mean, rstd = layernorm_prologue(x, norm_w, norm_b, k_mask, n_in, eps, PRECISION)

    first_tile = pid_n * N_TILES
    last_tile = tl.minimum(first_tile + N_TILES, tl.cdiv(n_out, BLOCK_N))
    for tile in range(first_tile, last_tile):
        cols_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = cols_n < n_out
        # W [BLOCK_N, BLOCK_K]
        w = cast(tl.load(W + cols_n[:, None] * n_in + cols_k[None, :],
                    mask=n_mask[:, None] & k_mask[None, :], other=0.0), x.dtype, PRECISION)
        acc = mma(xn, tl.trans(w), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), PRECISION)
        if HAS_BIAS:
            acc += tl.load(BIAS + cols_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + rows[:, None] * stride_y + cols_n[None, :], cast(acc, Y.dtype.element_ty, PRECISION),
                 mask=row_mask[:, None] & n_mask[None, :])
    if pid_n == 0:
        tl.store(MEAN + rows, mean, mask=row_mask)
        tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _layernorm_linear_bwd_dx_kernel(
    X, DY, NORM_W, NORM_B, W, MEAN, RSTD, DX, DNORM_W_PART, DNORM_B_PART, XN,
    n_rows, n_in, n_out, stride_dy,
    STORE_XN: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """dx and per-program partial LayerNorm weight/bias gradients; one program per row tile.
    With STORE_XN, also LN(x) (affine, in dy's dtype) for a cuBLAS weight gradient."""
    pid_m = tl.program_id(0)
    rows, row_mask = row_block(pid_m, BLOCK_M, n_rows)
    cols_k = tl.arange(0, BLOCK_K)
    k_mask = cols_k < n_in

    x = tl.load(X + rows[:, None] * n_in + cols_k[None, :],
                mask=row_mask[:, None] & k_mask[None, :], other=0.0)
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols_k, k_mask)
    xn, xhat, rstd = layernorm_prologue_saved(x, MEAN, RSTD, rows, row_mask, norm_w, norm_b, k_mask, PRECISION)

    # d(normalized input) = dy @ W, accumulated over output-feature tiles
    d_xn = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for n_start in range(0, n_out, BLOCK_N):
        cols_n = n_start + tl.arange(0, BLOCK_N)
        n_mask = cols_n < n_out
        dy = tl.load(DY + rows[:, None] * stride_dy + cols_n[None, :],
                     mask=row_mask[:, None] & n_mask[None, :], other=0.0)
        w = cast(tl.load(W + cols_n[:, None] * n_in + cols_k[None, :],
                    mask=n_mask[:, None] & k_mask[None, :], other=0.0), dy.dtype, PRECISION)
        d_xn = mma(dy, w, d_xn, PRECISION)

    if STORE_XN:
        tl.store(XN + rows[:, None] * n_in + cols_k[None, :], xn, mask=row_mask[:, None] & k_mask[None, :])
    dx = layernorm_backward(d_xn, xhat, rstd, norm_w, cols_k, k_mask, n_in, DNORM_W_PART, DNORM_B_PART, pid_m)
    tl.store(DX + rows[:, None] * n_in + cols_k[None, :], cast(dx, DX.dtype.element_ty, PRECISION),
             mask=row_mask[:, None] & k_mask[None, :])


@triton.jit
def _layernorm_linear_bwd_dw_kernel(
    X, DY, NORM_W, NORM_B, MEAN, RSTD, DW_PART, DBIAS_PART,
    n_rows, n_in, n_out, stride_dy, n_splits,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Partial dW = dy^T @ xn over the row tiles pid_s, pid_s + n_splits, ...; xn recomputed."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    cols_k = tl.arange(0, BLOCK_K)
    cols_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_mask = cols_k < n_in
    n_mask = cols_n < n_out
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols_k, k_mask)

    dw = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    dbias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for tile in range(pid_s, tl.cdiv(n_rows, BLOCK_M), n_splits):
        rows, row_mask = row_block(tile, BLOCK_M, n_rows)
        x = tl.load(X + rows[:, None] * n_in + cols_k[None, :],
                    mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        xn, _, _ = layernorm_prologue_saved(x, MEAN, RSTD, rows, row_mask, norm_w, norm_b, k_mask, PRECISION)
        # padded rows give xn = norm_b but dy = 0 there, so they add nothing
        dy = tl.load(DY + rows[:, None] * stride_dy + cols_n[None, :],
                     mask=row_mask[:, None] & n_mask[None, :], other=0.0)
        dw = mma(tl.trans(dy), xn, dw, PRECISION)
        dbias += tl.sum(dy.to(tl.float32), axis=0)
    part = pid_s * n_out * n_in
    tl.store(DW_PART + part + cols_n[:, None] * n_in + cols_k[None, :], dw,
             mask=n_mask[:, None] & k_mask[None, :])
    tl.store(DBIAS_PART + pid_s * n_out + cols_n, dbias, mask=n_mask)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


def layernorm_linear_fwd(x2d, norm_weight, norm_bias, weight, bias, eps, aligned_rows=False):
    """x2d [M, K] contiguous -> (y [M, N], mean [M], rstd [M]).

    With aligned_rows, y's rows start every multiple of 16 elements (a view of a wider buffer):
    kernels that read column slices of y as strided q/k/v (EvoAttention) then get 16-divisible
    strides, which Triton needs to vectorize their loads.
    """
    n_rows, n_in = x2d.shape
    n_out = weight.shape[0]
    stride_y = -(-n_out // 16) * 16 if aligned_rows else n_out
    y = torch.empty((n_rows, stride_y), device=x2d.device, dtype=x2d.dtype)[:, :n_out]
    mean = torch.empty(n_rows, device=x2d.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    block_k = runtime.block_for(n_in)
    config, block_m = runtime.tile_config(_OP, "fwd", block_k)
    block_n = min(config["BLOCK_N"], runtime.block_for(n_out))
    n_tiles = min(config.get("N_TILES", 1), triton.cdiv(n_out, block_n))
    grid = (triton.cdiv(n_rows, block_m), triton.cdiv(triton.cdiv(n_out, block_n), n_tiles))
    _layernorm_linear_fwd_kernel[grid](
        x2d, norm_weight, norm_bias, weight, bias if bias is not None else weight, y, mean, rstd,
        n_rows, n_in, n_out, stride_y, eps,
        HAS_BIAS=bias is not None,
        PRECISION=runtime.dot_precision(x2d.dtype),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, N_TILES=n_tiles,
        **runtime.launch_options(config),
    )
    return y, mean, rstd


def layernorm_linear_bwd(dy, x2d, norm_weight, norm_bias, weight, mean, rstd, has_bias):
    """Gradients (dx, d_norm_weight, d_norm_bias, d_weight, d_bias or None).

    dy [M, N] may have any row stride (a view of a wider, aligned gradient buffer) if its
    columns are contiguous."""
    n_rows, n_in = x2d.shape
    n_out = weight.shape[0]
    precision = runtime.dot_precision(x2d.dtype)
    block_k = runtime.block_for(n_in)

    matmul_weights = runtime.weight_grads_by_matmul(_OP)
    xn = torch.empty_like(x2d) if matmul_weights else x2d  # x2d: a placeholder the kernel never writes

    config, block_m = runtime.tile_config(_OP, "bwd_dx", block_k)
    n_tiles = triton.cdiv(n_rows, block_m)
    dx = torch.empty_like(x2d)
    dnorm_w_part = torch.empty((n_tiles, n_in), device=x2d.device, dtype=torch.float32)
    dnorm_b_part = torch.empty_like(dnorm_w_part)
    _layernorm_linear_bwd_dx_kernel[(n_tiles,)](
        x2d, dy, norm_weight, norm_bias, weight, mean, rstd, dx, dnorm_w_part, dnorm_b_part, xn,
        n_rows, n_in, n_out, dy.stride(0),
        STORE_XN=matmul_weights,
        PRECISION=precision,
        BLOCK_M=block_m, BLOCK_N=min(config["BLOCK_N"], runtime.block_for(n_out)), BLOCK_K=block_k,
        **runtime.launch_options(config),
    )
    d_norm_w = dnorm_w_part.sum(0).to(norm_weight.dtype)
    d_norm_b = dnorm_b_part.sum(0).to(norm_bias.dtype)
    if matmul_weights:
        # bf16 operands, fp32 accumulation inside cuBLAS: nn.Linear's weight gradient under autocast
        d_weight = (dy.t() @ xn).to(weight.dtype)
        return dx, d_norm_w, d_norm_b, d_weight, dy.sum(0, dtype=torch.float32) if has_bias else None

    config, block_m = runtime.tile_config(_OP, "bwd_dw", block_k)
    block_n = min(config["BLOCK_N"], runtime.block_for(n_out))
    n_col_tiles = triton.cdiv(n_out, block_n)
    n_splits = runtime.row_splits(triton.cdiv(n_rows, block_m), n_col_tiles, x2d.device)
    dw_part = torch.empty((n_splits, n_out, n_in), device=x2d.device, dtype=torch.float32)
    dbias_part = torch.empty((n_splits, n_out), device=x2d.device, dtype=torch.float32)
    _layernorm_linear_bwd_dw_kernel[(n_col_tiles, n_splits)](
        x2d, dy, norm_weight, norm_bias, mean, rstd, dw_part, dbias_part,
        n_rows, n_in, n_out, dy.stride(0), n_splits,
        PRECISION=precision,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        **runtime.launch_options(config),
    )
    return dx, d_norm_w, d_norm_b, dw_part.sum(0).to(weight.dtype), dbias_part.sum(0) if has_bias else None


# --------------------------------------------------------------------------------------------
# Autograd and the entry point
# --------------------------------------------------------------------------------------------


class _LayerNormLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, weight, bias, eps, aligned_rows):
        x2d = x.reshape(-1, x.shape[-1]).contiguous()
        y, mean, rstd = layernorm_linear_fwd(x2d, norm_weight, norm_bias, weight, bias, eps, aligned_rows)
        ctx.save_for_backward(x2d, norm_weight, norm_bias, weight, mean, rstd)
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.x_shape = x.shape
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2d, norm_weight, norm_bias, weight, mean, rstd = ctx.saved_tensors
        # A gradient written into an aligned buffer (gated_pair_attention) is read in place.
        dy2d = dy.reshape(-1, weight.shape[0])
        if dy2d.stride(1) != 1:
            dy2d = dy2d.contiguous()
        dx, dnw, dnb, dw, dbias = layernorm_linear_bwd(
            dy2d, x2d, norm_weight, norm_bias, weight, mean, rstd, ctx.bias_dtype is not None
        )
        if dbias is not None:
            dbias = dbias.to(ctx.bias_dtype)
        return dx.view(ctx.x_shape), dnw, dnb, dw, dbias, None, None


# Under torch.compile the launchers run inside custom ops, so neither Dynamo nor Inductor traces
# into them (Dynamo would otherwise trace the launchers' host code into the graph).


@torch.library.custom_op("featurecache::layernorm_linear_fwd", mutates_args=())
def _layernorm_linear_fwd_op(x: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor,
                             weight: torch.Tensor, bias: Optional[torch.Tensor],
                             eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, mean, rstd = layernorm_linear_fwd(x.reshape(-1, x.shape[-1]).contiguous(), norm_weight, norm_bias, weight,
                                         bias, eps)
    return y.view(*x.shape[:-1], weight.shape[0]), mean, rstd


@_layernorm_linear_fwd_op.register_fake
def _(x, norm_weight, norm_bias, weight, bias, eps):
    rows = x.numel() // x.shape[-1]
    stats = x.new_empty(rows, dtype=torch.float32)
    return x.new_empty((*x.shape[:-1], weight.shape[0])), stats, torch.empty_like(stats)


@torch.library.custom_op("featurecache::layernorm_linear_bwd", mutates_args=())
def _layernorm_linear_bwd_op(dy: torch.Tensor, x: torch.Tensor, norm_weight: torch.Tensor,
                             norm_bias: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                             rstd: torch.Tensor, has_bias: bool) -> list[torch.Tensor]:
    x2d = x.reshape(-1, x.shape[-1]).contiguous()
    dx, dnw, dnb, dw, dbias = layernorm_linear_bwd(dy.reshape(-1, weight.shape[0]).contiguous(), x2d,
                                                   norm_weight, norm_bias, weight, mean, rstd, has_bias)
    # Custom ops cannot return None: an empty tensor stands for "no bias".
    grads = (dx.view(x.shape), dnw, dnb, dw, dbias if dbias is not None else x.new_empty(0))
    return list(runtime.unaliased(grads))


@_layernorm_linear_bwd_op.register_fake
def _(dy, x, norm_weight, norm_bias, weight, mean, rstd, has_bias):
    dbias = weight.new_empty(weight.shape[0], dtype=torch.float32) if has_bias else x.new_empty(0)
    return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, norm_weight, norm_bias, weight)
            ] + [dbias]


def _layernorm_linear_setup(ctx, inputs, output) -> None:
    x, norm_weight, norm_bias, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, norm_weight, norm_bias, weight, mean, rstd)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _layernorm_linear_backward(ctx, dy, _dmean, _drstd):
    dx, dnw, dnb, dw, dbias = _layernorm_linear_bwd_op(dy, *ctx.saved_tensors, ctx.bias_dtype is not None)
    return dx, dnw, dnb, dw, None if ctx.bias_dtype is None else dbias.to(ctx.bias_dtype), None


_layernorm_linear_fwd_op.register_autograd(_layernorm_linear_backward, setup_context=_layernorm_linear_setup)


def layernorm_linear(x, norm_weight, norm_bias, weight, bias=None, eps=1e-5, aligned_rows=False):
    """Triton linear(layer_norm(x)); same numerics as layernorm_linear_reference.

    aligned_rows: return a view whose rows are 16-element aligned (see layernorm_linear_fwd)
    instead of a contiguous tensor."""
    runtime.check_triton_inputs(_OP, x)
    x = runtime.autocast_input(x)
    runtime.max_channels_check(_OP, "in_features", x.shape[-1])
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"{_OP}: x has {x.shape[-1]} features, weight expects {weight.shape[1]}")
    if x.numel() == 0:
        # no rows: nothing to launch; the result stays connected to the graph for autograd
        return layernorm_linear_reference(x, norm_weight, norm_bias, weight, bias, eps)
    (weight,) = runtime.weights_like(x, weight)
    if torch.compiler.is_compiling():
        # contiguous rows (aligned_rows serves the eager gated-attention kernels only)
        return _layernorm_linear_fwd_op(x, norm_weight, norm_bias, weight, bias, eps)[0]
    return _LayerNormLinearFunction.apply(x, norm_weight, norm_bias, weight, bias, eps, aligned_rows)


# --------------------------------------------------------------------------------------------
# Module
# --------------------------------------------------------------------------------------------


class LayerNormLinear(nn.Module):
    """linear(norm(x)) with parameters named as nn.LayerNorm `norm` and nn.Linear `linear`.

    kernels="triton" runs the fused kernels; kernels="torch" runs the PyTorch reference. Both
    hold identical parameters, so a state_dict moves between them.
    """

    @runtime.accepts_impl_keyword
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        eps: float = 1e-5,
        kernels: str = "triton",
        aligned_rows: bool = False,
    ) -> None:
        super().__init__()
        self.kernels = runtime.check_kernels(kernels)
        self.aligned_rows = aligned_rows
        self.norm = nn.LayerNorm(in_features, eps=eps)
        self.linear = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        args = (x, self.norm.weight, self.norm.bias, self.linear.weight, self.linear.bias, self.norm.eps)
        if self.kernels == "triton":
            return layernorm_linear(*args, aligned_rows=self.aligned_rows)
        return layernorm_linear_reference(*args)
