"""gated_pair_attention (triangle attention's packed core), gated_attention (the conditioned
attention's), sigmoid_gate (the other attention modules' output gate), swiglu and swiglu_packed
against a float64 reference.

Under TRITON_INTERPRET=1 on the CPU: small odd lengths, two heads. The packed input is read as
the projection writes it (rows padded to 16 elements) and as a plain contiguous tensor; the
packed gradient, which the op writes itself, must match autograd through the reference.
"""

from __future__ import annotations

import pytest
import torch

from featurecache.kernels.gated_attention import (
    gated_attention,
    gated_pair_attention,
    sigmoid_gate,
    swiglu,
    swiglu_packed,
)
from featurecache.kernels.reference import (
    evo_attention_reference,
    gated_pair_attention_reference,
    sigmoid_gate_reference,
    swiglu_reference,
)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch, rows, length, channels, sliced", [(2, 3, 7, 24, False), (1, 1, 13, 20, True)])
def test_packed_swiglu_matches_float64_reference(dtype, batch, rows, length, channels, sliced):
    """silu(first half) * second half of one product's output, and the packed gradient its
    backward writes (both halves in one tensor), against autograd through the composition; the
    input a plain contiguous tensor or a slice of a wider one (copied to contiguous first)."""
    generator = torch.Generator().manual_seed(torch.seed() % 2**31)
    wide = 2 * channels + (6 if sliced else 0)
    base = torch.randn(batch, rows, length, wide, generator=generator).to(DEVICE, dtype)
    upstream = torch.randn(batch, rows, length, channels, generator=generator).to(DEVICE, dtype)

    def run(function, base):
        base = base.detach().requires_grad_(True)
        packed = base[..., : 2 * channels]
        gated = function(packed)
        (gated * upstream.to(gated.dtype)).sum().backward()
        return gated.detach(), base.grad

    def composition(packed):
        return swiglu_reference(packed[..., :channels], packed[..., channels:])

    truth = run(composition, base.double())
    mine = run(swiglu_packed, base)
    eager = run(composition, base)
    assert mine[0].dtype == dtype and mine[0].shape == (batch, rows, length, channels)
    assert not mine[1][..., 2 * channels :].any()  # nothing lands past the packed halves
    for name, value, eager_value, true_value in zip(("gated", "d_packed"), mine, eager, truth):
        assert torch.isfinite(value).all(), f"{name}: non-finite value"
        allowed = ERROR_FACTOR * rel_error(eager_value, true_value) + ERROR_FLOOR[dtype]
        assert rel_error(value, true_value) <= allowed, (name, rel_error(value, true_value), allowed)


def test_packed_swiglu_names_an_odd_width():
    with pytest.raises(ValueError, match="swiglu_packed: the last axis"):
        swiglu_packed(torch.zeros(1, 2, 3, 9, device=DEVICE))


def _gated_attention_composed(packed, bias, mask, heads):
    """What the conditioned attention composed before gated_attention: split, attend, gate."""
    q, k, v, gate = packed.chunk(4, dim=-1)
    q, k, v = (t.unflatten(-1, (heads, -1)) for t in (q, k, v))
    return sigmoid_gate_reference(gate, evo_attention_reference(q, k, v, bias, mask).flatten(-2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("samples, length, shared_bias", [(3, 11, True), (2, 16, False), (1, 9, True)])
def test_gated_attention_matches_float64_reference_with_every_gradient(dtype, samples, length, shared_bias):
    """The diffusion transformer's attention from its packed projection (odd lengths, a key
    mask with a fully masked row, the pair bias shared by the samples or one per sample): the
    output and the gradients of the packed projection (written by the op as one tensor) and the
    pair bias against autograd through the float64 composition."""
    generator = torch.Generator().manual_seed(torch.seed() % 2**31)
    batch, heads, head_dim = 2, 2, 16
    width = heads * head_dim
    packed = torch.randn(batch, samples, length, 4 * width, generator=generator).to(DEVICE, dtype)
    bias = torch.randn(batch, 1 if shared_bias else samples, heads, length, length, generator=generator)
    bias = bias.to(DEVICE, dtype)
    token = torch.arange(length)[None, :] < torch.tensor([[length], [length - 3]])
    mask = token[:, None, :].expand(batch, samples, length).clone().to(DEVICE)
    mask[1, 0, :] = False  # a row with every key masked: zeros out, no gradient
    upstream = torch.randn(batch, samples, length, width, generator=generator).to(DEVICE, dtype)

    def run(function, *tensors):
        leaves = [t.detach().requires_grad_(True) for t in tensors]
        out = function(*leaves, mask, heads)
        (out * upstream.to(out.dtype)).sum().backward()
        return (out.detach(), *(leaf.grad for leaf in leaves))

    truth = run(_gated_attention_composed, packed.double(), bias.double())
    mine = run(gated_attention, packed, bias)
    eager = run(_gated_attention_composed, packed, bias)  # PyTorch in the same dtype
    assert mine[0].shape == (batch, samples, length, width) and mine[0].dtype == dtype
    for name, value, eager_value, true_value in zip(("out", "d_packed", "d_bias"), mine, eager, truth):
        assert torch.isfinite(value).all(), f"{name}: non-finite value"
        allowed = ERROR_FACTOR * rel_error(eager_value, true_value) + ERROR_FLOOR[dtype]
        assert rel_error(value, true_value) <= allowed, (name, rel_error(value, true_value), allowed)


def test_gated_attention_names_a_bad_shape():
    with pytest.raises(ValueError, match="gated_attention: packed has shape"):
        gated_attention(torch.zeros(1, 2, 5, 30, device=DEVICE), None, None, 2)
