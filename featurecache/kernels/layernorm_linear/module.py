"""LayerNormLinear, the nn.Module over `layernorm_linear` and its PyTorch reference."""

from __future__ import annotations

import torch
from torch import nn

from featurecache.kernels import runtime
from featurecache.kernels.layernorm_linear.autograd import layernorm_linear
from featurecache.kernels.reference import layernorm_linear_reference


class LayerNormLinear(nn.Module):
    """linear(norm(x)) with parameters named as nn.LayerNorm `norm` and nn.Linear `linear`.

    kernels="triton" runs the fused kernels; kernels="torch" runs the PyTorch reference. Both
    hold identical parameters, so a state_dict moves between them.
    """

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
        """x: [..., in_features]. Returns [..., out_features] (with aligned_rows on the Triton
        path, a view whose rows start every 16 elements)."""
        args = (x, self.norm.weight, self.norm.bias, self.linear.weight, self.linear.bias, self.norm.eps)
        if self.kernels == "triton":
            return layernorm_linear(*args, aligned_rows=self.aligned_rows)
        # aligned_rows: the caller reads the result through its strides, whatever its layout
        return layernorm_linear_reference(*args, any_layout=self.aligned_rows)
