"""EvoAttention in PyTorch ops, a block of rows at a time: the attention of the CPU path.

evo_attention_reference computes every row's [H, L, L] logits at once, and autograd keeps the
softmax weights for backward: for triangle attention (N = L rows) that is H L^3 floats, 453 MB at
L = 384 with the tiny preset's 2 heads, whatever the channel width, and a step makes several such
temporaries per attention (logits, weights, their copies for the products, their gradients). Here
forward takes the rows ROW_BLOCK_ELEMENTS logits at a time and keeps its inputs and output; backward
recomputes each block's weights (one more q k^T) and forms the gradients from them, as a flash
attention backward does. Memory then follows the inputs (L^2 per row block), not L^3. An
attention whose logits fit one block (single attention at small sizes) runs the reference.

The arithmetic per row is the reference's: fp32 logits q k^T * scale + bias, the masked softmax
(as featurecache.kernels.reference.masked_softmax), weights times v; the softmax gradient is
written out as flash attention's, w * (dw - dout . out), equal to autograd's to fp32 rounding. Off the CPU (the `torch`
kernels on a GPU, a benchmark peer) evo_attention_rows is the reference itself.
"""

from __future__ import annotations

import torch

from featurecache.kernels.reference import evo_attention_reference

# Logits per row block (B x rows x H x L x L fp32: 8 MiB; a block holds a few tensors this size):
# smaller blocks stay in cache (fwd+bwd at L = 384, 2 heads, 1 thread: 1.38 s CPU at 8 MiB, 1.49 s at 32 MiB,
# 1.56 s at 1 MiB, where the per-block calls add up)
ROW_BLOCK_ELEMENTS = 1 << 21


def evo_attention_rows(q, k, v, bias=None, mask=None, scale=None, block_elements: int | None = None):
    """evo_attention_reference's contract (q, k, v [B, N, L, H, D]; bias [B, 1 or N, H, L, L];
    mask [B, N, L] bool, True = attend; rows with every key masked give zeros; output in q's
    dtype), computed on the CPU as many rows at a time as fit `block_elements` logits (default
    ROW_BLOCK_ELEMENTS, read at the call; at least one row). Attention whose logits fit one
    block is the reference itself (nothing to save by recomputing them)."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    block_elements = ROW_BLOCK_ELEMENTS if block_elements is None else block_elements
    batch, rows, length, heads, _ = q.shape
    if q.device.type != "cpu" or batch * rows * heads * length * length <= block_elements:
        return evo_attention_reference(q, k, v, bias, mask, scale)
    return _RowBlockAttention.apply(q, k, v, bias, mask, float(scale), block_elements)


def _row_blocks(q: torch.Tensor, block_elements: int) -> list[slice]:
    batch, rows, length, heads, _ = q.shape
    per_block = max(1, block_elements // max(1, batch * heads * length * length))
    return [slice(start, min(start + per_block, rows)) for start in range(0, rows, per_block)]


def _weights(q, k, bias, mask, scale: float, rows: slice) -> torch.Tensor:
    """The softmax weights [B, rows, H, Lq, Lk] of one block of rows, as the reference forms them
    (masked_softmax), in place where the reference makes a new tensor (nothing here is recorded
    by autograd), and the rows with no key zeroed only where there are such rows."""
    logits = torch.einsum("bnqhd,bnkhd->bnhqk", q[:, rows].float() * scale, k[:, rows].float())
    if bias is not None:
        logits = logits.add_(bias[:, rows if bias.shape[1] > 1 else slice(None)].float())
    if mask is None:
        return torch.softmax(logits, dim=-1)
    keep = mask[:, rows, None, None, :]
    weights = torch.softmax(logits.masked_fill_(~keep, torch.finfo(logits.dtype).min), dim=-1)
    empty = ~keep.any(dim=-1, keepdim=True)
    return weights.masked_fill_(empty, 0.0) if empty.any() else weights


class _RowBlockAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale, block_elements):
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        for rows in _row_blocks(q, block_elements):
            weights = _weights(q, k, bias, mask, scale, rows)
            out[:, rows] = torch.einsum("bnhqk,bnkhd->bnqhd", weights, v[:, rows].float())
        ctx.save_for_backward(q, k, v, bias, mask, out)
        ctx.scale, ctx.block_elements = scale, block_elements
        return out.to(q.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, bias, mask, out = ctx.saved_tensors
        scale = ctx.scale
        need_q, need_k, need_v, need_bias = ctx.needs_input_grad[:4]
        grad_q, grad_k, grad_v = (torch.zeros(t.shape, dtype=torch.float32, device=t.device) if need else None
                                  for t, need in ((q, need_q), (k, need_k), (v, need_v)))
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
        # the softmax backward's sum_k w_k dw_k is sum_k w_k (dout . v_k) = dout . out: [B, N, H, L, 1]
        row_sums = (grad_out.float() * out).sum(-1).permute(0, 1, 3, 2).unsqueeze(-1)
        for rows in _row_blocks(q, ctx.block_elements):
            weights = _weights(q, k, bias, mask, scale, rows)
            grad_block = grad_out[:, rows].float()
            if need_v:
                grad_v[:, rows] = torch.einsum("bnhqk,bnqhd->bnkhd", weights, grad_block)
            grad_weights = torch.einsum("bnqhd,bnkhd->bnhqk", grad_block, v[:, rows].float())
            # softmax backward; masked keys and rows with no key have weight 0, so no gradient
            grad_logits = grad_weights.sub_(row_sums[:, rows]).mul_(weights)
            if need_bias:
                if bias.shape[1] > 1:
                    grad_bias[:, rows] = grad_logits
                else:  # one bias shared by every row
                    grad_bias += grad_logits.sum(1, keepdim=True)
            if need_q:
                grad_q[:, rows] = torch.einsum("bnhqk,bnkhd->bnqhd", grad_logits, k[:, rows].float()) * scale
            if need_k:
                grad_k[:, rows] = torch.einsum("bnhqk,bnqhd->bnkhd", grad_logits, q[:, rows].float() * scale)
        cast = [None if grad is None else grad.to(t.dtype) for grad, t in
                ((grad_q, q), (grad_k, k), (grad_v, v), (grad_bias, bias))]
        return (*cast, None, None, None)
