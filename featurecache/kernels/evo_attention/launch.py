"""EvoAttention's launchers: input checks, then one function per direction that allocates the
outputs, picks the block configuration and launches the kernels.

A launch costs tens of microseconds of host time, as much as the kernels themselves at N = 1,
so a forward is one launch and a split backward two (three with a shared bias), with no other
device work around them (the fused backward adds a delta launch and the zeroing and copying of
its fp32 sums).

Programs of one row n and head are launched next to each other (q block is the fastest grid
axis) so k and v of that row stay in L2 for all its q blocks; a broadcast bias of one head is
L * L elements (1.2 MB in bf16 at L = 768), small enough to stay in L2 for every row that reads
it, which is what keeps the forward from moving the ~7 GB that re-reading an fp32 bias from
memory once per row would cost at L = 768.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from featurecache.kernels import runtime
from featurecache.kernels.evo_attention.config import (
    BlockConfig,
    EvoAttentionConfig,
    padded_head_dim,
    select_config,
)
from featurecache.kernels.evo_attention.kernels import (
    LOG2E,
    _evo_attention_bwd_bias_kernel,
    _evo_attention_bwd_fused_kernel,
    _evo_attention_bwd_kv_kernel,
    _evo_attention_bwd_kv_rows_kernel,
    _evo_attention_bwd_q_kernel,
    _evo_attention_bwd_q_rows_kernel,
    _evo_attention_delta_kernel,
    _evo_attention_fwd_kernel,
    _evo_attention_fwd_rows_kernel,
)

SUPPORTED_HEAD_DIMS = (8, 16, 24, 32, 48, 64, 128)
_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# Offsets inside a tile at or past this many elements switch the kernels to 64-bit tile offsets
# (WIDE_INDEX). Tests lower it to run the 64-bit path at sizes the interpreter can take.
INDEX_LIMIT = 2**31
# CUDA's largest grid along axes 1 and 2 (rows, batch x heads).
GRID_LIMIT = 65535


class SizeLimitError(ValueError):
    """Inputs beyond what one launch can cover (rows or batch x heads past CUDA's grid limit):
    a size to split, not a bug."""


def check_inputs(q, k, v, bias, mask) -> None:
    if q.dim() != 5:
        raise ValueError(f"evo_attention: q must be [B, N, L, H, D], got shape {tuple(q.shape)}")
    for name, tensor in (("k", k), ("v", v)):
        if tensor.shape != q.shape:
            raise ValueError(f"evo_attention: {name} has shape {tuple(tensor.shape)}, q has {tuple(q.shape)}")
        if tensor.dtype != q.dtype or tensor.device != q.device:
            raise ValueError(
                f"evo_attention: {name} is {tensor.dtype} on {tensor.device}, q is {q.dtype} on {q.device}"
            )
    if q.dtype not in _SUPPORTED_DTYPES:
        raise ValueError(f"evo_attention: dtype {q.dtype} not supported, use one of {_SUPPORTED_DTYPES}")
    batch, rows, seq_len, heads, head_dim = q.shape
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"evo_attention: head dim {head_dim} not supported, use one of {SUPPORTED_HEAD_DIMS}")
    if bias is not None:
        if (
            bias.dim() != 5
            or bias.shape[1] not in (1, rows)
            or ((bias.shape[0], bias.shape[2], bias.shape[3], bias.shape[4]) != (batch, heads, seq_len, seq_len))
        ):
            raise ValueError(
                f"evo_attention: bias has shape {tuple(bias.shape)}, expected "
                f"[{batch}, 1 or {rows}, {heads}, {seq_len}, {seq_len}]"
            )
        if bias.dtype not in (torch.float32, q.dtype) or bias.device != q.device:
            raise ValueError(
                f"evo_attention: bias is {bias.dtype} on {bias.device}, expected float32 or {q.dtype} on {q.device}"
            )
    if mask is not None:
        if tuple(mask.shape) != (batch, rows, seq_len) or mask.dtype != torch.bool or mask.device != q.device:
            raise ValueError(
                f"evo_attention: mask is {mask.dtype} {tuple(mask.shape)} on {mask.device}, "
                f"expected bool [{batch}, {rows}, {seq_len}] on {q.device}"
            )
    if rows > GRID_LIMIT or batch * heads > GRID_LIMIT:
        raise SizeLimitError(
            f"evo_attention: {rows} rows and {batch} x {heads} batch x heads; one launch covers at most "
            f"{GRID_LIMIT} of each (split the rows or the batch)"
        )


def _tile_span(tensor: torch.Tensor | None, axes: tuple[int, ...]) -> int:
    """The largest offset inside one tile: sum of (size - 1) x stride over the tiled axes."""
    if tensor is None:
        return 0
    return sum((tensor.shape[axis] - 1) * abs(tensor.stride(axis)) for axis in axes)


def wide_index(*tensors: torch.Tensor | None, bias: torch.Tensor | None = None) -> bool:
    """Whether the kernels need 64-bit tile offsets (WIDE_INDEX) for these tensors.

    tensors: [B, N, L, H, D] (q, k, v, out, their gradients), tiled over L and D; bias and its
    gradient: [B, N, H, L, L], tiled over both L. Batch, row and head offsets are 64-bit
    always, so only a tile's own extent counts: the ending node's views (position stride
    L x row width) pass 2^31 elements at L ~ 2000, a contiguous q never does in practice."""
    span = max([_tile_span(t, (2, 4)) for t in tensors] + [_tile_span(bias, (3, 4))])
    return span >= INDEX_LIMIT


def _bias_strides(bias: torch.Tensor | None) -> tuple[int, int, int, int, int]:
    if bias is None:
        return (0, 0, 0, 0, 0)
    # A bias shared by all rows gets row stride 0: the kernels then read one tile for every row.
    row_stride = 0 if bias.shape[1] == 1 else bias.stride(1)
    return (bias.stride(0), row_stride, bias.stride(2), bias.stride(3), bias.stride(4))


def _shared_bias_strides(bias: torch.Tensor) -> tuple[int, int, int, int]:
    # The row-group and dBias kernels take a bias shared by all rows: no row stride at all.
    return (bias.stride(0), bias.stride(2), bias.stride(3), bias.stride(4))


def _mask_arg(mask: torch.Tensor | None, q: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
    if mask is None:
        return q, (0, 0, 0)
    # bool and uint8 share a layout; Triton reads uint8 pointers more predictably than int1.
    as_bytes = mask.view(torch.uint8)
    if _tile_span(as_bytes, (2,)) >= INDEX_LIMIT:
        as_bytes = as_bytes.contiguous()  # the mask scan indexes positions in 32 bits
    return as_bytes, tuple(as_bytes.stride())


_SCAN_MASK = 256  # mask bytes per step of the forward's scan for each row's last attended key


def evo_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    scale: float,
    config: EvoAttentionConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the forward kernel: one launch, nothing else on the host's path.

    Returns out [B, N, L, H, D], lse [B, N, H, L] (fp32, log2 units) and key_end [B, N] (int32,
    one past each row's last attended key; L without a mask), which the backward takes.
    config overrides the tuned block sizes (for tuning runs); inputs are assumed checked.
    """
    batch, rows, seq_len, heads, head_dim = q.shape
    config = (config or select_config(head_dim, seq_len, q.device)).fwd
    out = q.new_empty(q.shape)
    lse = torch.empty((batch, rows, heads, seq_len), device=q.device, dtype=torch.float32)
    key_end = torch.empty((batch, rows), device=q.device, dtype=torch.int32)
    mask_tensor, mask_strides = _mask_arg(mask, q)
    shared_bias = bias is not None and bias.shape[1] == 1 and rows > 1
    common = dict(
        HAS_BIAS=bias is not None,
        HAS_MASK=mask is not None,
        PRECISION=runtime.dot_precision(q.dtype),
        SCAN_MASK=_SCAN_MASK,
        WIDE_INDEX=wide_index(q, k, v, out, bias=bias),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_D=padded_head_dim(head_dim),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if shared_bias and config.rows > 1:
        grid = (triton.cdiv(seq_len, config.block_m), triton.cdiv(rows, config.rows), batch * heads)
        _evo_attention_fwd_rows_kernel[grid](
            q,
            k,
            v,
            bias,
            mask_tensor,
            key_end,
            out,
            lse,
            *q.stride(),
            *k.stride(),
            *v.stride(),
            *_shared_bias_strides(bias),
            *mask_strides,
            *out.stride(),
            heads,
            rows,
            seq_len,
            head_dim,
            scale * LOG2E.value,
            ROWS=config.rows,
            **common,
        )
    else:
        grid = (triton.cdiv(seq_len, config.block_m), rows, batch * heads)
        _evo_attention_fwd_kernel[grid](
            q,
            k,
            v,
            bias if bias is not None else q,
            mask_tensor,
            key_end,
            out,
            lse,
            *q.stride(),
            *k.stride(),
            *v.stride(),
            *_bias_strides(bias),
            *mask_strides,
            *out.stride(),
            heads,
            seq_len,
            head_dim,
            scale * LOG2E.value,
            **common,
        )
    return out, lse, key_end


@dataclass(frozen=True)
class _BackwardInputs:
    """What every backward kernel reads: the forward's inputs and results, the mask as bytes,
    delta (rowsum(dO * O), written by the dQ or delta kernel) and the launch options that do
    not depend on tiles."""

    grad_out: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    bias: torch.Tensor | None
    mask: torch.Tensor
    mask_strides: tuple[int, int, int]
    out: torch.Tensor
    lse: torch.Tensor
    key_end: torch.Tensor
    delta: torch.Tensor
    scale: float
    common: dict

    def tiles(self, block: BlockConfig) -> dict:
        return dict(
            BLOCK_M=block.block_m,
            BLOCK_N=block.block_n,
            num_warps=block.num_warps,
            num_stages=block.num_stages,
            **self.common,
        )


def evo_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    key_end: torch.Tensor,
    scale: float,
    bias_grad: bool,
    config: EvoAttentionConfig | None = None,
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launch the backward kernels of the configured mode. Returns dq, dk, dv, dbias.

    dbias is None unless bias_grad. `grads`: tensors of q's shape to write dq, dk, dv into
    (views of a packed gradient, say); dk and dv must share their strides.
    """
    batch, rows, seq_len, heads, head_dim = q.shape
    config = config or select_config(head_dim, seq_len, q.device)
    if grads is not None:
        dq, dk, dv = grads
        if not (dq.shape == dk.shape == dv.shape == q.shape) or dk.stride() != dv.stride():
            raise ValueError("evo_attention_backward: grads must have q's shape, and dk and dv equal strides")
    else:
        dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    dbias = bias.new_empty(bias.shape) if bias_grad else None
    mask_tensor, mask_strides = _mask_arg(mask, q)
    common = dict(
        HAS_MASK=mask is not None,
        PRECISION=runtime.dot_precision(q.dtype),
        BLOCK_D=padded_head_dim(head_dim),
        WIDE_INDEX=wide_index(q, k, v, out, grad_out, dq, dk, dv, bias=bias) or wide_index(bias=dbias),
    )
    inputs = _BackwardInputs(
        grad_out, q, k, v, bias, mask_tensor, mask_strides, out, lse, key_end, torch.empty_like(lse), scale, common
    )
    shared_dbias = bias_grad and bias.shape[1] != rows
    # The fused mode sums in no fixed order: deterministic runs keep the split kernels. It is
    # there for a shared bias's gradient (its dBias pass walks every row): without one, split's
    # dQ and dK/dV kernels were faster than the fused kernel (H100, 2026-12-07: 0.58 against
    # 0.68 ms at L = 384, 3.76 against 4.11 at 768; NOTES-evo_attention.md attempt 11), and a
    # per-row bias gradient is written by the dQ kernel, each tile by one program.
    deterministic = torch.are_deterministic_algorithms_enabled()
    mode = "split" if not shared_dbias or deterministic else config.backward_mode(bias.dtype)
    if mode == "fused":
        _launch_fused_backward(inputs, dq, dk, dv, dbias, config.bwd_kv)
    else:
        _launch_split_backward(inputs, dq, dk, dv, dbias, config)
    return dq, dk, dv, dbias


def _launch_split_backward(x: _BackwardInputs, dq, dk, dv, dbias, config: EvoAttentionConfig) -> None:
    """dQ (which writes delta, and dBias of a per-row bias), dK/dV, then dBias of a shared bias.
    Order matters: the dK/dV and dBias kernels read the dQ kernel's delta."""
    batch, rows, seq_len, heads, head_dim = x.q.shape
    bias = x.bias
    shared_bias = bias is not None and bias.shape[1] == 1 and rows > 1
    per_row_dbias = dbias is not None and bias.shape[1] == rows
    scales = (x.scale, x.scale * LOG2E.value)
    qkv_strides = (*x.q.stride(), *x.k.stride(), *x.v.stride())
    qc, kv = config.bwd_q, config.bwd_kv
    q_grid = (triton.cdiv(seq_len, qc.block_m), rows, batch * heads)
    kv_grid = (triton.cdiv(seq_len, kv.block_n), rows, batch * heads)
    # The operands the row-group and plain kernels take alike (each in its own place around the
    # bias's, which differ: a shared bias's strides, or any bias's with HAS_BIAS).
    q_inputs = (x.mask, x.key_end, x.out, x.grad_out, x.lse, x.delta, dq)
    q_strides = (*x.mask_strides, *x.out.stride(), *x.grad_out.stride())
    kv_inputs = (x.mask, x.key_end, x.grad_out, x.lse, x.delta, dk, dv, *qkv_strides)
    kv_strides = (*x.mask_strides, *x.grad_out.stride(), *dk.stride())
    if shared_bias and qc.rows > 1:
        _evo_attention_bwd_q_rows_kernel[(q_grid[0], triton.cdiv(rows, qc.rows), q_grid[2])](
            x.q,
            x.k,
            x.v,
            bias,
            *q_inputs,
            *qkv_strides,
            *_shared_bias_strides(bias),
            *q_strides,
            *dq.stride(),
            heads,
            rows,
            seq_len,
            head_dim,
            *scales,
            ROWS=qc.rows,
            **x.tiles(qc),
        )
    else:
        _evo_attention_bwd_q_kernel[q_grid](
            x.q,
            x.k,
            x.v,
            bias if bias is not None else x.q,
            *q_inputs,
            dbias if per_row_dbias else x.q,
            *qkv_strides,
            *_bias_strides(bias),
            *q_strides,
            *(dbias.stride() if per_row_dbias else (0, 0, 0, 0, 0)),
            *dq.stride(),
            heads,
            seq_len,
            head_dim,
            *scales,
            HAS_BIAS=bias is not None,
            STORE_DBIAS=per_row_dbias,
            **x.tiles(qc),
        )

    if shared_bias and kv.rows > 1:
        _evo_attention_bwd_kv_rows_kernel[(kv_grid[0], triton.cdiv(rows, kv.rows), kv_grid[2])](
            x.q,
            x.k,
            x.v,
            bias,
            *kv_inputs,
            *_shared_bias_strides(bias),
            *kv_strides,
            heads,
            rows,
            seq_len,
            head_dim,
            *scales,
            ROWS=kv.rows,
            **x.tiles(kv),
        )
    else:
        _evo_attention_bwd_kv_kernel[kv_grid](
            x.q,
            x.k,
            x.v,
            bias if bias is not None else x.q,
            *kv_inputs,
            *_bias_strides(bias),
            *kv_strides,
            heads,
            seq_len,
            head_dim,
            *scales,
            HAS_BIAS=bias is not None,
            **x.tiles(kv),
        )

    if dbias is not None and not per_row_dbias:
        bc = config.bwd_bias
        _evo_attention_bwd_bias_kernel[
            (triton.cdiv(seq_len, bc.block_n), triton.cdiv(seq_len, bc.block_m), batch * heads)
        ](
            x.q,
            x.k,
            x.v,
            bias,
            x.mask,
            x.key_end,
            x.grad_out,
            x.lse,
            x.delta,
            dbias,
            *qkv_strides,
            *_shared_bias_strides(bias),
            *x.mask_strides,
            *x.grad_out.stride(),
            *_shared_bias_strides(dbias),
            heads,
            rows,
            seq_len,
            head_dim,
            x.scale * LOG2E.value,
            SCAN_MASK=_SCAN_MASK,
            **x.tiles(bc),
        )


def _launch_fused_backward(x: _BackwardInputs, dq, dk, dv, dbias, block: BlockConfig) -> None:
    """delta, then the dK/dV kernel that adds dQ and a shared bias's gradient by fp32 atomics;
    dq and dbias are written in place from their fp32 sums."""
    batch, rows, seq_len, heads, head_dim = x.q.shape
    bias = x.bias
    _launch_delta(x.out, x.grad_out, x.delta, x.common)
    # Contiguous fp32 sums: one layout whatever dq's, and 64-bit tile offsets only if q needed them.
    dq_acc = torch.zeros(x.q.shape, device=x.q.device, dtype=torch.float32)
    # An fp32 bias gradient is its own accumulator; a bf16 / fp16 one is rounded from an fp32 sum.
    dbias_acc = (
        dbias if dbias.dtype == torch.float32 else torch.empty(dbias.shape, device=x.q.device, dtype=torch.float32)
    )
    dbias_acc.zero_()
    _evo_attention_bwd_fused_kernel[(triton.cdiv(seq_len, block.block_n), rows, batch * heads)](
        x.q,
        x.k,
        x.v,
        bias,
        x.mask,
        x.key_end,
        x.grad_out,
        x.lse,
        x.delta,
        dk,
        dv,
        dq_acc,
        dbias_acc,
        *x.q.stride(),
        *x.k.stride(),
        *x.v.stride(),
        *_bias_strides(bias),
        *x.mask_strides,
        *x.grad_out.stride(),
        *dk.stride(),
        *dq_acc.stride(),
        *_shared_bias_strides(dbias_acc),
        heads,
        seq_len,
        head_dim,
        x.scale,
        x.scale * LOG2E.value,
        **x.tiles(block),
    )
    dq.copy_(dq_acc)
    if dbias_acc is not dbias:
        dbias.copy_(dbias_acc)


def _launch_delta(out, grad_out, delta, common: dict) -> None:
    """delta = rowsum(dO * O), for the fused backward, which has no dQ kernel to compute it."""
    batch, rows, seq_len, heads, head_dim = out.shape
    block = 64
    _evo_attention_delta_kernel[(triton.cdiv(seq_len, block), rows, batch * heads)](
        out,
        grad_out,
        delta,
        *out.stride(),
        *grad_out.stride(),
        heads,
        seq_len,
        head_dim,
        BLOCK_M=block,
        BLOCK_D=common["BLOCK_D"],
        WIDE_INDEX=common["WIDE_INDEX"],
    )
