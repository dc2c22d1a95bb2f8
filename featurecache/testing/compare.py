"""How far a result is from the truth, and how far it may be, for tests and benchmarks.

Kernel tests and benchmarks hold a kernel's error against a float64 reference to a multiple of
PyTorch's own error in the same dtype (tests/kernels, benchmarks/op_bench.py): both sides of that
comparison must be measured the same way, so there is one function for it (`rel_error`). Two
computations of one result that differ only in the order of their sums (checkpointed against
plain, sharded against whole, one thread count against another) are held to
`summation_tolerance`, which follows from the dtype and the length of the sums, not from what one
machine happened to measure.
"""

from __future__ import annotations

import math

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


# Multiple of the typical rounding error sqrt(n) * eps that two summation orders may differ by:
# the typical error's spread over many elements and a few sums chained behind the longest one.
SUMMATION_SAFETY = 4.0


def summation_tolerance(dtype: torch.dtype, reduction_size: int, worst_case: bool = False) -> float:
    """Relative tolerance (for `rel_error`) between two results in `dtype` whose sums of up to
    `reduction_size` terms were added in different orders.

    Each addition rounds to `dtype`, so a sum of n terms carries a relative error of about
    sqrt(n) * eps (rounding errors of either sign add like a random walk); two orders, one per
    machine, BLAS or thread count, differ by about as much: SUMMATION_SAFETY * sqrt(n) * eps.
    `worst_case=True` gives n * eps, the bound for every rounding going one way (Higham, Accuracy
    and Stability of Numerical Algorithms, section 4.2): use it where the sums are chained through
    many layers (a whole model's backward), whose rounding errors compound instead of averaging.
    """
    if reduction_size < 1:
        raise ValueError(f"summation_tolerance: reduction_size must be >= 1, got {reduction_size}")
    eps = torch.finfo(dtype).eps
    return reduction_size * eps if worst_case else SUMMATION_SAFETY * math.sqrt(reduction_size) * eps
