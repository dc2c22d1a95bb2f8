"""residual_add: the fused fp32 + bf16 residual add against its PyTorch composition."""

import pytest
import torch

from featurecache.kernels.residual import residual_add, residual_add_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("use", ["both", "fp32 only", "bf16 only"])
def test_matches_the_composition_in_value_and_gradient(use):
    shape = (2, 7, 7, 24)  # 2352 elements: more than one program of 2048, the last one ragged
    z = torch.randn(shape, device=DEVICE)
    update = torch.randn(shape, device=DEVICE).to(torch.bfloat16)
    d_new = torch.randn(shape, device=DEVICE)
    d_low = torch.randn(shape, device=DEVICE).to(torch.bfloat16)
    results = []
    for function in (residual_add, residual_add_reference):
        z_leaf, update_leaf = z.clone().requires_grad_(True), update.clone().requires_grad_(True)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            new, low = function(z_leaf, update_leaf)
        assert new.dtype == torch.float32 and low.dtype == torch.bfloat16
        loss = 0
        if use != "bf16 only":
            loss = loss + (new * d_new).sum()
        if use != "fp32 only":
            loss = loss + (low.float() * d_low.float()).sum()
        loss.backward()
        results.append((new.detach(), low.detach(), z_leaf.grad, update_leaf.grad))
    for mine, ref in zip(*results):
        assert mine.dtype == ref.dtype
        torch.testing.assert_close(mine, ref, rtol=0, atol=0)  # same operations, same rounding


def test_without_autocast_both_results_are_the_sum():
    z, update = torch.randn(3, 5, device=DEVICE), torch.randn(3, 5, device=DEVICE)
    new, low = residual_add(z, update)
    assert new is low
    torch.testing.assert_close(new, z + update)
