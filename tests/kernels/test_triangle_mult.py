"""TriangleMultiplication: Triton kernels (interpreted on CPU) against the PyTorch reference."""

import pytest
import torch

from featurecache.kernels.reference import triangle_mult_reference
from featurecache.kernels.triangle_mult import TriangleMultiplication, triangle_mult
from featurecache.testing.compare import rel_error

# Triton's error against an fp64 truth may be at most this multiple of PyTorch's own error in the
# same dtype, plus a floor for cases where PyTorch happens to be (near) exact.
ERROR_MULTIPLE = 3.0
ERROR_FLOOR = {torch.float32: 1e-6, torch.bfloat16: 1e-3}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PARAM_NAMES = [
    "norm_in_weight",
    "norm_in_bias",
    "weight_a_p",
    "weight_a_g",
    "weight_b_p",
    "weight_b_g",
    "weight_g",
    "norm_out_weight",
    "norm_out_bias",
    "weight_z",
]


def _random_params(dim, hidden, generator):
    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=generator) * scale

    return [
        1.0 + 0.5 * rand(dim),
        0.5 * rand(dim),
        *(rand(hidden, dim, scale=dim**-0.5) for _ in range(4)),
        rand(dim, dim, scale=dim**-0.5),
        1.0 + 0.5 * rand(hidden),
        0.5 * rand(hidden),
        rand(dim, hidden, scale=hidden**-0.5),
    ]


def _check(batch, length, dim, hidden, direction, masked, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(batch, length, length, dim, generator=generator) * 1.5 + 0.2
    mask = None
    if masked:
        mask = torch.rand(batch, length, length, generator=generator) > 0.25
        mask[0, :, -1] = False  # a fully masked column of pairs
    params = _random_params(dim, hidden, generator)
    grad_out = torch.randn(batch, length, length, dim, generator=generator).to(DEVICE)
    z, params = z.to(DEVICE), [p.to(DEVICE) for p in params]
    mask = None if mask is None else mask.to(DEVICE)

    def run(fn, z_dtype, param_dtype):
        leaves = [z.to(z_dtype).requires_grad_()]
        leaves += [p.to(param_dtype).requires_grad_() for p in params]
        out = fn(leaves[0], mask, *leaves[1:], direction=direction, eps=1e-5)
        return [out, *torch.autograd.grad(out, leaves, grad_out.to(out.dtype))]

    truth = run(triangle_mult_reference, torch.float64, torch.float64)
    torch_result = run(triangle_mult_reference, dtype, torch.float32)
    triton_result = run(triangle_mult, dtype, torch.float32)
    names = ["out", "dz", *(f"d_{name}" for name in PARAM_NAMES)]
    for name, mine, ref, exact in zip(names, triton_result, torch_result, truth):
        assert mine.dtype == ref.dtype and mine.shape == ref.shape, name
        assert torch.isfinite(mine).all(), name
        mine_err, torch_err = rel_error(mine, exact), rel_error(ref, exact)
        assert mine_err <= ERROR_MULTIPLE * torch_err + ERROR_FLOOR[dtype], (
            f"{name}: triton error {mine_err:.2e} vs torch {torch_err:.2e} ({dtype}, "
            f"B={batch} L={length} C={dim} H={hidden} {direction} mask={masked}, seed {seed})"
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "batch, length, dim, hidden, direction, masked",
    [
        (1, 11, 16, 16, "outgoing", True),
        (2, 7, 24, 20, "incoming", True),
        (2, 7, 16, 24, "outgoing", False),
        (1, 5, 24, 16, "incoming", False),
    ],
)
def test_matches_reference(batch, length, dim, hidden, direction, masked, dtype):
    _check(batch, length, dim, hidden, direction, masked, dtype, seed=torch.seed() % 2**31)


@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
def test_state_dict_moves_between_kernel_choices(direction):
    fused = TriangleMultiplication(16, direction=direction, kernels="triton")
    with torch.no_grad():
        for norm in (fused.norm_in, fused.norm_out):
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
    assert sorted(fused.state_dict()) == sorted(
        f"{name}.{kind}"
        for name, kind in [
            ("norm_in", "weight"),
            ("norm_in", "bias"),
            ("linear_a_p", "weight"),
            ("linear_a_g", "weight"),
            ("linear_b_p", "weight"),
            ("linear_b_g", "weight"),
            ("linear_g", "weight"),
            ("norm_out", "weight"),
            ("norm_out", "bias"),
            ("linear_z", "weight"),
        ]
    )
    plain = TriangleMultiplication(16, direction=direction, kernels="torch")
    plain.load_state_dict(fused.state_dict())
    z = torch.randn(1, 9, 9, 16)
    mask = torch.rand(1, 9, 9) > 0.2
    torch.testing.assert_close(fused(z, mask), plain(z, mask), rtol=1e-5, atol=1e-5)
    # Algorithm 12/13 written out with the modules and an explicit loop-free einsum
    zn = fused.norm_in(z)
    keep = mask[..., None].float()
    a = torch.sigmoid(fused.linear_a_g(zn)) * fused.linear_a_p(zn) * keep
    b = torch.sigmoid(fused.linear_b_g(zn)) * fused.linear_b_p(zn) * keep
    spec = "bikc,bjkc->bijc" if direction == "outgoing" else "bkic,bkjc->bijc"
    x = torch.einsum(spec, a, b)
    expected = torch.sigmoid(fused.linear_g(zn)) * fused.linear_z(fused.norm_out(x))
    torch.testing.assert_close(fused(z, mask), expected, rtol=1e-5, atol=1e-5)


def test_hidden_dim_defaults_to_dim():
    module = TriangleMultiplication(24)
    assert module.linear_a_p.weight.shape == (24, 24)
    assert module.norm_out.normalized_shape == (24,)


def test_fully_masked_pairs_get_zero_gradient_through_projections():
    module = TriangleMultiplication(16, 16)
    with torch.no_grad():
        module.norm_out.bias.normal_()  # x = 0 everywhere, so the update is gate * linear_z(bias)
    z = torch.randn(1, 6, 6, 16, requires_grad=True)
    mask = torch.zeros(1, 6, 6, dtype=torch.bool)
    module(z, mask).sum().backward()
    for name in ("linear_a_p", "linear_a_g", "linear_b_p", "linear_b_g"):
        assert getattr(module, name).weight.grad.abs().sum() == 0, name
    assert module.linear_g.weight.grad.abs().sum() > 0


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="direction"):
        TriangleMultiplication(16, direction="sideways")
    module = TriangleMultiplication(16)
    with pytest.raises(ValueError, match="mask"):
        module(torch.randn(1, 5, 5, 16), torch.ones(1, 5, 5))
    with pytest.raises(ValueError, match=r"\[B, L, L, C\]"):
        module(torch.randn(1, 5, 4, 16))
