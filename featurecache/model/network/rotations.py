"""Rotations from quaternions as one matrix product, and the per-device cache of the small
constant tables such products use.

On a GPU, writing a 3 x 3 rotation out entry by entry from (w, x, y, z) is ~40 kernels on tiny
tensors; as the quadratic form R(q)_ij = sum_ab C[ab, ij] q_a q_b it is an outer product and one
matrix product. The sampler's random rotations and Kabsch's (objectives/rigid.py) both take it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_tables: dict[tuple, torch.Tensor] = {}


def device_constant(name: str, build: Callable[[], torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """build() (a CPU tensor) on like's device in like's dtype, made once per (name, device,
    dtype). A copy to a GPU is not allowed while a CUDA graph is captured: every captured step
    here is warmed up eagerly first (training/cuda_graph.py), which makes the tables it needs.
    For a tensor that is not a plain one (a fake tensor of benchmarks/flops.py, a compiler's) the
    table is built anew in its mode and not kept: a kept real tensor cannot meet a fake one."""
    key, kept = (name, like.device, like.dtype), type(like) is torch.Tensor
    if not kept or key not in _tables:
        table = build().to(device=like.device, dtype=like.dtype)
        if not kept:
            return table
        _tables[key] = table
    return _tables[key]


# R(q) |q|^2 for q = (w, x, y, z), entry (i, j): its coefficient of each product q_a q_b, e.g.
# R_00 = w^2 + x^2 - y^2 - z^2 (= 1 - 2 (y^2 + z^2) when |q| = 1), R_01 = 2 (x y - w z).
_ROTATION_TERMS = {
    (0, 0): {(0, 0): 1, (1, 1): 1, (2, 2): -1, (3, 3): -1},
    (0, 1): {(1, 2): 2, (0, 3): -2},
    (0, 2): {(1, 3): 2, (0, 2): 2},
    (1, 0): {(1, 2): 2, (0, 3): 2},
    (1, 1): {(0, 0): 1, (1, 1): -1, (2, 2): 1, (3, 3): -1},
    (1, 2): {(2, 3): 2, (0, 1): -2},
    (2, 0): {(1, 3): 2, (0, 2): -2},
    (2, 1): {(2, 3): 2, (0, 1): 2},
    (2, 2): {(0, 0): 1, (1, 1): -1, (2, 2): -1, (3, 3): 1},
}


def _rotation_table() -> torch.Tensor:
    """C [16, 9]: each coefficient split evenly over q_a q_b and q_b q_a."""
    table = torch.zeros(4, 4, 3, 3, dtype=torch.float64)
    for (i, j), terms in _ROTATION_TERMS.items():
        for (a, b), coefficient in terms.items():
            table[a, b, i, j] += coefficient / 2
            table[b, a, i, j] += coefficient / 2
    return table.view(16, 9)


def quaternion_to_rotation(q: torch.Tensor) -> torch.Tensor:
    """q [..., 4] (w, x, y, z; any non-zero length: the rotation of q / |q|) -> R [..., 3, 3]."""
    with torch.autocast(q.device.type, enabled=False):  # a product in q's dtype, never bf16's
        outer = (q[..., :, None] * q[..., None, :]).flatten(-2)  # [..., 16]: q_a q_b
        rotation = outer @ device_constant("quaternion_rotation", _rotation_table, q)
        return (rotation / outer[..., ::5].sum(dim=-1, keepdim=True)).unflatten(-1, (3, 3))  # / |q|^2
