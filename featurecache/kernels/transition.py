"""AF3 Transition (Algorithm 11) as one fused MLP: LayerNorm -> two projections to n*C -> SwiGLU ->
projection back to C.

The forward walks the hidden dimension in chunks of BLOCK_H, keeping a, b and silu(a) * b for one
chunk in registers and accumulating the output projection: the [rows, n*C] hidden never touches
memory, and only x and two floats a row are saved. The backward recomputes the chunks (at L=384,
C=128, n=4 in bf16 each saved [rows, 4C] tensor would be 144 MiB): one kernel over row tiles
produces dx and the LayerNorm parameter gradients. The weight gradients follow the strategy
named by WEIGHT_GRADS in configs/fused_ops.json:
- "recompute": a second kernel over (hidden chunk, row split) recomputes the chunks and
  accumulates the three weight gradients in registers; nothing [rows, n*C] is written.
- "matmul": the dx kernel also writes [d_a | d_b], the hidden and LN(x) (460 MiB of transient
  memory at the size above), and cuBLAS forms the weight gradients: large products run at
  cuBLAS's speed instead of the small tiles the recompute kernel can hold in registers
  (figures: benchmarks/NOTES-fused_ops.md).
"""

from __future__ import annotations

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
    store_swiglu_grads,
    swiglu_chunk,
    swiglu_chunk_bwd,
    swiglu_chunk_input_grad,
    swiglu_chunk_weights,
)
from featurecache.kernels.reference import transition_reference

_OP = "transition"

# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _transition_fwd_kernel(
    X, NORM_W, NORM_B, WA, WB, WO, Y, MEAN, RSTD,
    n_rows, n_ch, n_hidden, eps,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    rows, row_mask = row_block(pid, BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_ch
    tile_mask = row_mask[:, None] & col_mask[None, :]

    x = tl.load(X + rows[:, None] * n_ch + cols[None, :], mask=tile_mask, other=0.0)
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols, col_mask)
    xn, _, mean, rstd = layernorm_prologue(x, norm_w, norm_b, col_mask, n_ch, eps, PRECISION)

    acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for h_start in range(0, n_hidden, BLOCK_H):
        hids = h_start + tl.arange(0, BLOCK_H)
        w_mask = (hids < n_hidden)[:, None] & col_mask[None, :]
        wa, wb, wo = swiglu_chunk_weights(WA, WB, WO, hids, cols, w_mask, n_ch, n_hidden, x.dtype, PRECISION)
        acc = mma(swiglu_chunk(xn, wa, wb, zeros_h, PRECISION), wo, acc, PRECISION)
    tl.store(Y + rows[:, None] * n_ch + cols[None, :], cast(acc, Y.dtype.element_ty, PRECISION),
             mask=tile_mask)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _transition_bwd_dx_kernel(
    X, DY, NORM_W, NORM_B, WA, WB, WO, MEAN, RSTD, DX, DNORM_W_PART, DNORM_B_PART,
    D_AB, HIDDEN, XN,
    n_rows, n_ch, n_hidden,
    STORE_FOR_WEIGHTS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    rows, row_mask = row_block(pid, BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_ch
    tile_mask = row_mask[:, None] & col_mask[None, :]

    x = tl.load(X + rows[:, None] * n_ch + cols[None, :], mask=tile_mask, other=0.0)
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols, col_mask)
    xn, xhat, rstd = layernorm_prologue_saved(x, MEAN, RSTD, rows, row_mask, norm_w, norm_b, col_mask, PRECISION)
    dy = tl.load(DY + rows[:, None] * n_ch + cols[None, :], mask=tile_mask, other=0.0)
    if STORE_FOR_WEIGHTS:
        tl.store(XN + rows[:, None] * n_ch + cols[None, :], xn, mask=tile_mask)

    d_xn = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for h_start in range(0, n_hidden, BLOCK_H):
        hids = h_start + tl.arange(0, BLOCK_H)
        w_mask = (hids < n_hidden)[:, None] & col_mask[None, :]
        wa, wb, wo = swiglu_chunk_weights(WA, WB, WO, hids, cols, w_mask, n_ch, n_hidden, x.dtype, PRECISION)
        d_xn, hidden, d_a, d_b = swiglu_chunk_input_grad(xn, dy, wa, wb, wo, d_xn, zeros_h, PRECISION)
        if STORE_FOR_WEIGHTS:
            store_swiglu_grads(D_AB, HIDDEN, d_a, d_b, hidden, rows, row_mask, hids, n_hidden, PRECISION)

    dx = layernorm_backward(d_xn, xhat, rstd, norm_w, cols, col_mask, n_ch, DNORM_W_PART, DNORM_B_PART, pid)
    tl.store(DX + rows[:, None] * n_ch + cols[None, :], cast(dx, DX.dtype.element_ty, PRECISION),
             mask=tile_mask)


@triton.jit
def _transition_bwd_dw_kernel(
    X, DY, NORM_W, NORM_B, WA, WB, WO, MEAN, RSTD, DWA_PART, DWB_PART, DWO_PART,
    n_rows, n_ch, n_hidden, n_splits,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Partial weight gradients of one hidden chunk over row tiles pid_s, pid_s + n_splits, ..."""
    pid_h = tl.program_id(0)
    pid_s = tl.program_id(1)
    cols = tl.arange(0, BLOCK_C)
    hids = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    col_mask = cols < n_ch
    w_mask = (hids < n_hidden)[:, None] & col_mask[None, :]
    norm_w, norm_b = layernorm_params(NORM_W, NORM_B, cols, col_mask)
    wa, wb, wo = swiglu_chunk_weights(WA, WB, WO, hids, cols, w_mask, n_ch, n_hidden, X.dtype.element_ty, PRECISION)

    # accumulated as [BLOCK_H, BLOCK_C]; d_wo is stored transposed into WO's [C, n_hidden]
    d_wa = tl.zeros((BLOCK_H, BLOCK_C), dtype=tl.float32)
    d_wb = tl.zeros((BLOCK_H, BLOCK_C), dtype=tl.float32)
    d_wo = tl.zeros((BLOCK_H, BLOCK_C), dtype=tl.float32)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for tile in range(pid_s, tl.cdiv(n_rows, BLOCK_M), n_splits):
        rows, row_mask = row_block(tile, BLOCK_M, n_rows)
        tile_mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * n_ch + cols[None, :], mask=tile_mask, other=0.0)
        xn, _, _ = layernorm_prologue_saved(x, MEAN, RSTD, rows, row_mask, norm_w, norm_b, col_mask, PRECISION)
        # padded rows have dy = 0, hence zero d_a, d_b and no contribution to d_wo
        dy = tl.load(DY + rows[:, None] * n_ch + cols[None, :], mask=tile_mask, other=0.0)
        hidden, d_a, d_b = swiglu_chunk_bwd(xn, dy, wa, wb, wo, zeros_h, PRECISION)
        d_wa = mma(tl.trans(cast(d_a, x.dtype, PRECISION)), xn, d_wa, PRECISION)
        d_wb = mma(tl.trans(cast(d_b, x.dtype, PRECISION)), xn, d_wb, PRECISION)
        d_wo = mma(tl.trans(cast(hidden, x.dtype, PRECISION)), dy, d_wo, PRECISION)
    part = pid_s * n_hidden * n_ch
    tl.store(DWA_PART + part + hids[:, None] * n_ch + cols[None, :], d_wa, mask=w_mask)
    tl.store(DWB_PART + part + hids[:, None] * n_ch + cols[None, :], d_wb, mask=w_mask)
    tl.store(DWO_PART + part + cols[None, :] * n_hidden + hids[:, None], d_wo, mask=w_mask)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------

# Shared memory grows with the row tile [BLOCK_M, BLOCK_C] and the three weight tiles
# [BLOCK_H, BLOCK_C], times the element size, and a Hopper SM has 227 KB of it: the configured
# tiles would overflow it in fp32 at dim 384. These element budgets keep every kernel under
# ~200 KB for dims up to 1024 (compiled sizes: benchmarks/NOTES-fused_ops.md).
_ROW_TILE_ELEMENTS = {2: 16384, 4: 4096}
_WEIGHT_TILE_ELEMENTS = {2: 16384, 4: 2048}


def _tiles(kernel: str, n_ch: int, n_hidden: int, itemsize: int) -> tuple[dict[str, int], int, int, int]:
    block_c = runtime.block_for(n_ch)
    config, block_m = runtime.tile_config(_OP, kernel, block_c, _ROW_TILE_ELEMENTS.get(itemsize, 4096))
    block_h = min(config["BLOCK_H"], runtime.block_for(n_hidden),
                  max(16, _WEIGHT_TILE_ELEMENTS.get(itemsize, 2048) // block_c))
    return config, block_m, block_h, block_c


def transition_fwd(x2d, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps):
    """x2d [M, C] contiguous -> (y [M, C], mean [M], rstd [M])."""
    n_rows, n_ch = x2d.shape
    n_hidden = weight_a.shape[0]
    y = torch.empty_like(x2d)
    mean = torch.empty(n_rows, device=x2d.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    config, block_m, block_h, block_c = _tiles("fwd", n_ch, n_hidden, x2d.element_size())
    runtime.launch_fitting(
        _transition_fwd_kernel, (triton.cdiv(n_rows, block_m),),
        (x2d, norm_weight, norm_bias, weight_a, weight_b, weight_out, y, mean, rstd, n_rows, n_ch, n_hidden, eps),
        dict(PRECISION=runtime.dot_precision(x2d.dtype), BLOCK_M=block_m, BLOCK_H=block_h, BLOCK_C=block_c,
             **runtime.launch_options(config)),
        shrinkable=("BLOCK_H",))
    return y, mean, rstd


def transition_bwd(dy, x2d, norm_weight, norm_bias, weight_a, weight_b, weight_out, mean, rstd):
    """Gradients (dx, d_norm_weight, d_norm_bias, d_weight_a, d_weight_b, d_weight_out)."""
    n_rows, n_ch = x2d.shape
    n_hidden = weight_a.shape[0]
    precision = runtime.dot_precision(x2d.dtype)
    device = x2d.device

    # "matmul": the dx kernel also writes [d_a | d_b], the hidden and LN(x) (at 147,456 rows,
    # C=128, n=4 in bf16: 468 MiB) and cuBLAS forms the weight gradients; "recompute": a second
    # Triton kernel recomputes them and nothing [rows, n*C] is written.
    matmul_weights = runtime.weight_grads_by_matmul(_OP)
    if matmul_weights:
        d_ab = torch.empty((n_rows, 2 * n_hidden), device=device, dtype=x2d.dtype)
        hidden = torch.empty((n_rows, n_hidden), device=device, dtype=x2d.dtype)
        xn = torch.empty_like(x2d)
    else:
        d_ab = hidden = xn = x2d  # unused by the kernel

    config, block_m, block_h, block_c = _tiles("bwd_dx", n_ch, n_hidden, x2d.element_size())
    n_tiles = triton.cdiv(n_rows, block_m)
    dx = torch.empty_like(x2d)
    dnorm_w_part = torch.empty((n_tiles, n_ch), device=device, dtype=torch.float32)
    dnorm_b_part = torch.empty_like(dnorm_w_part)
    runtime.launch_fitting(
        _transition_bwd_dx_kernel, (n_tiles,),
        (x2d, dy, norm_weight, norm_bias, weight_a, weight_b, weight_out, mean, rstd,
         dx, dnorm_w_part, dnorm_b_part, d_ab, hidden, xn, n_rows, n_ch, n_hidden),
        dict(STORE_FOR_WEIGHTS=matmul_weights, PRECISION=precision, BLOCK_M=block_m, BLOCK_H=block_h,
             BLOCK_C=block_c, **runtime.launch_options(config)),
        shrinkable=("BLOCK_H",))

    d_norm_w = dnorm_w_part.sum(0).to(norm_weight.dtype)
    d_norm_b = dnorm_b_part.sum(0).to(norm_bias.dtype)
    if matmul_weights:
        d_wab = d_ab.t() @ xn  # [2 * n_hidden, C]
        d_wo = dy.t() @ hidden  # [C, n_hidden]
        return (dx, d_norm_w, d_norm_b, d_wab[:n_hidden].to(weight_a.dtype),
                d_wab[n_hidden:].to(weight_b.dtype), d_wo.to(weight_out.dtype))

    config, block_m, block_h, block_c = _tiles("bwd_dw", n_ch, n_hidden, x2d.element_size())
    n_hidden_tiles = triton.cdiv(n_hidden, block_h)
    n_splits = runtime.row_splits(triton.cdiv(n_rows, block_m), n_hidden_tiles, device)
    dwa_part = torch.empty((n_splits, n_hidden, n_ch), device=device, dtype=torch.float32)
    dwb_part = torch.empty_like(dwa_part)
    dwo_part = torch.empty((n_splits, n_ch, n_hidden), device=device, dtype=torch.float32)
    runtime.launch_fitting(  # BLOCK_H sets the grid and the partial sums here: not shrinkable
        _transition_bwd_dw_kernel, (n_hidden_tiles, n_splits),
        (x2d, dy, norm_weight, norm_bias, weight_a, weight_b, weight_out, mean, rstd,
         dwa_part, dwb_part, dwo_part, n_rows, n_ch, n_hidden, n_splits),
        dict(PRECISION=precision, BLOCK_M=block_m, BLOCK_H=block_h, BLOCK_C=block_c,
             **runtime.launch_options(config)))
    return (
        dx,
        d_norm_w,
        d_norm_b,
        dwa_part.sum(0).to(weight_a.dtype),
        dwb_part.sum(0).to(weight_b.dtype),
        dwo_part.sum(0).to(weight_out.dtype),
    )


# --------------------------------------------------------------------------------------------
# Autograd and the entry point
# --------------------------------------------------------------------------------------------


class _TransitionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps):
        x2d = x.reshape(-1, x.shape[-1]).contiguous()
        y, mean, rstd = transition_fwd(x2d, norm_weight, norm_bias, weight_a, weight_b,
                                       weight_out, eps)
        ctx.save_for_backward(x2d, norm_weight, norm_bias, weight_a, weight_b, weight_out,
                              mean, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2d = ctx.saved_tensors[0]
        grads = transition_bwd(dy.reshape(x2d.shape).contiguous(), *ctx.saved_tensors)
        return (grads[0].view(ctx.x_shape), *grads[1:], None)


# Under torch.compile the launchers run inside custom ops, so neither Dynamo nor Inductor traces
# into them (Dynamo would otherwise trace the launchers' host code into the graph).


@torch.library.custom_op("featurecache::transition_fwd", mutates_args=())
def _transition_fwd_op(x: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor,
                       weight_a: torch.Tensor, weight_b: torch.Tensor, weight_out: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, mean, rstd = transition_fwd(x.reshape(-1, x.shape[-1]).contiguous(), norm_weight, norm_bias,
                                   weight_a, weight_b, weight_out, eps)
    return y.view(x.shape), mean, rstd


@_transition_fwd_op.register_fake
def _(x, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps):
    stats = x.new_empty(x.numel() // x.shape[-1], dtype=torch.float32)
    return torch.empty_like(x, memory_format=torch.contiguous_format), stats, torch.empty_like(stats)


@torch.library.custom_op("featurecache::transition_bwd", mutates_args=())
def _transition_bwd_op(dy: torch.Tensor, x: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor,
                       weight_a: torch.Tensor, weight_b: torch.Tensor, weight_out: torch.Tensor,
                       mean: torch.Tensor, rstd: torch.Tensor) -> list[torch.Tensor]:
    x2d = x.reshape(-1, x.shape[-1]).contiguous()
    grads = transition_bwd(dy.reshape(x2d.shape).contiguous(), x2d, norm_weight, norm_bias, weight_a, weight_b,
                           weight_out, mean, rstd)
    return list(runtime.unaliased((grads[0].view(x.shape), *grads[1:])))


@_transition_bwd_op.register_fake
def _(dy, x, norm_weight, norm_bias, weight_a, weight_b, weight_out, mean, rstd):
    return [torch.empty_like(t, memory_format=torch.contiguous_format)
            for t in (x, norm_weight, norm_bias, weight_a, weight_b, weight_out)]


def _transition_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[:6], *output[1:])


def _transition_backward(ctx, dy, _dmean, _drstd):
    return (*_transition_bwd_op(dy, *ctx.saved_tensors), None)


_transition_fwd_op.register_autograd(_transition_backward, setup_context=_transition_setup)


def transition(x, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps=1e-5):
    """Triton Transition; same signature and numerics as transition_reference."""
    runtime.check_triton_inputs(_OP, x)
    x = runtime.autocast_input(x)
    runtime.max_channels_check(_OP, "dim", x.shape[-1])
    if x.is_cuda and x.element_size() > 2 and x.shape[-1] > 512:
        raise ValueError(f"{_OP}: dim={x.shape[-1]} in {x.dtype} needs more shared memory than a GPU has; "
                         f"pass bf16/fp16 activations (autocast) or use kernels='torch'")
    if weight_a.shape[1] != x.shape[-1] or weight_out.shape != weight_a.shape[::-1]:
        raise ValueError(
            f"{_OP}: x has {x.shape[-1]} channels but weight_a is {tuple(weight_a.shape)} and "
            f"weight_out is {tuple(weight_out.shape)}"
        )
    if x.numel() == 0:
        # no rows: nothing to launch; the result stays connected to the graph for autograd
        return transition_reference(x, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps)
    weight_a, weight_b, weight_out = runtime.weights_like(x, weight_a, weight_b, weight_out)
    if torch.compiler.is_compiling():
        return _transition_fwd_op(x, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps)[0]
    return _TransitionFunction.apply(x, norm_weight, norm_bias, weight_a, weight_b, weight_out,
                                     eps)


# --------------------------------------------------------------------------------------------
# Module
# --------------------------------------------------------------------------------------------


class Transition(nn.Module):
    """AF3 Transition: linear_out(silu(linear_a(norm(x))) * linear_b(norm(x))).

    kernels="triton" runs the fused kernels; kernels="torch" runs the PyTorch reference. Both
    hold identical parameters, so a state_dict moves between them.
    """

    @runtime.accepts_impl_keyword
    def __init__(self, dim: int, expansion: int = 4, eps: float = 1e-5, kernels: str = "triton"):
        super().__init__()
        self.kernels = runtime.check_kernels(kernels)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.linear_a = nn.Linear(dim, expansion * dim, bias=False)
        self.linear_b = nn.Linear(dim, expansion * dim, bias=False)
        self.linear_out = nn.Linear(expansion * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fn = transition if self.kernels == "triton" else transition_reference
        return fn(x, self.norm.weight, self.norm.bias, self.linear_a.weight, self.linear_b.weight,
                  self.linear_out.weight, self.norm.eps)
