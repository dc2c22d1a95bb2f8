"""How far a result is from the truth, for kernel tests and benchmarks.

Kernel tests and benchmarks hold a kernel's error against a float64 reference to a multiple of
PyTorch's own error in the same dtype (tests/kernels, benchmarks/op_bench.py): both sides of that
comparison must be measured the same way, so there is one function for it.
"""

from __future__ import annotations

import torch


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| (L2 over all elements), computed in float64.

    `expected` is usually a float64 reference and `actual` a result in a lower precision; both
    are detached and widened first. A NaN or infinity in `actual` gives a non-finite result, so
    that any `error <= bound` check fails on it. Two all-zero tensors are 0.0 apart; a non-zero
    `actual` against an all-zero `expected` is a huge error (the norm is floored at 1e-30, not 0).
    """
    if actual.shape != expected.shape:
        raise ValueError(f"rel_error: shapes differ, actual {tuple(actual.shape)} vs expected {tuple(expected.shape)}")
    actual64 = actual.detach().double()
    expected64 = expected.detach().double()
    return ((actual64 - expected64).norm() / expected64.norm().clamp_min(1e-30)).item()
