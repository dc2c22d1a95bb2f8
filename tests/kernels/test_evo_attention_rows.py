"""evo_attention_rows (the CPU path's attention, a block of rows at a time) against
evo_attention_reference: the same outputs and gradients to fp32 rounding, blocks that do not
divide the rows, a shared and a per-row bias, masked keys and a row with every key masked; and
what it keeps for backward: its inputs and output, not the [N, H, L, L] softmax weights."""

import pytest
import torch

from featurecache.kernels.reference import evo_attention_rows
from featurecache.kernels.reference import evo_attention_reference
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
    for triangle attention); the row blocks keep their inputs and the fp32 output alone."""
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
    output_bytes = B * N * L * H * D * 4
    assert saved_bytes(evo_attention_rows, block_elements=B * H * L * L) <= input_bytes + output_bytes
