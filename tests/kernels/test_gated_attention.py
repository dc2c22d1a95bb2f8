"""gated_pair_attention (triangle attention's packed core), sigmoid_gate (the other attention
modules' output gate) and swiglu against a float64 reference.

Under TRITON_INTERPRET=1 on the CPU: small odd lengths, two heads. The packed input is read as
the projection writes it (rows padded to 16 elements) and as a plain contiguous tensor; the
packed gradient, which the op writes itself, must match autograd through the reference.
"""

from __future__ import annotations

import pytest
import torch

from featurecache.kernels.gated_attention import gated_pair_attention, sigmoid_gate, swiglu
from featurecache.kernels.reference import gated_pair_attention_reference, sigmoid_gate_reference, swiglu_reference
from featurecache.testing.compare import rel_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ERROR_FACTOR, ERROR_FLOOR = 3.0, {torch.float32: 1e-5, torch.bfloat16: 2e-3}


def _packed(batch, length, heads, head_dim, aligned, dtype, generator):
    width = 4 * heads * head_dim + heads
    row = -(-width // 16) * 16 if aligned else width
    base = torch.randn(batch, length, length, row, generator=generator).to(DEVICE, dtype)
    return base[..., :width]


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length, aligned, masked", [(7, True, True), (13, False, True), (10, True, False)])
def test_matches_float64_reference_with_every_gradient(transpose, dtype, length, aligned, masked):
    generator = torch.Generator().manual_seed(torch.seed() % 2**31)
    heads, head_dim, batch = 2, 16, 2
    packed = _packed(batch, length, heads, head_dim, aligned, dtype, generator).requires_grad_(False)
    mask = None
    if masked:
        token = torch.arange(length)[None, :] < torch.tensor([[length], [length - 3]])
        mask = (token[:, :, None] & token[:, None, :]).to(DEVICE)
        mask[1, 2, :] = False  # a fully masked row
    upstream = torch.randn(batch, length, length, heads * head_dim, generator=generator).to(DEVICE, dtype)

    def run(function, tensor):
        leaf = tensor.detach().requires_grad_(True)
        out = function(leaf, mask, heads, head_dim, transpose=transpose)
        (out * upstream.to(out.dtype)).sum().backward()
        return out.detach(), leaf.grad

    truth_out, truth_grad = run(gated_pair_attention_reference, packed.double())
    out, grad = run(gated_pair_attention, packed)
    eager_out, eager_grad = run(gated_pair_attention_reference, packed)  # PyTorch in the same dtype
    assert out.shape == truth_out.shape and out.dtype == dtype
    for name, mine, eager, truth in (("out", out, eager_out, truth_out), ("d_packed", grad, eager_grad, truth_grad)):
        assert torch.isfinite(mine).all(), f"{name}: non-finite value"
        allowed = ERROR_FACTOR * rel_error(eager, truth) + ERROR_FLOOR[dtype]
        assert rel_error(mine, truth) <= allowed, (name, rel_error(mine, truth), allowed)


def test_bad_shapes_are_named():
    packed = torch.zeros(1, 5, 5, 20)
    with pytest.raises(ValueError, match="packed has shape"):
        gated_pair_attention(packed, None, 2, 8)  # needs 4 * 16 + 2 = 66 columns
    with pytest.raises(ValueError, match="mask is"):
        gated_pair_attention(torch.zeros(1, 5, 5, 66), torch.ones(1, 5, 4, dtype=torch.bool), 2, 8)


@pytest.mark.parametrize(
    "gate_dtype, out_dtype",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)],
)
@pytest.mark.parametrize("batch, rows, length, channels", [(2, 3, 7, 24), (1, 1, 13, 40)])
@pytest.mark.parametrize(
    "function, reference",
    [(sigmoid_gate, sigmoid_gate_reference), (swiglu, swiglu_reference)],
    ids=["sigmoid", "swish"],
)
def test_gate_matches_float64_reference(function, reference, gate_dtype, out_dtype, batch, rows, length, channels):
    """The gate as the conditioned attention reads it: a strided slice of a packed projection
    [.., 4C], the attention output contiguous, possibly wider (fp32 atom activations)."""
    generator = torch.Generator().manual_seed(torch.seed() % 2**31)
    packed = torch.randn(batch, rows, length, 4 * channels, generator=generator).to(DEVICE, gate_dtype)
    out = torch.randn(batch, rows, length, channels, generator=generator).to(DEVICE, out_dtype)
    upstream = torch.randn(batch, rows, length, channels, generator=generator).to(DEVICE, gate_dtype)

    def run(function, packed, out):
        packed, out = packed.detach().requires_grad_(True), out.detach().requires_grad_(True)
        gated = function(packed[..., 3 * channels :], out)
        (gated * upstream.to(gated.dtype)).sum().backward()
        return gated.detach(), packed.grad, out.grad

    truth = run(reference, packed.double(), out.double())
    mine = run(function, packed, out)
    eager = run(reference, packed, out)  # PyTorch in the same dtypes
    assert mine[0].dtype == gate_dtype and mine[2].dtype == out_dtype
    assert mine[1][..., : 3 * channels].abs().max() == 0  # the slice's gradient lands in the slice only
    for name, value, eager_value, true_value in zip(("gated", "d_packed", "d_out"), mine, eager, truth):
        assert torch.isfinite(value).all(), f"{name}: non-finite value"
        floor = ERROR_FLOOR[torch.bfloat16 if torch.bfloat16 in (gate_dtype, value.dtype) else torch.float32]
        allowed = ERROR_FACTOR * rel_error(eager_value, true_value) + floor
        assert rel_error(value, true_value) <= allowed, (name, rel_error(value, true_value), allowed)


def test_gates_name_mismatched_shapes():
    for function, name in ((sigmoid_gate, "sigmoid_gate"), (swiglu, "swiglu")):
        with pytest.raises(ValueError, match=f"{name}: gate"):
            function(torch.zeros(1, 2, 3, 8, device=DEVICE), torch.zeros(1, 2, 3, 4, device=DEVICE))
