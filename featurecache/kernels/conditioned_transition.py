"""AF3's conditioned transition (Algorithm 25) with its adaptive LayerNorm (Algorithm 26), fused:

    x = sigmoid(scale) * LayerNorm(a) + shift          scale, shift = Linear(LN(s)), LinearNoBias(LN(s))
    y = sigmoid(gate) * W_out (swish(W_a x) * W_b x)    gate = Linear(s), bias -2 at init

Where the bytes are: a and y are [rows, C_a] (rows = 48 samples x tokens), and so are the three
s-derived tensors scale, shift and gate when s is per sample (the token transformer: s carries
the noise level); in the atom transformers s is [B, 1, A, C] and they are shared by the samples.
The s side (LN(s) and three [C_s -> C_a] products, one per s row, not per sample) stays with
PyTorch: it is a plain matmul on the smaller tensor. One kernel does the rest of the forward: it
reads a row tile of a, normalizes and modulates it in registers (reading scale and shift at the
tile's s rows), walks the 2*C_a hidden in chunks as transition.py does (the SwiGLU is formed in
registers, the [rows, n*C_a] hidden never touches memory), and gates the accumulated output with
sigmoid(gate) before the one store. It also stores the ungated output (one [rows, C_a] tensor)
and two floats a row, what the backward needs besides a.

The backward's kernel recomputes x and the hidden chunks and forms da and the gradients of
scale, shift and gate (per a row in a's dtype; summed in fp32 over the samples where s is shared),
and writes the operands of the weight gradients ([d_a | d_b], the hidden, x, d_out) for cuBLAS,
the "matmul" strategy of transition.py (benchmarks/NOTES-fused_ops.md: recomputing them in a
second Triton kernel was twice as slow on the H200).

Rows wider than FUSED_MAX_CHANNELS (c_token 768) do not fit registers whole: there a one-pass
AdaLN kernel (also the conditioned attention's AdaLN, `adaptive_layernorm`) writes x, and the
three products and the SwiGLU and gate stay with PyTorch/cuBLAS.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from featurecache.kernels import runtime
from featurecache.kernels.primitives import (
    cast,
    mma,
    row_block,
    store_swiglu_grads,
    swiglu_chunk,
    swiglu_chunk_input_grad,
    swiglu_chunk_weights,
)
from featurecache.kernels.reference import (
    adaln_conditioning,
    adaln_modulate,
    conditioned_transition_reference,
)

_OP = "conditioned_transition"

# The fused kernel holds whole rows of a (and the output accumulator) in registers; compiled for
# sm_90 at C = 768 (1024-wide tiles) its stack runs to 7-11 KB, so wider rows take the one-pass
# AdaLN kernel and cuBLAS products instead (benchmarks/NOTES-fused_ops.md).
FUSED_MAX_CHANNELS = 256

# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _s_rows(rows, n_tokens, n_samples, S_SHARED: tl.constexpr):
    """The rows of the s-derived tensors that rows of a [..., S, L, C] read: the same rows, or,
    when they are [..., 1, L, C] (shared by the S samples), the row of the same token."""
    if S_SHARED:
        return (rows // (n_samples * n_tokens)) * n_tokens + rows % n_tokens
    else:
        return rows


@triton.jit
def _normalized(a, col_mask, n_ch, eps):
    """LayerNorm without affine of a row tile (padded columns zero): (xhat fp32, mean, rstd)."""
    a32 = a.to(tl.float32)
    mean = tl.sum(a32, axis=1) / n_ch
    centered = tl.where(col_mask[None, :], a32 - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(centered * centered, axis=1) / n_ch + eps)
    return centered * rstd[:, None], mean, rstd


@triton.jit
def _adaln(a, SCALE, SHIFT, s_offsets, tile_mask, col_mask, n_ch, eps):
    """x = sigmoid(scale) * LayerNorm(a) + shift of a row tile, fp32 (padded columns: 0.5 * 0 + 0),
    with the LayerNorm's (mean, rstd)."""
    xhat, mean, rstd = _normalized(a, col_mask, n_ch, eps)
    scale = tl.load(SCALE + s_offsets, mask=tile_mask, other=0.0).to(tl.float32)
    shift = tl.load(SHIFT + s_offsets, mask=tile_mask, other=0.0).to(tl.float32)
    return tl.sigmoid(scale) * xhat + shift, mean, rstd


@triton.jit
def _conditioned_transition_fwd_kernel(
    A, SCALE, SHIFT, GATE, WA, WB, WO, Y, OUT, MEAN, RSTD,
    n_rows, n_ch, n_hidden, n_tokens, n_samples, eps,
    S_SHARED: tl.constexpr,
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
    offsets = rows[:, None] * n_ch + cols[None, :]
    s_offsets = _s_rows(rows, n_tokens, n_samples, S_SHARED)[:, None] * n_ch + cols[None, :]

    a = tl.load(A + offsets, mask=tile_mask, other=0.0)
    x, mean, rstd = _adaln(a, SCALE, SHIFT, s_offsets, tile_mask, col_mask, n_ch, eps)
    x = cast(x, a.dtype, PRECISION)

    acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for h_start in range(0, n_hidden, BLOCK_H):
        hids = h_start + tl.arange(0, BLOCK_H)
        w_mask = (hids < n_hidden)[:, None] & col_mask[None, :]
        wa, wb, wo = swiglu_chunk_weights(WA, WB, WO, hids, cols, w_mask, n_ch, n_hidden, a.dtype, PRECISION)
        acc = mma(swiglu_chunk(x, wa, wb, zeros_h, PRECISION), wo, acc, PRECISION)
    out = cast(acc, a.dtype, PRECISION)
    gate = tl.sigmoid(tl.load(GATE + s_offsets, mask=tile_mask, other=0.0).to(tl.float32))
    tl.store(OUT + offsets, out, mask=tile_mask)
    tl.store(Y + offsets, cast(gate * out.to(tl.float32), Y.dtype.element_ty, PRECISION), mask=tile_mask)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _conditioned_transition_bwd_kernel(
    A, DY, SCALE, SHIFT, GATE, WA, WB, WO, OUT, MEAN, RSTD,
    DA, DSCALE, DSHIFT, DGATE, D_AB, HIDDEN, X, D_OUT,
    n_rows, n_ch, n_hidden, n_tokens, n_samples,
    S_SHARED: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """da, and per a row (fp32) the gradients of the scale and gate logits and of the shift;
    writes [d_a | d_b], the hidden, x and d_out for the weight gradients."""
    pid = tl.program_id(0)
    rows, row_mask = row_block(pid, BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_ch
    tile_mask = row_mask[:, None] & col_mask[None, :]
    offsets = rows[:, None] * n_ch + cols[None, :]
    s_offsets = _s_rows(rows, n_tokens, n_samples, S_SHARED)[:, None] * n_ch + cols[None, :]

    a = tl.load(A + offsets, mask=tile_mask, other=0.0)
    xhat, _ = _normalized_saved(a, MEAN, RSTD, rows, row_mask, col_mask)
    scale = tl.sigmoid(tl.load(SCALE + s_offsets, mask=tile_mask, other=0.0).to(tl.float32))
    shift = tl.load(SHIFT + s_offsets, mask=tile_mask, other=0.0).to(tl.float32)
    x = cast(scale * xhat + shift, a.dtype, PRECISION)
    tl.store(X + offsets, x, mask=tile_mask)

    # the output gate: y = gate * out
    dy = tl.load(DY + offsets, mask=tile_mask, other=0.0).to(tl.float32)
    gate = tl.sigmoid(tl.load(GATE + s_offsets, mask=tile_mask, other=0.0).to(tl.float32))
    out = tl.load(OUT + offsets, mask=tile_mask, other=0.0).to(tl.float32)
    tl.store(DGATE + offsets, cast(dy * out * gate * (1.0 - gate), DGATE.dtype.element_ty, PRECISION), mask=tile_mask)
    d_out = cast(dy * gate, a.dtype, PRECISION)
    tl.store(D_OUT + offsets, d_out, mask=tile_mask)

    d_x = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    zeros_h = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for h_start in range(0, n_hidden, BLOCK_H):
        hids = h_start + tl.arange(0, BLOCK_H)
        w_mask = (hids < n_hidden)[:, None] & col_mask[None, :]
        wa, wb, wo = swiglu_chunk_weights(WA, WB, WO, hids, cols, w_mask, n_ch, n_hidden, a.dtype, PRECISION)
        d_x, hidden, d_a, d_b = swiglu_chunk_input_grad(x, d_out, wa, wb, wo, d_x, zeros_h, PRECISION)
        store_swiglu_grads(D_AB, HIDDEN, d_a, d_b, hidden, rows, row_mask, hids, n_hidden, PRECISION)

    # a and scale reloaded rather than held through the loop (registers)
    _adaln_backward(d_x, A, SCALE, MEAN, RSTD, DA, DSCALE, DSHIFT, rows, row_mask, col_mask, offsets, s_offsets,
                    tile_mask, n_ch, PRECISION)


@triton.jit
def _normalized_saved(a, MEAN, RSTD, rows, row_mask, col_mask):
    """_normalized from the saved statistics: (xhat fp32, rstd), bitwise the same xhat."""
    mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    return tl.where(col_mask[None, :], a.to(tl.float32) - mean[:, None], 0.0) * rstd[:, None], rstd


@triton.jit
def _adaln_backward(d_x, A, SCALE, MEAN, RSTD, DA, DSCALE, DSHIFT, rows, row_mask, col_mask, offsets, s_offsets,
                    tile_mask, n_ch, PRECISION: tl.constexpr):
    """Given d_x for x = sigmoid(scale) * xhat + shift, store da and, per a row, the
    gradients of the scale logits and of the shift. Padded columns have d_x = 0 and xhat = 0."""
    a = tl.load(A + offsets, mask=tile_mask, other=0.0)
    xhat, rstd = _normalized_saved(a, MEAN, RSTD, rows, row_mask, col_mask)
    scale = tl.sigmoid(tl.load(SCALE + s_offsets, mask=tile_mask, other=0.0).to(tl.float32))
    tl.store(DSHIFT + offsets, cast(d_x, DSHIFT.dtype.element_ty, PRECISION), mask=tile_mask)
    tl.store(DSCALE + offsets, cast(d_x * xhat * scale * (1.0 - scale), DSCALE.dtype.element_ty, PRECISION),
             mask=tile_mask)
    d_xhat = d_x * scale
    proj = tl.sum(d_xhat * xhat, axis=1) / n_ch
    mean_d = tl.sum(d_xhat, axis=1) / n_ch
    da = (d_xhat - xhat * proj[:, None] - mean_d[:, None]) * rstd[:, None]
    tl.store(DA + offsets, cast(da, DA.dtype.element_ty, PRECISION), mask=tile_mask)


@triton.jit
def _adaln_fwd_kernel(
    A, SCALE, SHIFT, X, MEAN, RSTD,
    n_rows, n_ch, n_tokens, n_samples, eps,
    S_SHARED: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """AdaLN alone, one pass: x = sigmoid(scale) * LayerNorm(a) + shift (rows too wide for the
    fused transition, and the conditioned attention's input)."""
    rows, row_mask = row_block(tl.program_id(0), BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_ch
    tile_mask = row_mask[:, None] & col_mask[None, :]
    offsets = rows[:, None] * n_ch + cols[None, :]
    s_offsets = _s_rows(rows, n_tokens, n_samples, S_SHARED)[:, None] * n_ch + cols[None, :]
    a = tl.load(A + offsets, mask=tile_mask, other=0.0)
    x, mean, rstd = _adaln(a, SCALE, SHIFT, s_offsets, tile_mask, col_mask, n_ch, eps)
    tl.store(X + offsets, cast(x, X.dtype.element_ty, PRECISION), mask=tile_mask)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _adaln_bwd_kernel(
    A, DX, SCALE, MEAN, RSTD, DA, DSCALE, DSHIFT,
    n_rows, n_ch, n_tokens, n_samples,
    S_SHARED: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    rows, row_mask = row_block(tl.program_id(0), BLOCK_M, n_rows)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < n_ch
    tile_mask = row_mask[:, None] & col_mask[None, :]
    offsets = rows[:, None] * n_ch + cols[None, :]
    s_offsets = _s_rows(rows, n_tokens, n_samples, S_SHARED)[:, None] * n_ch + cols[None, :]
    d_x = tl.load(DX + offsets, mask=tile_mask, other=0.0).to(tl.float32)
    _adaln_backward(d_x, A, SCALE, MEAN, RSTD, DA, DSCALE, DSHIFT, rows, row_mask, col_mask, offsets, s_offsets,
                    tile_mask, n_ch, PRECISION)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------

# Register and shared-memory budgets as transition.py's (same tiles: a row tile, three weight tiles).
_ROW_TILE_ELEMENTS = {2: 16384, 4: 4096}
_WEIGHT_TILE_ELEMENTS = {2: 16384, 4: 2048}
_ADALN_TILE_ELEMENTS = 4096


def _tiles(kernel: str, n_ch: int, n_hidden: int, itemsize: int) -> tuple[dict, int, int, int]:
    block_c = runtime.block_for(n_ch)
    config, block_m = runtime.tile_config(_OP, kernel, block_c, _ROW_TILE_ELEMENTS.get(itemsize, 4096))
    block_h = min(config["BLOCK_H"], runtime.block_for(n_hidden),
                  max(16, _WEIGHT_TILE_ELEMENTS.get(itemsize, 2048) // block_c))
    return config, block_m, block_h, block_c


def _sharing(a: torch.Tensor, conditioning: torch.Tensor) -> tuple[bool, int, int]:
    """(whether the s-derived rows are shared by a's samples, samples S, tokens L) for a
    [..., S, L, C] and the s-derived [..., S or 1, L, C] (same shape: not shared)."""
    if conditioning.shape == a.shape:
        return False, 1, 1
    return True, a.shape[-3], a.shape[-2]


def conditioned_transition_fwd(a, scale, shift, gate, weight_a, weight_b, weight_out, eps):
    """a [..., C] contiguous; scale, shift, gate contiguous, a's shape or shared over its dim -3
    -> (y, out (ungated), mean [rows], rstd [rows])."""
    n_ch = a.shape[-1]
    n_rows = a.numel() // n_ch
    n_hidden = weight_a.shape[0]
    shared, n_samples, n_tokens = _sharing(a, scale)
    y = torch.empty_like(a)
    out = torch.empty_like(a)
    mean = torch.empty(n_rows, device=a.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    config, block_m, block_h, block_c = _tiles("fwd", n_ch, n_hidden, a.element_size())
    runtime.launch_fitting(
        _conditioned_transition_fwd_kernel, (triton.cdiv(n_rows, block_m),),
        (a, scale, shift, gate, weight_a, weight_b, weight_out, y, out, mean, rstd,
         n_rows, n_ch, n_hidden, n_tokens, n_samples, eps),
        dict(S_SHARED=shared, PRECISION=runtime.dot_precision(a.dtype), BLOCK_M=block_m, BLOCK_H=block_h,
             BLOCK_C=block_c, **runtime.launch_options(config)),
        shrinkable=("BLOCK_H",))
    return y, out, mean, rstd


def conditioned_transition_bwd(dy, a, scale, shift, gate, weight_a, weight_b, weight_out, out, mean, rstd):
    """Gradients (da, d_scale, d_shift, d_gate (each in its tensor's shape and dtype), d_weight_a,
    d_weight_b, d_weight_out)."""
    n_ch = a.shape[-1]
    n_rows = a.numel() // n_ch
    n_hidden = weight_a.shape[0]
    shared, n_samples, n_tokens = _sharing(a, scale)
    device = a.device
    da = torch.empty_like(a)
    d_cond = torch.empty((3, *a.shape), device=device, dtype=a.dtype)  # scale, shift, gate per a row
    d_ab = torch.empty((n_rows, 2 * n_hidden), device=device, dtype=a.dtype)
    hidden = torch.empty((n_rows, n_hidden), device=device, dtype=a.dtype)
    x = torch.empty((n_rows, n_ch), device=device, dtype=a.dtype)
    d_out = torch.empty_like(x)
    config, block_m, block_h, block_c = _tiles("bwd", n_ch, n_hidden, a.element_size())
    runtime.launch_fitting(
        _conditioned_transition_bwd_kernel, (triton.cdiv(n_rows, block_m),),
        (a, dy, scale, shift, gate, weight_a, weight_b, weight_out, out, mean, rstd,
         da, d_cond[0], d_cond[1], d_cond[2], d_ab, hidden, x, d_out, n_rows, n_ch, n_hidden, n_tokens, n_samples),
        dict(S_SHARED=shared, PRECISION=runtime.dot_precision(a.dtype), BLOCK_M=block_m, BLOCK_H=block_h,
             BLOCK_C=block_c, **runtime.launch_options(config)),
        shrinkable=("BLOCK_H",))
    d_scale, d_shift, d_gate = _conditioning_grads(d_cond, shared, (scale, shift, gate))
    d_wab = d_ab.t() @ x  # [2 * n_hidden, C]
    return (da, d_scale, d_shift, d_gate, d_wab[:n_hidden].to(weight_a.dtype), d_wab[n_hidden:].to(weight_b.dtype),
            (d_out.t() @ hidden).to(weight_out.dtype))


def _conditioning_grads(d_cond, shared, tensors):
    """The per-a-row gradients [k, *a.shape] (a's dtype: half the bytes of fp32) summed in fp32
    over the samples where the s-derived tensors are shared, each in its tensor's dtype."""
    if shared:
        d_cond = d_cond.sum(-3, keepdim=True, dtype=torch.float32)
    return tuple(d.to(t.dtype) for d, t in zip(d_cond, tensors))


def _adaln_tiles(n_ch: int) -> tuple[dict, int, int]:
    """No products here, so no 16-row minimum: [BLOCK_M, BLOCK_C] <= 4096 elements kept the
    sm_90 compile free of spills (4 x 1024 and 32 x 128 at 8 warps; 16 x 1024 spilled 600 B)."""
    block_c = runtime.block_for(n_ch)
    config = runtime.kernel_config(_OP, "adaln")
    return config, max(1, min(config["BLOCK_M"], _ADALN_TILE_ELEMENTS // block_c)), block_c


def adaln_fwd(a, scale, shift, eps):
    """a [..., C] contiguous; scale, shift as conditioned_transition_fwd's -> (x, mean, rstd)."""
    n_ch = a.shape[-1]
    n_rows = a.numel() // n_ch
    shared, n_samples, n_tokens = _sharing(a, scale)
    x = torch.empty_like(a)
    mean = torch.empty(n_rows, device=a.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    config, block_m, block_c = _adaln_tiles(n_ch)
    _adaln_fwd_kernel[(triton.cdiv(n_rows, block_m),)](
        a, scale, shift, x, mean, rstd, n_rows, n_ch, n_tokens, n_samples, eps,
        S_SHARED=shared, PRECISION=runtime.dot_precision(a.dtype), BLOCK_M=block_m, BLOCK_C=block_c,
        **runtime.launch_options(config),
    )
    return x, mean, rstd


def adaln_bwd(dx, a, scale, shift, mean, rstd):
    """Gradients (da, d_scale, d_shift)."""
    n_ch = a.shape[-1]
    n_rows = a.numel() // n_ch
    shared, n_samples, n_tokens = _sharing(a, scale)
    da = torch.empty_like(a)
    d_cond = torch.empty((2, *a.shape), device=a.device, dtype=a.dtype)
    config, block_m, block_c = _adaln_tiles(n_ch)
    _adaln_bwd_kernel[(triton.cdiv(n_rows, block_m),)](
        a, dx, scale, mean, rstd, da, d_cond[0], d_cond[1], n_rows, n_ch, n_tokens, n_samples,
        S_SHARED=shared, PRECISION=runtime.dot_precision(a.dtype), BLOCK_M=block_m, BLOCK_C=block_c,
        **runtime.launch_options(config),
    )
    return (da, *_conditioning_grads(d_cond, shared, (scale, shift)))


# --------------------------------------------------------------------------------------------
# Autograd and the entry point
# --------------------------------------------------------------------------------------------


class _ConditionedTransitionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, scale, shift, gate, weight_a, weight_b, weight_out, eps):
        y, out, mean, rstd = conditioned_transition_fwd(a, scale, shift, gate, weight_a, weight_b, weight_out, eps)
        ctx.save_for_backward(a, scale, shift, gate, weight_a, weight_b, weight_out, out, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        return (*conditioned_transition_bwd(dy.contiguous(), *ctx.saved_tensors), None)


# Under torch.compile the launchers run inside custom ops, so neither Dynamo nor Inductor traces
# into them (as the other ops: transition.py).


@torch.library.custom_op("featurecache::conditioned_transition_fwd", mutates_args=())
def _conditioned_transition_fwd_op(a: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, gate: torch.Tensor,
                                   weight_a: torch.Tensor, weight_b: torch.Tensor, weight_out: torch.Tensor,
                                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return conditioned_transition_fwd(*(t.contiguous() for t in (a, scale, shift, gate, weight_a, weight_b,
                                                                 weight_out)), eps)


@_conditioned_transition_fwd_op.register_fake
def _(a, scale, shift, gate, weight_a, weight_b, weight_out, eps):
    stats = a.new_empty(a.numel() // a.shape[-1], dtype=torch.float32)
    like = torch.empty_like(a, memory_format=torch.contiguous_format)
    return like, torch.empty_like(like), stats, torch.empty_like(stats)


@torch.library.custom_op("featurecache::conditioned_transition_bwd", mutates_args=())
def _conditioned_transition_bwd_op(dy: torch.Tensor, a: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                                   gate: torch.Tensor, weight_a: torch.Tensor, weight_b: torch.Tensor,
                                   weight_out: torch.Tensor, out: torch.Tensor, mean: torch.Tensor,
                                   rstd: torch.Tensor) -> list[torch.Tensor]:
    tensors = (dy, a, scale, shift, gate, weight_a, weight_b, weight_out, out)
    grads = conditioned_transition_bwd(*(t.contiguous() for t in tensors), mean, rstd)
    return list(runtime.unaliased(grads))


@_conditioned_transition_bwd_op.register_fake
def _(dy, a, scale, shift, gate, weight_a, weight_b, weight_out, out, mean, rstd):
    return [torch.empty_like(t, memory_format=torch.contiguous_format)
            for t in (a, scale, shift, gate, weight_a, weight_b, weight_out)]


def _conditioned_transition_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[:7], *output[1:])


def _conditioned_transition_backward(ctx, dy, _dout, _dmean, _drstd):
    return (*_conditioned_transition_bwd_op(dy, *ctx.saved_tensors), None)


_conditioned_transition_fwd_op.register_autograd(_conditioned_transition_backward,
                                                 setup_context=_conditioned_transition_setup)


class _AdaLNFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, scale, shift, eps):
        x, mean, rstd = adaln_fwd(a, scale, shift, eps)
        ctx.save_for_backward(a, scale, shift, mean, rstd)
        return x

    @staticmethod
    def backward(ctx, dx):
        return (*adaln_bwd(dx.contiguous(), *ctx.saved_tensors), None)


@torch.library.custom_op("featurecache::adaln_fwd", mutates_args=())
def _adaln_fwd_op(a: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return adaln_fwd(a.contiguous(), scale.contiguous(), shift.contiguous(), eps)


@_adaln_fwd_op.register_fake
def _(a, scale, shift, eps):
    stats = a.new_empty(a.numel() // a.shape[-1], dtype=torch.float32)
    return torch.empty_like(a, memory_format=torch.contiguous_format), stats, torch.empty_like(stats)


@torch.library.custom_op("featurecache::adaln_bwd", mutates_args=())
def _adaln_bwd_op(dx: torch.Tensor, a: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, mean: torch.Tensor,
                  rstd: torch.Tensor) -> list[torch.Tensor]:
    return list(runtime.unaliased(adaln_bwd(*(t.contiguous() for t in (dx, a, scale, shift)), mean, rstd)))


@_adaln_bwd_op.register_fake
def _(dx, a, scale, shift, mean, rstd):
    return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (a, scale, shift)]


def _adaln_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[:3], *output[1:])


def _adaln_backward_op(ctx, dx, _dmean, _drstd):
    return (*_adaln_bwd_op(dx, *ctx.saved_tensors), None)


_adaln_fwd_op.register_autograd(_adaln_backward_op, setup_context=_adaln_setup)


def _adaln_modulate(a, scale, shift, eps):
    """x = sigmoid(scale) * LayerNorm(a) + shift by the one-pass kernel."""
    if torch.compiler.is_compiling():
        return _adaln_fwd_op(a, scale, shift, eps)[0]
    return _AdaLNFunction.apply(a.contiguous(), scale.contiguous(), shift.contiguous(), eps)


def _prepared(a, s, weight_a, weight_out):
    """Checks shared by the entry points; a and s in the dtype the kernels compute in."""
    runtime.check_triton_inputs(_OP, a, s)
    a, s = runtime.autocast_input(a), runtime.autocast_input(s)
    runtime.max_channels_check(_OP, "dim", a.shape[-1])
    _check_shapes(a, s, weight_a, weight_out)
    return a, s.to(a.dtype)


def adaptive_layernorm(a, s, norm_s_weight, scale_weight, scale_bias, shift_weight, eps=1e-5):
    """Triton AdaLN (Algorithm 26): sigmoid(Linear(LN(s))) * LayerNorm(a) + LinearNoBias(LN(s)),
    the s side with PyTorch (once per s row) and the rest in one pass over a. Shapes as
    conditioned_transition's; returns [..., C_a] in a's dtype."""
    a, s = _prepared(a, s, None, None)
    scale, shift = adaln_conditioning(s, norm_s_weight, scale_weight, scale_bias, shift_weight, eps)
    if a.numel() == 0:
        return adaln_modulate(a, scale, shift, eps)
    return _adaln_modulate(a, scale, shift, eps)


def _check_shapes(a, s, weight_a, weight_out) -> None:
    if weight_a is not None and (weight_a.shape[1] != a.shape[-1] or weight_out.shape != weight_a.shape[::-1]):
        raise ValueError(f"{_OP}: a has {a.shape[-1]} channels but weight_a is {tuple(weight_a.shape)} and "
                         f"weight_out is {tuple(weight_out.shape)}")
    leading = s.shape[:-1]
    shared = a.dim() >= 3 and leading == (*a.shape[:-3], 1, a.shape[-2])
    if leading != a.shape[:-1] and not shared:
        raise ValueError(f"{_OP}: s of shape {tuple(s.shape)} neither matches a {tuple(a.shape)} row for row nor "
                         f"is shared by its samples ([..., 1, L, C_s])")


def conditioned_transition(a, s, norm_s_weight, scale_weight, scale_bias, shift_weight, weight_a, weight_b,
                           weight_out, gate_weight, gate_bias, eps=1e-5):
    """Triton ConditionedTransitionBlock; same signature and numerics as
    conditioned_transition_reference. s is [..., S, L, C_s] like a, or [..., 1, L, C_s] shared by
    a's S samples (then the s side runs once per token, not once per sample)."""
    a, s = _prepared(a, s, weight_a, weight_out)
    if a.numel() == 0:
        # no rows: nothing to launch; the result stays connected to the graph for autograd
        return conditioned_transition_reference(a, s, norm_s_weight, scale_weight, scale_bias, shift_weight,
                                                weight_a, weight_b, weight_out, gate_weight, gate_bias, eps)
    # the s side with PyTorch, once per s row; its products in a's dtype, as the kernel's
    scale, shift = adaln_conditioning(s, norm_s_weight, scale_weight, scale_bias, shift_weight, eps)
    gate = torch.nn.functional.linear(s, gate_weight.to(s.dtype), gate_bias.to(s.dtype))
    weight_a, weight_b, weight_out = runtime.weights_like(a, weight_a, weight_b, weight_out)
    if a.shape[-1] > FUSED_MAX_CHANNELS:
        # rows too wide for registers: the one-pass AdaLN, then cuBLAS products (see the top)
        x = _adaln_modulate(a, scale, shift, eps)
        hidden = torch.nn.functional.silu(x @ weight_a.t()) * (x @ weight_b.t())
        return (torch.sigmoid(gate.float()) * (hidden @ weight_out.t()).float()).to(a.dtype)
    if torch.compiler.is_compiling():
        return _conditioned_transition_fwd_op(a, scale, shift, gate, weight_a, weight_b, weight_out, eps)[0]
    tensors = (t.contiguous() for t in (a, scale, shift, gate, weight_a, weight_b, weight_out))
    return _ConditionedTransitionFunction.apply(*tensors, eps)
