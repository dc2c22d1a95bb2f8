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
