"""Transition: Triton kernels (interpreted on CPU) against the PyTorch reference."""

import pytest
import torch

from featurecache.kernels.reference import transition_reference
from featurecache.kernels.runtime import override_config
from featurecache.kernels.transition import Transition, transition
from featurecache.testing.compare import rel_error

# Triton's error against an fp64 truth may be at most this multiple of PyTorch's own error in the
# same dtype, plus a floor for cases where PyTorch happens to be (near) exact.
ERROR_MULTIPLE = 3.0
ERROR_FLOOR = {torch.float32: 1e-6, torch.bfloat16: 1e-3}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _check(shape, expansion, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    dim = shape[-1]
    hidden = expansion * dim
    x = torch.randn(*shape, generator=generator) * 2.0 - 0.3
    params = [
        1.0 + 0.5 * torch.randn(dim, generator=generator),
        0.5 * torch.randn(dim, generator=generator),
        torch.randn(hidden, dim, generator=generator) * dim**-0.5,
        torch.randn(hidden, dim, generator=generator) * dim**-0.5,
        torch.randn(dim, hidden, generator=generator) * hidden**-0.5,
    ]
    grad_out = torch.randn(*shape, generator=generator).to(DEVICE)
    x, params = x.to(DEVICE), [p.to(DEVICE) for p in params]

    def run(fn, x_dtype, param_dtype):
        leaves = [x.to(x_dtype).requires_grad_()]
        leaves += [p.to(param_dtype).requires_grad_() for p in params]
        out = fn(*leaves, eps=1e-5)
        return [out, *torch.autograd.grad(out, leaves, grad_out.to(out.dtype))]

    truth = run(transition_reference, torch.float64, torch.float64)
    torch_result = run(transition_reference, dtype, torch.float32)
    triton_result = run(transition, dtype, torch.float32)
    names = ["out", "dx", "d_norm_weight", "d_norm_bias", "d_weight_a", "d_weight_b", "d_weight_out"]
    for name, mine, ref, exact in zip(names, triton_result, torch_result, truth):
        assert mine.dtype == ref.dtype and mine.shape == ref.shape, name
        assert torch.isfinite(mine).all(), name
        mine_err, torch_err = rel_error(mine, exact), rel_error(ref, exact)
        assert mine_err <= ERROR_MULTIPLE * torch_err + ERROR_FLOOR[dtype], (
            f"{name}: triton error {mine_err:.2e} vs torch {torch_err:.2e} ({dtype}, {shape}, seed {seed})"
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape, expansion", [((37, 24), 4), ((2, 5, 7, 16), 2), ((3, 24), 3)])
def test_matches_reference(shape, expansion, dtype):
    _check(shape, expansion, dtype, seed=torch.seed() % 2**31)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_gradients_through_matmul_match_reference(dtype):
    # the other weight-gradient strategy: [d_a | d_b], hidden and LN(x) written, cuBLAS products
    with override_config("transition", "bwd_dw", WEIGHT_GRADS="matmul"):
        _check((2, 19, 24), 3, dtype, seed=torch.seed() % 2**31)


def test_state_dict_moves_between_kernel_choices():
    fused = Transition(16, expansion=4, kernels="triton")
    with torch.no_grad():
        fused.norm.weight.normal_(1.0, 0.3)
        fused.norm.bias.normal_(0.0, 0.3)
    assert sorted(fused.state_dict()) == sorted(
        ["norm.weight", "norm.bias", "linear_a.weight", "linear_b.weight", "linear_out.weight"]
    )
    assert fused.linear_a.weight.shape == (64, 16) and fused.linear_out.weight.shape == (16, 64)
    plain = Transition(16, expansion=4, kernels="torch")
    plain.load_state_dict(fused.state_dict())
    x = torch.randn(3, 11, 16)
    torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-5)
    # the reference formula written out with plain modules
    xn = fused.norm(x)
    expected = fused.linear_out(torch.nn.functional.silu(fused.linear_a(xn)) * fused.linear_b(xn))
    torch.testing.assert_close(fused(x), expected, rtol=1e-5, atol=1e-5)


def test_zero_rows_give_empty_output():
    module = Transition(16, expansion=2)
    x = torch.randn(2, 0, 16, requires_grad=True)
    out = module(x)
    assert out.shape == (2, 0, 16)
    out.sum().backward()
    assert module.linear_a.weight.grad.abs().sum() == 0


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="kernels must be one of"):
        Transition(16, kernels="triton2")
    with pytest.raises(ValueError, match="channels"):
        Transition(16)(torch.randn(5, 12))


def test_bf16_activations_with_fp32_master_weights():
    """Mixed precision as training runs it: fp32 parameters, bf16 activations. The kernels take
    the weights in the activations' dtype (as autocast does) and the gradients reach the fp32
    parameters in fp32."""
    torch.manual_seed(5)
    module = Transition(24, expansion=2)
    reference = Transition(24, expansion=2, kernels="torch")
    reference.load_state_dict(module.state_dict())
    x = torch.randn(37, 24, dtype=torch.bfloat16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    out = module(x)
    assert out.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference(x_ref)
    torch.testing.assert_close(out.float(), expected.float(), atol=5e-2, rtol=5e-2)
    out.float().square().sum().backward()
    expected.float().square().sum().backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad.dtype == torch.float32, name
        other = dict(reference.named_parameters())[name].grad
        assert torch.isfinite(parameter.grad).all(), name
        rel = (parameter.grad - other.float()).norm() / other.float().norm().clamp_min(1e-12)
        assert rel < 5e-2, (name, float(rel))


@pytest.mark.skipif(DEVICE != "cuda", reason="shared-memory limits exist only on a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [192, 256, 320, 640, 1024])
def test_every_width_fits_the_gpus_shared_memory(dim, dtype):
    # The tuned tiles are bounded by element counts; c = 256 in bf16 once needed 264 KiB of an
    # H200's 227 KiB. runtime.launch_fitting shrinks such launches until they fit.
    _check((300, dim), 4, dtype, seed=torch.seed() % 2**31)
