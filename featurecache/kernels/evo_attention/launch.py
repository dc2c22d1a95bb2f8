"""EvoAttention's launchers: input checks, then one function per direction that allocates the
outputs, picks the block configuration and launches the kernels.

A launch costs tens of microseconds of host time, as much as the kernels themselves at N = 1,
so a forward is one launch and a split backward two (three with a shared bias), with no other
device work around them (the atomic modes add a delta launch and the zeroing and copying of
their fp32 sums).

Programs of one row n and head are launched next to each other (q block is the fastest grid
axis) so k and v of that row stay in L2 for all its q blocks; a broadcast bias of one head is
L * L elements (1.2 MB in bf16 at L = 768), small enough to stay in L2 for every row that reads
it, which is what keeps the forward from moving the ~7 GB that re-reading an fp32 bias from
memory once per row would cost at L = 768.
"""

from __future__ import annotations

from typing import Optional

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
    _evo_attention_bwd_fused_pair_kernel,
    _evo_attention_bwd_kv_kernel,
    _evo_attention_bwd_kv_rows_kernel,
    _evo_attention_bwd_q_kernel,
    _evo_attention_bwd_q_pair_kernel,
    _evo_attention_bwd_walk_kernel,
    _evo_attention_bwd_q_rows_kernel,
    _evo_attention_delta_kernel,
    _evo_attention_fwd_kernel,
    _evo_attention_fwd_pair_kernel,
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
        if bias.dim() != 5 or bias.shape[1] not in (1, rows) or (
            (bias.shape[0], bias.shape[2], bias.shape[3], bias.shape[4]) != (batch, heads, seq_len, seq_len)
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


def _tile_span(tensor: Optional[torch.Tensor], axes: tuple[int, ...]) -> int:
    """The largest offset inside one tile: sum of (size - 1) x stride over the tiled axes."""
    if tensor is None:
        return 0
    return sum((tensor.shape[axis] - 1) * abs(tensor.stride(axis)) for axis in axes)


def wide_index(*tensors: Optional[torch.Tensor], bias: Optional[torch.Tensor] = None) -> bool:
    """Whether the kernels need 64-bit tile offsets (WIDE_INDEX) for these tensors.

    tensors: [B, N, L, H, D] (q, k, v, out, their gradients), tiled over L and D; bias and its
    gradient: [B, N, H, L, L], tiled over both L. Batch, row and head offsets are 64-bit
    always, so only a tile's own extent counts: the ending node's views (position stride
    L x row width) pass 2^31 elements at L ~ 2000, a contiguous q never does in practice."""
    span = max([_tile_span(t, (2, 4)) for t in tensors] + [_tile_span(bias, (3, 4))])
    return span >= INDEX_LIMIT


def _bias_strides(bias: Optional[torch.Tensor]) -> tuple[int, int, int, int, int]:
    if bias is None:
        return (0, 0, 0, 0, 0)
    # A bias shared by all rows gets row stride 0: the kernels then read one tile for every row.
    row_stride = 0 if bias.shape[1] == 1 else bias.stride(1)
    return (bias.stride(0), row_stride, bias.stride(2), bias.stride(3), bias.stride(4))


def _shared_bias_strides(bias: torch.Tensor) -> tuple[int, int, int, int]:
    # The row-group and dBias kernels take a bias shared by all rows: no row stride at all.
    return (bias.stride(0), bias.stride(2), bias.stride(3), bias.stride(4))


def _mask_arg(mask: Optional[torch.Tensor], q: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
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
    bias: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    scale: float,
    config: Optional[EvoAttentionConfig] = None,
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
    if shared_bias and config.paired:
        common.pop("HAS_BIAS")
        _evo_attention_fwd_pair_kernel[(triton.cdiv(seq_len, config.block_m), triton.cdiv(rows, 2), batch * heads)](
            q, k, v, bias, mask_tensor, key_end, out, lse,
            *q.stride(), *k.stride(), *v.stride(), *_shared_bias_strides(bias), *mask_strides, *out.stride(),
            heads, rows, seq_len, head_dim, scale * LOG2E.value,
            **common,
        )
    elif shared_bias and config.rows > 1:
        grid = (triton.cdiv(seq_len, config.block_m), triton.cdiv(rows, config.rows), batch * heads)
        _evo_attention_fwd_rows_kernel[grid](
            q, k, v, bias, mask_tensor, key_end, out, lse,
            *q.stride(), *k.stride(), *v.stride(),
            *_shared_bias_strides(bias),
            *mask_strides, *out.stride(),
            heads, rows, seq_len, head_dim, scale * LOG2E.value,
            ROWS=config.rows,
            **common,
        )
    else:
        grid = (triton.cdiv(seq_len, config.block_m), rows, batch * heads)
        _evo_attention_fwd_kernel[grid](
            q, k, v, bias if bias is not None else q, mask_tensor, key_end, out, lse,
            *q.stride(), *k.stride(), *v.stride(), *_bias_strides(bias), *mask_strides, *out.stride(),
            heads, seq_len, head_dim, scale * LOG2E.value,
            **common,
        )
    return out, lse, key_end


def evo_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    out: torch.Tensor,
    lse: torch.Tensor,
    key_end: torch.Tensor,
    scale: float,
    bias_grad: bool,
    config: Optional[EvoAttentionConfig] = None,
    grads: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Launch the backward kernels (two, three for a shared bias). Returns dq, dk, dv, dbias.

    dbias is None unless bias_grad. Order matters: the dQ kernel writes delta = rowsum(dO * O),
    which the dK/dV and dBias kernels read. `grads`: tensors of q's shape to write dq, dk, dv
    into (views of a packed gradient, say); dk and dv must share their strides.
    """
    batch, rows, seq_len, heads, head_dim = q.shape
    config = config or select_config(head_dim, seq_len, q.device)
    has_bias = bias is not None
    bias_arg = bias if has_bias else q
    mask_tensor, mask_strides = _mask_arg(mask, q)
    shared_bias = has_bias and bias.shape[1] == 1 and rows > 1
    per_row_dbias = bias_grad and bias.shape[1] == rows
    common = dict(
        HAS_MASK=mask is not None,
        PRECISION=runtime.dot_precision(q.dtype),
        BLOCK_D=padded_head_dim(head_dim),
    )

    def tiles(block: BlockConfig) -> dict:
        return dict(BLOCK_M=block.block_m, BLOCK_N=block.block_n, num_warps=block.num_warps,
                    num_stages=block.num_stages, **common)

    delta = torch.empty_like(lse)
    if grads is not None:
        dq, dk, dv = grads
        if not (dq.shape == dk.shape == dv.shape == q.shape) or dk.stride() != dv.stride():
            raise ValueError("evo_attention_backward: grads must have q's shape, and dk and dv equal strides")
    else:
        dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    dbias = bias.new_empty(bias.shape) if bias_grad else None
    common["WIDE_INDEX"] = wide_index(q, k, v, out, grad_out, dq, dk, dv, bias=bias) or wide_index(bias=dbias)
    # The atomic modes sum in no fixed order: deterministic runs keep the split kernels.
    deterministic = torch.are_deterministic_algorithms_enabled()
    mode = "split" if per_row_dbias or deterministic else config.backward_mode(bias.dtype if has_bias else None)
    if mode == "walk" and shared_bias and bias_grad:
        _launch_walk_backward(grad_out, q, k, v, bias, mask_tensor, mask_strides, out, lse, key_end, delta,
                              dq, dk, dv, dbias, scale, config.bwd_bias, common)
        return dq, dk, dv, dbias
    if mode == "walk":
        mode = "fused"  # no shared bias gradient to walk for: the one-pass dK/dV kernel instead
    if mode == "fused":
        _launch_fused_backward(grad_out, q, k, v, bias, mask_tensor, mask_strides, out, lse, key_end, delta,
                               dq, dk, dv, dbias, scale, config.bwd_kv, common)
        return dq, dk, dv, dbias
    qc = config.bwd_q
    if shared_bias and qc.paired:
        _evo_attention_bwd_q_pair_kernel[(triton.cdiv(seq_len, qc.block_m), triton.cdiv(rows, 2), batch * heads)](
            q, k, v, bias, mask_tensor, key_end, out, grad_out, lse, delta, dq,
            *q.stride(), *k.stride(), *v.stride(), *_shared_bias_strides(bias),
            *mask_strides, *out.stride(), *grad_out.stride(), *dq.stride(),
            heads, rows, seq_len, head_dim, scale, scale * LOG2E.value,
            **tiles(qc),
        )
    elif shared_bias and qc.rows > 1:
        _evo_attention_bwd_q_rows_kernel[(triton.cdiv(seq_len, qc.block_m), triton.cdiv(rows, qc.rows), batch * heads)](
            q, k, v, bias, mask_tensor, key_end, out, grad_out, lse, delta, dq,
            *q.stride(), *k.stride(), *v.stride(),
            *_shared_bias_strides(bias),
            *mask_strides, *out.stride(), *grad_out.stride(), *dq.stride(),
            heads, rows, seq_len, head_dim, scale, scale * LOG2E.value,
            ROWS=qc.rows,
            **tiles(qc),
        )
    else:
        _evo_attention_bwd_q_kernel[(triton.cdiv(seq_len, qc.block_m), rows, batch * heads)](
            q, k, v, bias_arg, mask_tensor, key_end, out, grad_out, lse, delta, dq,
            dbias if per_row_dbias else q,
            *q.stride(), *k.stride(), *v.stride(), *_bias_strides(bias),
            *mask_strides, *out.stride(), *grad_out.stride(),
            *(dbias.stride() if per_row_dbias else (0, 0, 0, 0, 0)),
            *dq.stride(),
            heads, seq_len, head_dim, scale, scale * LOG2E.value,
            HAS_BIAS=has_bias,
            STORE_DBIAS=per_row_dbias,
            **tiles(qc),
        )

    kv = config.bwd_kv
    if (mode == "atomic_dbias" and bias_grad) or (shared_bias and kv.paired):
        # The fused kernel with dBias atomics, or with none (paired dK/dV of the split backward).
        atomic_dbias = mode == "atomic_dbias" and bias_grad
        _launch_fused_backward(grad_out, q, k, v, bias, mask_tensor, mask_strides, out, lse, key_end, delta,
                               None, dk, dv, dbias if atomic_dbias else None, scale, kv, common)
        if atomic_dbias:
            return dq, dk, dv, dbias
    elif shared_bias and kv.rows > 1:
        _evo_attention_bwd_kv_rows_kernel[(triton.cdiv(seq_len, kv.block_n), triton.cdiv(rows, kv.rows), batch * heads)](
            q, k, v, bias, mask_tensor, key_end, grad_out, lse, delta, dk, dv,
            *q.stride(), *k.stride(), *v.stride(),
            *_shared_bias_strides(bias),
            *mask_strides, *grad_out.stride(), *dk.stride(),
            heads, rows, seq_len, head_dim, scale, scale * LOG2E.value,
            ROWS=kv.rows,
            **tiles(kv),
        )
    else:
        _evo_attention_bwd_kv_kernel[(triton.cdiv(seq_len, kv.block_n), rows, batch * heads)](
            q, k, v, bias_arg, mask_tensor, key_end, grad_out, lse, delta, dk, dv,
            *q.stride(), *k.stride(), *v.stride(), *_bias_strides(bias),
            *mask_strides, *grad_out.stride(), *dk.stride(),
            heads, seq_len, head_dim, scale, scale * LOG2E.value,
            HAS_BIAS=has_bias,
            **tiles(kv),
        )

    if bias_grad and not per_row_dbias:
        bc = config.bwd_bias
        _evo_attention_bwd_bias_kernel[(triton.cdiv(seq_len, bc.block_n), triton.cdiv(seq_len, bc.block_m), batch * heads)](
            q, k, v, bias, mask_tensor, key_end, grad_out, lse, delta, dbias,
            *q.stride(), *k.stride(), *v.stride(),
            *_shared_bias_strides(bias),
            *mask_strides, *grad_out.stride(),
            *_shared_bias_strides(dbias),
            heads, rows, seq_len, head_dim, scale * LOG2E.value,
            SCAN_MASK=_SCAN_MASK,
            **tiles(bc),
        )
    return dq, dk, dv, dbias



def _launch_fused_backward(grad_out, q, k, v, bias, mask_tensor, mask_strides, out, lse, key_end, delta,
                           dq, dk, dv, dbias, scale, block: BlockConfig, common: dict) -> None:
    """The dK/dV kernel that adds dQ (when dq is given; delta is then computed here first) and
    the shared bias's gradient (when dbias is given) by fp32 atomics; dq and dbias are written
    in place from their fp32 sums."""
    batch, rows, seq_len, heads, head_dim = q.shape
    has_bias = bias is not None
    rows_per_program = 2 if block.paired and has_bias and bias.shape[1] == 1 and rows > 1 else 1
    if dq is not None:
        _launch_delta(out, grad_out, delta, common)
        # Contiguous fp32 sums: one layout whatever dq's, and 64-bit tile offsets only if q needed them.
        dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    else:
        dq_acc = lse  # unused: ATOMIC_DQ is off
    if dbias is not None:
        # An fp32 bias gradient is its own accumulator; a bf16 / fp16 one is rounded from an fp32 sum.
        dbias_acc = dbias if dbias.dtype == torch.float32 else torch.empty(dbias.shape, device=q.device,
                                                                           dtype=torch.float32)
        dbias_acc.zero_()
        dbias_strides = _shared_bias_strides(dbias_acc)
    else:
        dbias_acc, dbias_strides = lse, (0, 0, 0, 0)
    grid = (triton.cdiv(seq_len, block.block_n), triton.cdiv(rows, rows_per_program), batch * heads)
    pointers = (q, k, v, bias if has_bias else q, mask_tensor, key_end, grad_out, lse, delta, dk, dv, dq_acc,
                dbias_acc, *q.stride(), *k.stride(), *v.stride())
    after_bias = (*mask_strides, *grad_out.stride(), *dk.stride(),
                  *(dq_acc.stride() if dq is not None else (0, 0, 0, 0, 0)), *dbias_strides)
    options = dict(ATOMIC_DQ=dq is not None, ATOMIC_DBIAS=dbias is not None, BLOCK_M=block.block_m,
                   BLOCK_N=block.block_n, num_warps=block.num_warps, num_stages=block.num_stages, **common)
    if rows_per_program == 2:
        _evo_attention_bwd_fused_pair_kernel[grid](
            *pointers, *_shared_bias_strides(bias), *after_bias,
            heads, rows, seq_len, head_dim, scale, scale * LOG2E.value, **options,
        )
    else:
        _evo_attention_bwd_fused_kernel[grid](
            *pointers, *_bias_strides(bias), *after_bias,
            heads, seq_len, head_dim, scale, scale * LOG2E.value, HAS_BIAS=has_bias, **options,
        )
    if dq is not None:
        dq.copy_(dq_acc)
    if dbias is not None and dbias_acc is not dbias:
        dbias.copy_(dbias_acc)


def _launch_delta(out, grad_out, delta, common: dict) -> None:
    """delta = rowsum(dO * O), for the backward modes without a dQ kernel to compute it."""
    batch, rows, seq_len, heads, head_dim = out.shape
    block = 64
    _evo_attention_delta_kernel[(triton.cdiv(seq_len, block), rows, batch * heads)](
        out, grad_out, delta, *out.stride(), *grad_out.stride(), heads, seq_len, head_dim,
        BLOCK_M=block, BLOCK_D=common["BLOCK_D"], WIDE_INDEX=common["WIDE_INDEX"],
    )


def _launch_walk_backward(grad_out, q, k, v, bias, mask_tensor, mask_strides, out, lse, key_end, delta,
                          dq, dk, dv, dbias, scale, block: BlockConfig, common: dict) -> None:
    """The one-pass backward that walks the rows per bias tile ("walk"): dbias written directly,
    dq, dk and dv summed in fp32 by atomics and copied into place."""
    batch, rows, seq_len, heads, head_dim = q.shape
    _launch_delta(out, grad_out, delta, common)
    sums = torch.zeros((3, *q.shape), device=q.device, dtype=torch.float32)
    _evo_attention_bwd_walk_kernel[(triton.cdiv(seq_len, block.block_n), triton.cdiv(seq_len, block.block_m),
                                    batch * heads)](
        q, k, v, bias, mask_tensor, key_end, grad_out, lse, delta, dbias, sums[0], sums[1], sums[2],
        *q.stride(), *k.stride(), *v.stride(), *_shared_bias_strides(bias),
        *mask_strides, *grad_out.stride(), *_shared_bias_strides(dbias), *sums[0].stride(),
        heads, rows, seq_len, head_dim, scale, scale * LOG2E.value,
        SCAN_MASK=_SCAN_MASK, BLOCK_M=block.block_m, BLOCK_N=block.block_n, num_warps=block.num_warps,
        num_stages=block.num_stages, **common,
    )
    dq.copy_(sums[0])
    dk.copy_(sums[1])
    dv.copy_(sums[2])
