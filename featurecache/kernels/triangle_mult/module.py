"""TriangleMultiplication, the nn.Module over triangle_mult and its PyTorch reference."""

from __future__ import annotations

import torch
from torch import nn

from featurecache.kernels import runtime
from featurecache.kernels.reference import triangle_mult_reference
from featurecache.kernels.triangle_mult.autograd import triangle_mult
from featurecache.kernels.triangle_mult.launch import DIRECTIONS


class TriangleMultiplication(nn.Module):
    """AF3 triangle multiplicative update; forward(z, mask) returns the update (no residual).

    kernels="triton" runs the fused kernels; kernels="torch" runs the PyTorch reference. Both
    hold identical parameters, so a state_dict moves between them.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int | None = None,
        direction: str = "outgoing",
        eps: float = 1e-5,
        kernels: str = "triton",
    ) -> None:
        super().__init__()
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        self.kernels = runtime.check_kernels(kernels)
        self.direction = direction
        hidden_dim = dim if hidden_dim is None else hidden_dim
        self.norm_in = nn.LayerNorm(dim, eps=eps)
        self.linear_a_p = nn.Linear(dim, hidden_dim, bias=False)
        self.linear_a_g = nn.Linear(dim, hidden_dim, bias=False)
        self.linear_b_p = nn.Linear(dim, hidden_dim, bias=False)
        self.linear_b_g = nn.Linear(dim, hidden_dim, bias=False)
        self.linear_g = nn.Linear(dim, dim, bias=False)
        self.norm_out = nn.LayerNorm(hidden_dim, eps=eps)
        self.linear_z = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """z: [B, N_token, N_token, dim]; mask: [B, N_token, N_token] bool (None: every pair).
        Returns the update [B, N_token, N_token, dim] (no residual)."""
        fn = triangle_mult if self.kernels == "triton" else triangle_mult_reference
        return fn(
            z,
            mask,
            self.norm_in.weight,
            self.norm_in.bias,
            self.linear_a_p.weight,
            self.linear_a_g.weight,
            self.linear_b_p.weight,
            self.linear_b_g.weight,
            self.linear_g.weight,
            self.norm_out.weight,
            self.norm_out.bias,
            self.linear_z.weight,
            direction=self.direction,
            eps=self.norm_in.eps,
        )
