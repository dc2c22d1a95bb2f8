"""Transition, the nn.Module over `transition` and its PyTorch reference."""

from __future__ import annotations

import torch
from torch import nn

from featurecache.kernels import runtime
from featurecache.kernels.reference import transition_reference
from featurecache.kernels.transition.autograd import transition


class Transition(nn.Module):
    """AF3 Transition: linear_out(silu(linear_a(norm(x))) * linear_b(norm(x))).

    kernels="triton" runs the fused kernels; kernels="torch" runs the PyTorch reference. Both
    hold identical parameters, so a state_dict moves between them.
    """

    def __init__(self, dim: int, expansion: int = 4, eps: float = 1e-5, kernels: str = "triton"):
        super().__init__()
        self.kernels = runtime.check_kernels(kernels)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.linear_a = nn.Linear(dim, expansion * dim, bias=False)
        self.linear_b = nn.Linear(dim, expansion * dim, bias=False)
        self.linear_out = nn.Linear(expansion * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., dim]. Returns [..., dim] (the update; no residual)."""
        fn = transition if self.kernels == "triton" else transition_reference
        return fn(
            x,
            self.norm.weight,
            self.norm.bias,
            self.linear_a.weight,
            self.linear_b.weight,
            self.linear_out.weight,
            self.norm.eps,
        )
