"""Conditioned transition (AF3 Algorithms 25, 26): the Triton op (interpreted on CPU) against the
float64 reference, next to the reference's own error in the same dtype; the model module on both
kernel paths."""

import pytest
import torch

from featurecache.kernels.conditioned_transition import (
    adaptive_layernorm,
    adaptive_layernorm_modulated,
    conditioned_transition,
    conditioned_transition_modulated,
)
from featurecache.kernels.conditioned_transition import config as fused_config
from featurecache.kernels.reference import (
    adaln_conditioning,
    adaln_modulate,
    conditioned_transition_reference,
)
from featurecache.model.network import transformer
from featurecache.model.network.transformer import ConditionedTransition
from featurecache.testing.compare import rel_error

# Triton's error against the fp64 truth may be at most this multiple of PyTorch's own error in the
# same dtype, plus a floor for cases where PyTorch happens to be (near) exact.
ERROR_MULTIPLE = 3.0
ERROR_FLOOR = {torch.float32: 1e-6, torch.bfloat16: 1e-3}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = [
    "out",
    "da",
    "ds",
    "d_norm_s_weight",
    "d_scale_weight",
    "d_scale_bias",
    "d_shift_weight",
    "d_weight_a",
    "d_weight_b",
    "d_weight_out",
    "d_gate_weight",
    "d_gate_bias",
]


def _inputs(a_shape, s_shape, expansion, generator):
    c_a, c_s = a_shape[-1], s_shape[-1]
    hidden = expansion * c_a
    a = torch.randn(*a_shape, generator=generator) * 2.0 - 0.3
    s = torch.randn(*s_shape, generator=generator) + 0.2
    params = [
        1.0 + 0.5 * torch.randn(c_s, generator=generator),  # norm_s weight
        torch.randn(c_a, c_s, generator=generator) * c_s**-0.5,  # scale
        torch.randn(c_a, generator=generator),
        torch.randn(c_a, c_s, generator=generator) * c_s**-0.5,  # shift
        torch.randn(hidden, c_a, generator=generator) * c_a**-0.5,
        torch.randn(hidden, c_a, generator=generator) * c_a**-0.5,
        torch.randn(c_a, hidden, generator=generator) * hidden**-0.5,
        torch.randn(c_a, c_s, generator=generator) * c_s**-0.5,  # output gate (nonzero: its gradient flows)
        torch.randn(c_a, generator=generator) - 1.0,
    ]
    return a, s, params


def adaptive_layernorm_reference(a, s, norm_s_weight, scale_weight, scale_bias, shift_weight, *_, eps):
    return adaln_modulate(a, *adaln_conditioning(s, norm_s_weight, scale_weight, scale_bias, shift_weight, eps), eps)


def _adaptive_layernorm(a, s, norm_s_weight, scale_weight, scale_bias, shift_weight, *_, eps):
    return adaptive_layernorm(a, s, norm_s_weight, scale_weight, scale_bias, shift_weight, eps)


def _check(
    a_shape, s_shape, expansion, dtype, seed, functions=(conditioned_transition_reference, conditioned_transition)
):
    generator = torch.Generator().manual_seed(seed)
    a, s, params = _inputs(a_shape, s_shape, expansion, generator)
    grad_out = torch.randn(*a_shape, generator=generator).to(DEVICE)
    a, s, params = a.to(DEVICE), s.to(DEVICE), [p.to(DEVICE) for p in params]

    def run(fn, x_dtype, param_dtype):
        leaves = [a.to(x_dtype).requires_grad_(), s.to(x_dtype).requires_grad_()]
        leaves += [p.to(param_dtype).requires_grad_() for p in params]
        out = fn(*leaves, eps=1e-5)
        # AdaLN alone uses the leading inputs only (NAMES in order)
        grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype), allow_unused=True)
        return [out, *(g for g in grads if g is not None)]

    reference, triton_fn = functions
    truth = run(reference, torch.float64, torch.float64)
    torch_result = run(reference, dtype, torch.float32)
    triton_result = run(triton_fn, dtype, torch.float32)
    assert len(triton_result) == len(torch_result) == len(truth)
    for name, mine, ref, exact in zip(NAMES[: len(truth)], triton_result, torch_result, truth, strict=True):
        assert mine.dtype == ref.dtype and mine.shape == ref.shape, name
        assert torch.isfinite(mine).all(), name
        mine_err, torch_err = rel_error(mine, exact), rel_error(ref, exact)
        assert mine_err <= ERROR_MULTIPLE * torch_err + ERROR_FLOOR[dtype], (
            f"{name}: triton error {mine_err:.2e} vs torch {torch_err:.2e} ({dtype}, {a_shape}, {s_shape}, seed {seed})"
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "a_shape, s_shape, expansion",
    [
        ((2, 3, 7, 24), (2, 3, 7, 40), 2),  # s per sample (the token transformer: s carries the noise level)
        ((1, 3, 11, 40), (1, 1, 11, 24), 2),  # s shared by the samples (the atom transformers)
        ((2, 2, 9, 16), (2, 1, 9, 16), 3),  # two batch entries sharing rows across samples
        ((37, 24), (37, 40), 2),  # no sample dimension
    ],
)
def test_matches_reference(a_shape, s_shape, expansion, dtype):
    _check(a_shape, s_shape, expansion, dtype, seed=torch.seed() % 2**31)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("a_shape, s_shape", [((2, 3, 7, 40), (2, 3, 7, 24)), ((1, 3, 11, 24), (1, 1, 11, 40))])
def test_wide_rows_take_the_adaln_kernel_and_products(a_shape, s_shape, dtype, monkeypatch):
    """Rows wider than the fused kernel holds (c_token 768): the one-pass AdaLN, then cuBLAS."""
    monkeypatch.setattr(fused_config, "FUSED_MAX_CHANNELS", 16)
    _check(a_shape, s_shape, 2, dtype, seed=torch.seed() % 2**31)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("a_shape, s_shape", [((2, 3, 7, 24), (2, 3, 7, 40)), ((1, 3, 11, 40), (1, 1, 11, 24))])
def test_adaptive_layernorm_matches_reference(a_shape, s_shape, dtype):
    _check(
        a_shape,
        s_shape,
        2,
        dtype,
        seed=torch.seed() % 2**31,
        functions=(adaptive_layernorm_reference, _adaptive_layernorm),
    )


@pytest.mark.parametrize("wide", [False, True], ids=["fused", "AdaLN kernel + products"])
def test_module_paths_agree_and_share_parameters(wide, monkeypatch):
    """ConditionedTransition: kernels="triton" on the torch path's parameters (state_dict keys
    unchanged) gives its output and every gradient; `wide`: past FUSED_MAX_CHANNELS (the token
    transformer's 768), the module's own path (its AdaLN module, the SwiGLU's products)."""
    if wide:
        monkeypatch.setattr(transformer, "FUSED_MAX_CHANNELS", 16)
        monkeypatch.setattr(fused_config, "FUSED_MAX_CHANNELS", 16)
    torch.manual_seed(3)
    fused = ConditionedTransition(24, 40, kernels="triton").to(DEVICE)
    with torch.no_grad():
        for parameter in fused.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    plain = ConditionedTransition(24, 40, kernels="torch").to(DEVICE)
    assert sorted(plain.state_dict()) == sorted(fused.state_dict())
    plain.load_state_dict(fused.state_dict())
    assert fused.fused is not wide
    a = torch.randn(2, 3, 13, 24, device=DEVICE)
    s = torch.randn(2, 1, 13, 40, device=DEVICE)
    results = []
    for module in (fused, plain):
        a_, s_ = a.clone().requires_grad_(), s.clone().requires_grad_()
        out = module(a_, s_)
        out.square().sum().backward()
        results.append([out.detach(), a_.grad, s_.grad] + [p.grad for p in module.parameters()])
    for index, (got, want) in enumerate(zip(*results, strict=True)):
        error = (got - want).abs().max().item()
        assert error <= 1e-5 * (1 + want.abs().max().item()), f"result {index}: differs by {error:.2e}"


@pytest.mark.parametrize("wide", [False, True], ids=["fused", "AdaLN kernel + products"])
@pytest.mark.parametrize("rows", [7, 0])
def test_ops_on_a_given_s_side_give_the_ops_on_s(wide, rows, monkeypatch):
    """conditioned_transition_modulated and adaptive_layernorm_modulated on the s side computed
    beforehand (a sampler computes it once for many calls) give what the ops give on s."""
    if wide:
        monkeypatch.setattr(fused_config, "FUSED_MAX_CHANNELS", 16)
    generator = torch.Generator().manual_seed(torch.seed() % 2**31)
    a, s, params = _inputs((1, 3, rows, 24), (1, 1, rows, 40), 2, generator)
    norm_w, scale_w, scale_b, shift_w, weight_a, weight_b, weight_out, gate_w, gate_b = params
    scale, shift = adaln_conditioning(s, norm_w, scale_w, scale_b, shift_w)
    gate = torch.nn.functional.linear(s, gate_w, gate_b)
    with torch.no_grad():
        got = conditioned_transition_modulated(a, scale, shift, gate, weight_a, weight_b, weight_out)
        expected = conditioned_transition(a, s, *params)
        assert torch.equal(got, expected)
        got = adaptive_layernorm_modulated(a, scale, shift)
        assert torch.equal(got, adaptive_layernorm(a, s, norm_w, scale_w, scale_b, shift_w))
    assert got.shape == a.shape


def test_gate_starts_at_sigmoid_minus_two():
    module = ConditionedTransition(16, 16, kernels="triton")
    assert (module.output_gate.weight == 0).all() and (module.output_gate.bias == -2.0).all()


def test_zero_rows_give_empty_output():
    module = ConditionedTransition(16, 24, kernels="triton")
    a = torch.randn(2, 3, 0, 16, requires_grad=True)
    out = module(a, torch.randn(2, 1, 0, 24))
    assert out.shape == (2, 3, 0, 16)
    out.sum().backward()
    assert module.linear_a.weight.grad.abs().sum() == 0


def test_rejects_bad_shapes():
    module = ConditionedTransition(16, 24, kernels="triton")
    with pytest.raises(ValueError, match="shared by its samples"):
        module(torch.randn(2, 3, 5, 16), torch.randn(2, 2, 5, 24))
    with pytest.raises(ValueError, match="channels"):
        module(torch.randn(2, 3, 5, 12), torch.randn(2, 3, 5, 24))


def test_opcheck_forward_and_backward_ops():
    generator = torch.Generator().manual_seed(11)
    a, _, params = _inputs((1, 2, 5, 16), (1, 1, 5, 16), 2, generator)
    scale = torch.randn(1, 1, 5, 16, generator=generator)
    shift, gate = torch.randn_like(scale), torch.randn_like(scale)
    args = (
        a.requires_grad_(),
        scale.requires_grad_(),
        shift.requires_grad_(),
        gate.requires_grad_(),
        *(w.requires_grad_() for w in params[4:7]),
        1e-5,
    )
    torch.library.opcheck(torch.ops.featurecache.conditioned_transition_fwd.default, args)
    y, out, mean, rstd = torch.ops.featurecache.conditioned_transition_fwd(*(t.detach() for t in args[:-1]), 1e-5)
    torch.library.opcheck(
        torch.ops.featurecache.conditioned_transition_bwd.default,
        (torch.randn_like(y), *(t.detach() for t in args[:-1]), out, mean, rstd),
    )
    torch.library.opcheck(torch.ops.featurecache.adaln_fwd.default, (*args[:3], 1e-5))
    x, mean, rstd = torch.ops.featurecache.adaln_fwd(*(t.detach() for t in args[:3]), 1e-5)
    torch.library.opcheck(
        torch.ops.featurecache.adaln_bwd.default, (torch.randn_like(x), *(t.detach() for t in args[:3]), mean, rstd)
    )


@pytest.mark.parametrize("wide, s_samples", [(False, 2), (True, 1)])
def test_compiles_and_matches_eager(wide, s_samples, monkeypatch):
    """Fused (s per sample) and wide-row (AdaLN kernel + products, s shared) paths, whole-graph."""
    if wide:
        monkeypatch.setattr(fused_config, "FUSED_MAX_CHANNELS", 8)
    torch.manual_seed(2)
    module = ConditionedTransition(16, 24, kernels="triton")
    with torch.no_grad():
        module.output_gate.weight.normal_(0.0, 0.2)  # so that s's gradient goes through the gate too
    a = torch.randn(1, 2, 7, 16)
    s = torch.randn(1, s_samples, 7, 24)

    def run(fn):
        a_, s_ = a.clone().requires_grad_(), s.clone().requires_grad_()
        out = fn(a_, s_)
        out.square().sum().backward()
        return [out.detach(), a_.grad, s_.grad] + [p.grad.clone() for p in module.parameters()]

    eager = run(module)
    module.zero_grad(set_to_none=True)
    compiled = run(torch.compile(module, backend="aot_eager", fullgraph=True))
    for index, (got, want) in enumerate(zip(compiled, eager, strict=True)):
        error = (got - want).abs().max().item()
        assert error <= 1e-5 * (1 + want.abs().max().item()), f"result {index}: compiled differs by {error:.2e}"
