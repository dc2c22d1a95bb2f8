"""LayerNormLinear: Triton kernels (interpreted on CPU) against the PyTorch reference."""

import pytest
import torch

from featurecache.kernels.layernorm_linear import (
    LayerNormLinear,
    layernorm_linear,
    layernorm_linear_bwd,
    layernorm_linear_fwd,
)
from featurecache.kernels.reference import layernorm_linear_reference
from featurecache.kernels.runtime import override_config
from featurecache.testing.compare import rel_error

# Triton's error against an fp64 truth may be at most this multiple of PyTorch's own error in the
# same dtype, plus a floor for cases where PyTorch happens to be (near) exact.
ERROR_MULTIPLE = 3.0
ERROR_FLOOR = {torch.float32: 1e-6, torch.bfloat16: 1e-3}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _random_params(in_features, out_features, bias, generator):
    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=generator) * scale

    return [
        1.0 + 0.5 * rand(in_features),
        0.5 * rand(in_features),
        rand(out_features, in_features, scale=in_features**-0.5),
        0.5 * rand(out_features) if bias else None,
    ]


def _check(shape, out_features, bias, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    in_features = shape[-1]
    x = torch.randn(*shape, generator=generator) * 2.0 + 0.5
    params = _random_params(in_features, out_features, bias, generator)
    grad_out = torch.randn(*shape[:-1], out_features, generator=generator).to(DEVICE)
    x = x.to(DEVICE)
    params = [None if p is None else p.to(DEVICE) for p in params]

    def run(fn, x_dtype, param_dtype):
        leaves = [x.to(x_dtype).requires_grad_()]
        leaves += [None if p is None else p.to(param_dtype).requires_grad_() for p in params]
        out = fn(*leaves, eps=1e-5)
        used = [t for t in leaves if t is not None]
        grads = torch.autograd.grad(out, used, grad_out.to(out.dtype))
        return [out, *grads]

    truth = run(layernorm_linear_reference, torch.float64, torch.float64)
    torch_result = run(layernorm_linear_reference, dtype, torch.float32)
    triton_result = run(layernorm_linear, dtype, torch.float32)
    names = ["out", "dx", "d_norm_weight", "d_norm_bias", "d_weight", "d_bias"]
    for name, mine, ref, exact in zip(names, triton_result, torch_result, truth):
        assert mine.dtype == ref.dtype and mine.shape == ref.shape, name
        assert torch.isfinite(mine).all(), name
        mine_err, torch_err = rel_error(mine, exact), rel_error(ref, exact)
        assert mine_err <= ERROR_MULTIPLE * torch_err + ERROR_FLOOR[dtype], (
            f"{name}: triton error {mine_err:.2e} vs torch {torch_err:.2e} ({dtype}, {shape}, seed {seed})"
        )


@pytest.mark.parametrize("weight_grads", ["recompute", "matmul"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape, out_features, bias",
    [((37, 24), 40, True), ((3, 5, 7, 16), 16, False), ((1, 24), 17, True)],
)
def test_matches_reference(shape, out_features, bias, dtype, weight_grads):
    with override_config("layernorm_linear", "bwd_dw", WEIGHT_GRADS=weight_grads):
        _check(shape, out_features, bias, dtype, seed=torch.seed() % 2**31)


@pytest.mark.parametrize("n_tiles", [1, 3, 64])
def test_forward_programs_owning_several_output_tiles_match_reference(n_tiles):
    # 40 outputs in tiles of 16: 3 tiles, shared by programs n_tiles at a time
    with override_config("layernorm_linear", "fwd", N_TILES=n_tiles):
        _check((37, 24), 40, True, torch.bfloat16, seed=torch.seed() % 2**31)


def test_gradient_in_a_wider_buffer_is_read_in_place_and_its_padding_ignored():
    # the projection's gradient arrives as a view of an aligned buffer (gated_pair_attention): the
    # kernels read each row up to the stride and must zero the padding, here NaN
    generator = torch.Generator().manual_seed(5)
    norm_w, norm_b, weight, _ = _random_params(16, 21, False, generator)
    x = torch.randn(37, 16, generator=generator)
    _, mean, rstd = layernorm_linear_fwd(x, norm_w, norm_b, weight, None, 1e-5)
    padded = torch.full((37, 32), float("nan"))
    padded[:, :21] = torch.randn(37, 21, generator=generator)
    for weight_grads in ("recompute", "matmul"):
        with override_config("layernorm_linear", "bwd_dw", WEIGHT_GRADS=weight_grads):
            in_place = layernorm_linear_bwd(padded[:, :21], x, norm_w, norm_b, weight, mean, rstd, True)
            compact = layernorm_linear_bwd(padded[:, :21].contiguous(), x, norm_w, norm_b, weight, mean, rstd, True)
        for mine, ref in zip(in_place, compact):
            assert torch.isfinite(mine).all()
            torch.testing.assert_close(mine, ref, rtol=0, atol=0)


def test_state_dict_moves_between_kernel_choices():
    fused = LayerNormLinear(24, 33, kernels="triton")
    with torch.no_grad():
        fused.norm.weight.normal_(1.0, 0.3)
        fused.norm.bias.normal_(0.0, 0.3)
    plain = LayerNormLinear(24, 33, kernels="torch")
    plain.load_state_dict(fused.state_dict())
    assert list(fused.state_dict()) == ["norm.weight", "norm.bias", "linear.weight", "linear.bias"]
    x = torch.randn(2, 19, 24)
    torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-5)
    reference = torch.nn.Sequential(torch.nn.LayerNorm(24), torch.nn.Linear(24, 33))
    reference.load_state_dict(
        {k.replace("norm.", "0.").replace("linear.", "1."): v for k, v in fused.state_dict().items()}
    )
    torch.testing.assert_close(fused(x), reference(x), rtol=1e-5, atol=1e-5)


def test_zero_rows_give_empty_output_and_zero_grads():
    module = LayerNormLinear(16, 20)
    x = torch.randn(0, 16, requires_grad=True)
    out = module(x)
    assert out.shape == (0, 20)
    out.sum().backward()
    assert module.linear.weight.grad.abs().sum() == 0


def test_rejects_bad_arguments(monkeypatch):
    with pytest.raises(ValueError, match="kernels must be one of"):
        LayerNormLinear(16, 16, kernels="cuda")
    module = LayerNormLinear(16, 16)
    with pytest.raises(ValueError, match="16"):
        module(torch.randn(4, 15))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="kernels='torch'"):
        module(torch.randn(4, 16))


def test_autocast_runs_the_kernel_in_its_dtype():
    # An fp32 residual stream under autocast: the kernel computes in bf16 like nn.Linear does
    # (not in exact fp32, which skips the tensor cores), and the gradient reaches x in fp32.
    generator = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 7, 24, generator=generator) * 2.0).requires_grad_()
    params = [p.requires_grad_() for p in _random_params(24, 16, True, generator)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layernorm_linear(x, *params)
        expected = layernorm_linear_reference(x, *params)
    assert y.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), expected.float(), rtol=3e-2, atol=3e-2)
    y.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in params)


def test_aligned_rows_give_the_same_values_in_16_element_aligned_rows():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 7, 16, generator=generator)
    params = [p.requires_grad_() for p in _random_params(16, 21, True, generator)]
    grad_out = torch.randn(2, 5, 7, 21, generator=generator)
    results = []
    for aligned in (False, True):
        leaf = x.clone().requires_grad_()
        out = layernorm_linear(leaf, *params, eps=1e-5, aligned_rows=aligned)
        grads = torch.autograd.grad(out, [leaf, *params], grad_out)
        results.append((out, grads))
    (plain, plain_grads), (aligned, aligned_grads) = results
    assert plain.is_contiguous() and aligned.stride()[-2:] == (32, 1)  # 21 outputs in rows of 32
    torch.testing.assert_close(aligned, plain, rtol=0, atol=0)
    for mine, ref in zip(aligned_grads, plain_grads):
        torch.testing.assert_close(mine, ref, rtol=0, atol=0)
