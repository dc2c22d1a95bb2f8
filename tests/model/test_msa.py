"""embed_msa, the MSA module's input projection without the [B, S, N, 34] one-hot features,
against the linear layer on msa_features, in value and in the weight's gradient."""

import pytest
import torch

from featurecache.model.network.msa import MSA_FEATURE_DIM, embed_msa, msa_features
from featurecache.testing.compare import rel_error, summation_tolerance
from featurecache.testing.synthetic import random_batch


@pytest.mark.parametrize("bias", [False, True])
def test_embed_msa_is_the_linear_map_of_the_msa_features(bias):
    generator = torch.Generator().manual_seed(11)
    batch = random_batch([30, 17], [9, 5], [1, 1], generator)
    assert (batch["deletion_matrix"] > 0).any() and (batch["deletion_matrix"] == 0).any()
    linear = torch.nn.Linear(MSA_FEATURE_DIM, 6, bias=bias)
    upstream = torch.randn(2, 9, 30, 6, generator=generator)
    actual = embed_msa(linear, batch)
    (actual * upstream).sum().backward()
    actual_grads = [parameter.grad.clone() for parameter in linear.parameters()]
    linear.zero_grad()
    expected = linear(msa_features(batch))
    (expected * upstream).sum().backward()
    # at most four non-zero terms per value (class, two deletion features, bias); the parameters'
    # gradients sum over the B S N positions
    assert rel_error(actual, expected) <= summation_tolerance(torch.float32, 4)
    for actual_grad, parameter in zip(actual_grads, linear.parameters(), strict=True):
        assert rel_error(actual_grad, parameter.grad) <= summation_tolerance(torch.float32, 2 * 9 * 30)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the dtype the linear layer would give
        assert embed_msa(linear, batch).dtype == linear(msa_features(batch)).dtype == torch.bfloat16
