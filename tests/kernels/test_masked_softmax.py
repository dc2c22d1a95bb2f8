"""masked_softmax (the references' softmax over kept keys): each row's weights are the softmax of
its kept keys' logits and 0 on the masked ones, a row with no key kept is all zeros, in value and
in gradient, whether or not the tensor has such a row."""

import pytest
import torch

from featurecache.kernels.reference import masked_softmax
from featurecache.testing.compare import rel_error, summation_tolerance

ROWS, KEYS = 12, 37


def _expected(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Row by row in float64: softmax over the kept keys, zeros elsewhere."""
    out = torch.zeros(logits.shape, dtype=torch.float64)
    for row in range(logits.shape[0]):
        kept = keep[row]
        if kept.any():
            out[row, kept] = torch.softmax(logits[row, kept].double(), dim=-1)
    return out


@pytest.mark.parametrize("empty_row", [False, True])
def test_weights_over_kept_keys_and_zero_rows(empty_row):
    generator = torch.Generator().manual_seed(int(empty_row))
    logits = torch.randn(ROWS, KEYS, generator=generator, requires_grad=True)
    keep = torch.rand(ROWS, KEYS, generator=generator) < 0.6
    keep[:, 0] = True
    if empty_row:
        keep[4] = False
    upstream = torch.randn(ROWS, KEYS, generator=generator)
    weights = masked_softmax(logits.clone(), keep)  # in place on its input, as the references call it
    (weights * upstream).sum().backward()
    truth_logits = logits.detach().double().requires_grad_()
    truth = _expected(truth_logits, keep)
    (truth * upstream.double()).sum().backward()
    # sums over at most KEYS terms per row
    assert rel_error(weights, truth) <= summation_tolerance(torch.float32, KEYS)
    assert rel_error(logits.grad, truth_logits.grad) <= summation_tolerance(torch.float32, KEYS)
    assert weights[~keep].abs().max() == 0 and logits.grad[~keep].abs().max() == 0
    if empty_row:
        assert weights[4].abs().max() == 0
