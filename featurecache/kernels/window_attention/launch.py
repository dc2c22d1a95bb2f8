"""Windowed attention's input checks and launchers (window_attention_forward / _backward)."""

from __future__ import annotations


import torch
import triton

from featurecache.kernels import runtime
from featurecache.kernels.window_attention.config import MAX_WINDOW, WindowConfig, block_sizes, select_config
from featurecache.kernels.window_attention.kernels import (
    LOG2E,
    _window_bwd_kernel,
    _window_bwd_split_kernel,
    _window_fwd_kernel,
)

OP = "window_attention"


def check_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, mask: torch.Tensor | None
) -> None:
    """One line naming the argument and the expected layout for anything the kernels cannot take."""
    if q.dim() != 6:
        raise ValueError(f"{OP}: q has shape {tuple(q.shape)}, expected [B, S, W, queries, H, D]")
    batch, samples, windows, queries, heads, head_dim = q.shape
    if k.dim() != 6 or k.shape[:3] != q.shape[:3] or k.shape[4:] != q.shape[4:] or v.shape != k.shape:
        raise ValueError(
            f"{OP}: k {tuple(k.shape)} and v {tuple(v.shape)} must both be "
            f"[{batch}, {samples}, {windows}, keys, {heads}, {head_dim}]"
        )
    keys = k.shape[3]
    if max(queries, keys) > MAX_WINDOW:
        raise ValueError(f"{OP}: windows of {queries} queries x {keys} keys; at most {MAX_WINDOW} each")
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            f"{OP}: q, k, v are {q.dtype}, {k.dtype}, {v.dtype}; expected one of float32, bfloat16, float16"
        )
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"{OP}: q, k, v on {q.device}, {k.device}, {v.device}; expected one device")
    if bias is not None:
        if tuple(bias.shape) != (batch, windows, heads, queries, keys):
            raise ValueError(
                f"{OP}: bias has shape {tuple(bias.shape)}, expected [{batch}, {windows}, {heads}, {queries}, {keys}]"
            )
        if bias.dtype not in (torch.float32, q.dtype) or bias.device != q.device:
            raise ValueError(
                f"{OP}: bias is {bias.dtype} on {bias.device}, expected float32 or {q.dtype} on {q.device}"
            )
    if mask is not None and (
        tuple(mask.shape) != (batch, windows, keys) or mask.dtype != torch.bool or mask.device != q.device
    ):
        raise ValueError(
            f"{OP}: mask is {mask.dtype} {tuple(mask.shape)} on {mask.device}, expected bool "
            f"[{batch}, {windows}, {keys}] on {q.device}"
        )


def _bias_args(bias: torch.Tensor | None, q: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    return (q, (0,) * 5) if bias is None else (bias, tuple(bias.stride()))


def _mask_args(mask: torch.Tensor | None, q: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    if mask is None:
        return q, (0, 0, 0)
    # bool and uint8 share a layout; the kernels read bytes. Inside the launcher (a custom op
    # under torch.compile), so the reinterpretation never reaches a compiled graph.
    as_bytes = mask.view(torch.uint8)
    return as_bytes, tuple(as_bytes.stride())


def _launch_options(
    q: torch.Tensor, k: torch.Tensor, config: WindowConfig, backward: bool = False
) -> tuple[tuple[int, int, int], dict]:
    batch, samples, windows, queries, heads, head_dim = q.shape
    block_q, block_k, block_d = block_sizes(queries, k.shape[3], head_dim)
    grid = (windows, batch * heads, triton.cdiv(samples, config.samples_per_program))
    return grid, dict(
        SAMPLES=config.samples_per_program,
        PRECISION=runtime.dot_precision(q.dtype),
        BLOCK_Q=block_q,
        BLOCK_K=block_k,
        BLOCK_D=block_d,
        num_warps=config.bwd_num_warps if backward else config.num_warps,
        num_stages=config.num_stages,
    )


def config_for(q: torch.Tensor, config: WindowConfig | None = None) -> WindowConfig:
    """config, or the launch configuration select_config gives for q's shape and device."""
    batch, samples, windows, _, heads, _ = q.shape
    return config or select_config(batch * windows * heads, samples, q.device)


def window_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    scale: float,
    config: WindowConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch. Returns out [B, S, W, queries, H, D] (contiguous, q's dtype) and lse
    [B, S, W, H, queries] (fp32, log2 units; +inf for a query with no key), which the backward
    takes. Inputs are assumed checked; config overrides the heuristic (for benchmarks)."""
    batch, samples, windows, queries, heads, head_dim = q.shape
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    lse = torch.empty((batch, samples, windows, heads, queries), device=q.device, dtype=torch.float32)
    if out.numel() == 0:
        return out, lse
    bias_tensor, bias_strides = _bias_args(bias, q)
    mask_tensor, mask_strides = _mask_args(mask, q)
    grid, options = _launch_options(q, k, config_for(q, config))
    _window_fwd_kernel[grid](
        q,
        k,
        v,
        bias_tensor,
        mask_tensor,
        out,
        lse,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *bias_strides,
        *mask_strides,
        *out.stride(),
        heads,
        windows,
        samples,
        queries,
        k.shape[3],
        head_dim,
        scale * LOG2E.value,
        HAS_BIAS=bias is not None,
        HAS_MASK=mask is not None,
        **options,
    )
    return out, lse


def window_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    bias_grad: bool,
    config: WindowConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One launch (plus a sum over sample groups for dbias when there are several).

    Returns dq, dk, dv (contiguous, in q's dtype) and dbias (None unless bias_grad; bias's
    shape and dtype)."""
    batch, samples, windows, queries, heads, head_dim = q.shape
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    dk = torch.empty(k.shape, device=q.device, dtype=q.dtype)
    dv = torch.empty(k.shape, device=q.device, dtype=q.dtype)
    config = config_for(q, config)
    grid, options = _launch_options(q, k, config, backward=True)
    groups = grid[2]
    dbias = None
    if bias_grad:
        # One slice per sample group: written whole by its programs, summed in a fixed order.
        partial_shape = (groups, *bias.shape)
        dbias = torch.empty(partial_shape, device=q.device, dtype=torch.float32 if groups > 1 else bias.dtype)
    if dq.numel() == 0:
        return dq, dk, dv, None if dbias is None else bias.new_zeros(bias.shape)
    bias_tensor, bias_strides = _bias_args(bias, q)
    mask_tensor, mask_strides = _mask_args(mask, q)
    strides = (
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *bias_strides,
        *mask_strides,
        *out.stride(),
        *grad_out.stride(),
        *(dbias.stride() if dbias is not None else (0,) * 6),
    )
    sizes = (heads, windows, samples, queries, k.shape[3], head_dim, scale, scale * LOG2E.value)
    flags = dict(HAS_BIAS=bias is not None, HAS_MASK=mask is not None, STORE_DBIAS=dbias is not None)
    dbias_arg = dbias if dbias is not None else q
    if config.key_block:
        # Two passes: dQ (and delta) first, then dK, dV and dBias, which read delta.
        delta = torch.empty_like(lse)
        options["BLOCK_KB"] = min(options.pop("BLOCK_K"), runtime.block_for(config.key_block))
        for dq_pass in (True, False):
            _window_bwd_split_kernel[grid](
                q,
                k,
                v,
                bias_tensor,
                mask_tensor,
                out,
                grad_out,
                lse,
                delta,
                dq,
                dk,
                dv,
                dbias_arg,
                *strides,
                *sizes,
                DQ_PASS=dq_pass,
                **flags,
                **options,
            )
    else:
        _window_bwd_kernel[grid](
            q,
            k,
            v,
            bias_tensor,
            mask_tensor,
            out,
            grad_out,
            lse,
            dq,
            dk,
            dv,
            dbias_arg,
            *strides,
            *sizes,
            **flags,
            **options,
        )
    if dbias is not None:
        dbias = dbias[0] if groups == 1 else dbias.sum(0).to(bias.dtype)
    return dq, dk, dv, dbias
