"""evo_attention_rows (the CPU path's attention, a block of rows at a time) against
evo_attention_reference: the same outputs and gradients to fp32 rounding, blocks that do not
divide the rows, a shared and a per-row bias, masked keys and a row with every key masked; and
what it keeps for backward: its inputs, output and rows' softmax statistics, not the [N, H, L, L]
softmax weights. The
triangle attention over it (gated_pair_attention_rows) against gated_pair_attention_reference."""

import pytest
import torch

from featurecache.kernels import reference
from featurecache.kernels.reference import evo_attention_reference, evo_attention_rows
from featurecache.testing.compare import rel_error, summation_tolerance

B, N, L, H, D = 2, 11, 13, 2, 8


def _inputs(bias_rows: int, generator: torch.Generator) -> dict:
    def leaf(*shape):
        return torch.randn(*shape, generator=generator).requires_grad_()

    mask = torch.rand(B, N, L, generator=generator) < 0.8
    mask[0, 3] = False  # a row with every key masked
    return {
        "q": leaf(B, N, L, H, D),
        "k": leaf(B, N, L, H, D),
        "v": leaf(B, N, L, H, D),
        "bias": leaf(B, bias_rows, H, L, L),
        "mask": mask,
    }


def _output_and_grads(attention, inputs: dict, grad_out: torch.Tensor, **options):
    leaves = {
        name: value.detach().clone().requires_grad_() if value.dtype.is_floating_point else value
        for name, value in inputs.items()
    }
    out = attention(**leaves, **options)
    out.backward(grad_out)
    return out.detach(), {name: leaves[name].grad for name in ("q", "k", "v", "bias")}


@pytest.mark.parametrize("bias_rows", [1, N])
@pytest.mark.parametrize("rows_per_block", [1, 4, N])
def test_rows_equal_the_reference_in_output_and_gradients(bias_rows, rows_per_block):
    generator = torch.Generator().manual_seed(bias_rows * 100 + rows_per_block)
    inputs = _inputs(bias_rows, generator)
    grad_out = torch.randn(B, N, L, H, D, generator=generator)
    expected, expected_grads = _output_and_grads(evo_attention_reference, inputs, grad_out)
    actual, grads = _output_and_grads(
        evo_attention_rows, inputs, grad_out, block_elements=rows_per_block * B * H * L * L
    )
    # the same sums per row (over D, then over L keys); the shared bias's gradient adds N rows more
    assert rel_error(actual, expected) <= summation_tolerance(torch.float32, L * D)
    for name in ("q", "k", "v", "bias"):
        assert rel_error(grads[name], expected_grads[name]) <= summation_tolerance(torch.float32, N * L * D), name
    assert actual[0, 3].abs().max() == 0 and grads["q"][0, 3].abs().max() == 0


def test_backward_keeps_the_inputs_not_the_weights():
    """Bytes autograd saves for backward: the reference keeps [B, N, H, L, L] weights (N L^3 H
    for triangle attention); the row blocks keep their inputs, the fp32 output and two fp32
    softmax statistics per row and head (peak, inverse total), nothing of size L^2 per row."""
    inputs = _inputs(1, torch.Generator().manual_seed(0))
    input_bytes = sum(value.numel() * value.element_size() for value in inputs.values())

    def saved_bytes(attention, **options) -> int:
        saved = []

        def pack(tensor):
            saved.append(tensor.numel() * tensor.element_size())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            attention(**inputs, **options)
        return sum(saved)

    weights_bytes = B * N * H * L * L * 4
    assert saved_bytes(evo_attention_reference) >= weights_bytes
    output_bytes, statistics_bytes = B * N * L * H * D * 4, 2 * B * N * H * L * 4
    assert (
        saved_bytes(evo_attention_rows, block_elements=B * H * L * L) <= input_bytes + output_bytes + statistics_bytes
    )


def test_a_masked_key_weighs_nothing_whatever_its_bias():
    """The key mask rides in the product as a MASKED_LOGIT term: a masked key's weight is 0 even
    under a bias far above every kept key's (here +1e4 against 0), and a kept key's logit is the
    reference's (its extra term is an exact 0)."""
    generator = torch.Generator().manual_seed(5)
    inputs = _inputs(N, generator)
    with torch.no_grad():
        inputs["bias"].zero_()
        inputs["bias"][..., 0] = 1e4  # key 0 of every row: masked in some rows, kept in others
    grad_out = torch.randn(B, N, L, H, D, generator=generator)
    expected, expected_grads = _output_and_grads(evo_attention_reference, inputs, grad_out)
    actual, grads = _output_and_grads(evo_attention_rows, inputs, grad_out, block_elements=B * H * L * L)
    assert torch.isfinite(actual).all() and all(torch.isfinite(grad).all() for grad in grads.values())
    assert rel_error(actual, expected) <= summation_tolerance(torch.float32, L * D)
    for name in ("q", "k", "v", "bias"):
        assert rel_error(grads[name], expected_grads[name]) <= summation_tolerance(torch.float32, N * L * D), name


@pytest.mark.parametrize("transpose", [False, True])
def test_gated_pair_attention_rows_is_the_reference_over_row_blocks(transpose, monkeypatch):
    """The CPU path's triangle attention (gated_pair_attention_rows) against
    gated_pair_attention_reference, in value and in the packed projection's gradient, around
    the starting (rows) and the ending node (columns), with rows split over several blocks."""
    length, extra = 15, 3  # packed columns past q, k, v, gate and bias (the aligned row's padding)
    monkeypatch.setattr(reference, "ROW_BLOCK_ELEMENTS", 4 * H * length * length)  # 4 rows a block
    generator = torch.Generator().manual_seed(7 + transpose)
    packed = torch.randn(1, length, length, 4 * H * D + H + extra, generator=generator, requires_grad=True)
    mask = torch.rand(1, length, length, generator=generator) < 0.8
    mask[0, 2] = False  # a row (a column with transpose) with no key
    mask[0, :, 2] = False
    grad_out = torch.randn(1, length, length, H * D, generator=generator)

    def run(function):
        leaf = packed.detach().clone().requires_grad_()
        out = function(leaf, mask, H, D, transpose=transpose)
        out.backward(grad_out)
        return out.detach(), leaf.grad

    actual, actual_grad = run(reference.gated_pair_attention_rows)
    expected, expected_grad = run(reference.gated_pair_attention_reference)
    assert rel_error(actual, expected) <= summation_tolerance(torch.float32, length * D)
    # the bias's gradient sums over the L rows of every block
    assert rel_error(actual_grad, expected_grad) <= summation_tolerance(torch.float32, length * length * D)
