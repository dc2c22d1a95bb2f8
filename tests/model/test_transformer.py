"""The conditioned transformer's s side given (ConditionedTransformer.conditioning, a sampler's
calls): every block gives what it gives computing its AdaLNs and gates itself. The Triton path's
training step (each AdaLN's s side from one normalisation of s shared by every block) against
the PyTorch modules, values and every gradient."""

import contextlib

import pytest
import torch

from torch.utils._python_dispatch import TorchDispatchMode

from featurecache.model.network import transformer
from featurecache.model.network.transformer import ConditionedTransformer, TokenLayout
from featurecache.testing.compare import rel_error, summation_tolerance

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


class _NormalisationsOf(TorchDispatchMode):
    """Counts the LayerNorms (forward and backward) run over tensors of one shape."""

    def __init__(self, shape: tuple) -> None:
        super().__init__()
        self.shape, self.count = shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("native_layer_norm", "native_layer_norm_backward") and tuple(args[0].shape) == self.shape:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("keys", ["one AdaLN", "nested key AdaLN"])
@pytest.mark.parametrize("group", [1, 2], ids=["a checkpoint a block", "groups of 2"])
def test_triton_training_step_matches_the_modules_with_s_normalised_once(keys, group):
    """A training forward and backward (checkpointed blocks) of the Triton path against the same
    weights run as the PyTorch modules (fp32, interpreter): the output and the gradients of a, s,
    the pair and every parameter, the AdaLNs' LayerNorm weights included (folded into their
    products' weights on the Triton path). And s is normalised once for all AdaLNs, forward and
    backward (two LayerNorm calls over s's shape), not once per AdaLN in each block's forward,
    recomputation and backward."""
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    models = {}
    for kernels in ("torch", "triton"):
        models[kernels] = ConditionedTransformer(
            C_A,
            C_S,
            C_Z,
            BLOCKS,
            2,
            kernels,
            checkpoint_group=group,
            key_adaln=keys != "one AdaLN",
            key_adaln_nested=keys != "one AdaLN",
        ).train()
    with torch.no_grad():
        for parameter in models["torch"].parameters():
            parameter.normal_(0, 0.3)
    models["triton"].load_state_dict(models["torch"].state_dict())
    a = torch.randn(BATCH, SAMPLES, LENGTH, C_A)
    s = torch.randn(BATCH, SAMPLES, LENGTH, C_S)
    pair = torch.randn(BATCH, LENGTH, LENGTH, C_Z)
    grad = torch.randn(BATCH, SAMPLES, LENGTH, C_A)
    token_mask = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    token_mask[:, -2:] = False
    results = {}
    for kernels, model in models.items():
        leaves = [t.clone().requires_grad_() for t in (a, s, pair)]
        counter = _NormalisationsOf(tuple(s.shape))
        with counter:
            out = model(*leaves, TokenLayout(token_mask))
            out.backward(grad)
        results[kernels] = (out.detach(), [leaf.grad for leaf in leaves], dict(model.named_parameters()), counter.count)
    expected, expected_inputs, expected_parameters, modules_count = results["torch"]
    actual, actual_inputs, actual_parameters, triton_count = results["triton"]
    assert modules_count >= 2 * BLOCKS * 2  # the modules: one per AdaLN, forward and backward at least
    assert triton_count == 2
    # sums over the channels of each product and block, and for the weights over the rows
    tolerance = summation_tolerance(torch.float32, C_A * BLOCKS * SAMPLES * LENGTH)
    assert rel_error(actual, expected) <= tolerance
    for name, actual_grad, expected_grad in zip(("a", "s", "pair"), actual_inputs, expected_inputs):
        assert rel_error(actual_grad, expected_grad) <= tolerance, name
    for name, parameter in expected_parameters.items():
        if parameter.grad is None:
            assert actual_parameters[name].grad is None, name
            continue
        assert rel_error(actual_parameters[name].grad, parameter.grad) <= tolerance, name
