"""summation_tolerance: float32 sums added in another order stay within it, and it follows how
their rounding error grows with the length of the sum (sqrt(n), not n)."""

import math

import numpy as np
import pytest
import torch

from featurecache.testing.compare import rel_error, summation_tolerance


@pytest.mark.parametrize("length", [17, 1000, 100_000])
def test_sequential_and_reversed_sums_stay_within_the_tolerance_and_near_it(length):
    terms = np.random.default_rng(length).standard_normal((64, length)).astype(np.float32)  # 64 sums
    forward = torch.from_numpy(np.cumsum(terms, axis=1)[:, -1])  # one float32 addition after another
    backward = torch.from_numpy(np.cumsum(terms[:, ::-1], axis=1)[:, -1])
    exact = torch.from_numpy(terms.astype(np.float64).sum(axis=1))
    tolerance = summation_tolerance(torch.float32, length)
    for error in (rel_error(forward, exact), rel_error(backward, exact), rel_error(forward, backward.double())):
        # sequential sums are the worst order numpy or torch use; their error is a steady
        # fraction of the tolerance at every length (n * eps would be 80x too loose at 100 000)
        assert tolerance / 100 <= error <= tolerance, (length, error / tolerance)


def test_tolerance_follows_dtype_and_length():
    eps = torch.finfo(torch.float32).eps
    assert summation_tolerance(torch.float32, 100) == pytest.approx(4 * math.sqrt(100) * eps)
    assert summation_tolerance(torch.float32, 100, worst_case=True) == pytest.approx(100 * eps)
    assert summation_tolerance(torch.bfloat16, 100) == pytest.approx(4 * 10 * torch.finfo(torch.bfloat16).eps)
    with pytest.raises(ValueError, match="reduction_size must be >= 1, got 0"):
        summation_tolerance(torch.float32, 0)
