"""WindowAttention, the nn.Module over window_attention and its PyTorch reference."""

from __future__ import annotations


import torch
from torch import nn

from featurecache.kernels import runtime
from featurecache.kernels.reference import window_attention_reference
from featurecache.kernels.window_attention.autograd import window_attention


class WindowAttention(nn.Module):
    """Attention inside windows (see window_attention for the layout); no parameters.

    kernels="triton" runs the kernels, kernels="torch" the PyTorch reference."""

    def __init__(self, kernels: str = "triton") -> None:
        super().__init__()
        self.kernels = runtime.check_kernels(kernels)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """q: [B, S, W, queries, H, D]; k, v: [B, S, W, keys, H, D]; bias: [B, W, H, queries, keys];
        mask: [B, W, keys] bool (True = attend); scale: None for D ** -0.5. Returns
        [B, S, W, queries, H, D]."""
        fn = window_attention if self.kernels == "triton" else window_attention_reference
        return fn(q, k, v, bias=bias, mask=mask, scale=scale)
