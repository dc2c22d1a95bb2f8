"""The conditioned transformer's s side given (ConditionedTransformer.conditioning, a sampler's
calls): every block gives what it gives computing its AdaLNs and gates itself."""

import contextlib

import pytest
import torch

from featurecache.model.network import transformer
from featurecache.model.network.transformer import ConditionedTransformer, TokenLayout
from featurecache.testing.compare import summation_tolerance

BATCH, SAMPLES, LENGTH, C_A, C_S, C_Z, BLOCKS = 1, 3, 7, 16, 8, 4, 3


def _transformer(kernels: str, key_adaln: bool, nested: bool) -> ConditionedTransformer:
    model = ConditionedTransformer(
        C_A, C_S, C_Z, BLOCKS, 2, kernels, key_adaln=key_adaln, key_adaln_nested=nested
    ).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # the output gates start at zero weights: wake them up
            parameter.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("kernels", ["torch", "triton"])
@pytest.mark.parametrize("keys", ["one AdaLN", "key AdaLN", "nested key AdaLN"])
@pytest.mark.parametrize("shared_s", [False, True], ids=["s per sample", "s shared"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16 autocast"])
def test_blocks_on_a_given_s_side_match_the_blocks_computing_it(kernels, keys, shared_s, autocast, monkeypatch):
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    model = _transformer(kernels, keys != "one AdaLN", keys == "nested key AdaLN")
    a = torch.randn(BATCH, SAMPLES, LENGTH, C_A)
    s = torch.randn(BATCH, 1 if shared_s else SAMPLES, LENGTH, C_S)
    pair = torch.randn(BATCH, LENGTH, LENGTH, C_Z)
    token_mask = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    token_mask[:, -2:] = False
    layout = TokenLayout(token_mask)
    precision = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.no_grad(), precision:
        expected = model(a, s, pair, layout)
        biases = model.attention_biases(pair, layout)
        conditioning = model.conditioning(s)
        computed_here = model(a, s, pair, layout, biases)
        given = model(a, s, pair, layout, biases, conditioning)
        weights = model.conditioning_weights(torch.bfloat16 if autocast else torch.float32)
        from_stacked_weights = model(a, s, pair, layout, biases, weights)
        # a memory budget of one block's s side: the blocks in groups of one, the same values
        monkeypatch.setattr(transformer, "CONDITIONING_GROUP_BYTES", 1)
        in_groups = model(a, s, pair, layout, biases, weights)
    assert len(conditioning) == BLOCKS
    assert (conditioning[0].key is None) == (keys == "one AdaLN")
    assert conditioning[0].attention[0].shape == (*s.shape[:-1], C_A)
    torch.testing.assert_close(given, computed_here, rtol=0, atol=0)
    torch.testing.assert_close(from_stacked_weights, computed_here, rtol=0, atol=0)
    torch.testing.assert_close(in_groups, computed_here, rtol=0, atol=0)
    # fp32: the same products summed in possibly other orders; bf16: a few roundings of the
    # block outputs (2^-8 each) on the residual stream's scale
    scale = expected.abs().max().item()
    tolerance = 8 * 2**-8 * scale if autocast else summation_tolerance(torch.float32, C_A * BLOCKS) * scale
    torch.testing.assert_close(given.float(), expected.float(), rtol=0, atol=tolerance)


@pytest.mark.parametrize("gate_samples", [1, SAMPLES], ids=["gate shared", "gate per sample"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_gated_residual_is_the_sum_of_the_gated_update(gate_samples, dtype):
    """gated_residual(a, g, u) = a + g * u, with the gradients of the product and the sum (a
    shared gate's summed over the samples); in one addcmul the product is not rounded on its
    own, so at 16 bits the values may differ from the two-step reference by its rounding."""
    generator = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    a, update = (torch.randn(BATCH, SAMPLES, LENGTH, C_A, generator=generator, dtype=dtype) for _ in range(2))
    gate = torch.rand(BATCH, gate_samples, LENGTH, C_A, generator=generator, dtype=dtype)
    grad = torch.randn(BATCH, SAMPLES, LENGTH, C_A, generator=generator, dtype=dtype)
    leaves = [t.clone().requires_grad_() for t in (a, gate, update)]
    reference = [t.double().requires_grad_() for t in (a, gate, update)]
    out = transformer.gated_residual(*leaves)
    expected = reference[0] + reference[1] * reference[2]
    out.backward(grad)
    expected.backward(grad.double())
    assert out.dtype == dtype and out.shape == expected.shape
    eps = torch.finfo(dtype).eps
    # |a| + |g u| bounds each rounding of the sum; the product's own rounding is eps |g u|
    bound = 2 * eps * (a.double().abs() + (gate.double() * update.double()).abs())
    assert ((out.double() - expected.detach()).abs() <= bound).all()
    assert torch.equal(leaves[0].grad, grad)
    # d update = grad * g: one rounding; d gate = the sum over the samples of grad * u: each
    # product rounded, then up to SAMPLES - 1 additions (worst case: (n + 1) eps of the terms)
    grad64, terms = grad.double(), (grad.double() * update.double()).abs()
    assert ((leaves[2].grad.double() - reference[2].grad).abs() <= eps * (grad64 * gate.double()).abs()).all()
    summed = SAMPLES // gate_samples
    gate_bound = (summed + 1) * eps * terms.sum_to_size(gate.shape)
    assert leaves[1].grad.shape == gate.shape
    assert ((leaves[1].grad.double() - reference[1].grad).abs() <= gate_bound).all()


def test_gated_residual_with_mixed_dtypes_keeps_the_promoted_sum():
    """fp32 a with a bf16 gate and update (the atom transformer under autocast): a + g * u as
    PyTorch promotes it, the product rounded in bf16 first."""
    a = torch.randn(BATCH, SAMPLES, LENGTH, C_A)
    gate, update = (torch.randn(BATCH, SAMPLES, LENGTH, C_A, dtype=torch.bfloat16) for _ in range(2))
    out = transformer.gated_residual(a, gate, update)
    assert out.dtype == torch.float32
    assert torch.equal(out, a + gate * update)


def test_token_layout_makes_each_sample_counts_mask_once():
    token_mask = torch.tensor([[True, True, False]])
    layout = TokenLayout(token_mask)
    q = torch.zeros(1, 2, 3, 1, 4)
    first, second = layout.pack(q, q, q)[3], layout.pack(q, q, q)[3]
    assert first is second and first.is_contiguous()
    assert torch.equal(first, token_mask[:, None, :].expand(1, 2, 3))
    other = layout.pack(torch.zeros(1, 5, 3, 1, 4), q, q)[3]
    assert other.shape == (1, 5, 3) and torch.equal(other, token_mask[:, None, :].expand(1, 5, 3))
