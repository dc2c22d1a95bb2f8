"""Pure-PyTorch references of every kernel: the CPU path and the ground truth for tests.

Each function has the same signature as its Triton counterpart.
"""

from __future__ import annotations

import torch


def evo_attention_reference(q, k, v, bias=None, mask=None, scale=None):
    """Attention with pair bias and key mask.

    q, k, v: [B, N, L, H, D]; bias: [B, 1 or N, H, L, L]; mask: [B, N, L] bool (True = attend).
    Returns [B, N, L, H, D] in q's dtype. Rows whose keys are all masked give zeros.
    Softmax statistics are kept in fp32 whatever the input dtype.
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    # [B, N, H, Lq, Lk]
    logits = torch.einsum("bnqhd,bnkhd->bnhqk", q.float(), k.float()) * scale
    if bias is not None:
        logits = logits + bias.float()
    if mask is not None:
        keep = mask[:, :, None, None, :]
        logits = logits.masked_fill(~keep, float("-inf"))
    row_max = logits.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(logits - row_max)
    denom = weights.sum(dim=-1, keepdim=True)
    weights = weights / torch.where(denom > 0, denom, torch.ones_like(denom))
    out = torch.einsum("bnhqk,bnkhd->bnqhd", weights, v.float())
    return out.to(q.dtype)
