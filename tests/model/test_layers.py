"""Layers on top of the kernels: attention orientation, masking, and triton/torch agreement."""

import contextlib
import math

import pytest
import torch

from featurecache.model.network.layers import (
    AttentionPairBias,
    Linear,
    OuterProductMean,
    PairWeightedAveraging,
    TriangleAttention,
    column_sums,
    leading_bias_linear,
)
from featurecache.testing.compare import summation_tolerance

# The layers below add at most 16 terms per sum (16 channels, 4 x 4 outer products, 9 keys); the
# two sides of each comparison add them in different orders.
ROUNDING = summation_tolerance(torch.float32, 16)


def _seed() -> None:
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, ())))


def test_ending_node_is_the_starting_node_on_the_transposed_pair():
    _seed()
    start = TriangleAttention(16, 2, 8, node="starting", kernels="torch")
    end = TriangleAttention(16, 2, 8, node="ending", kernels="torch")
    end.load_state_dict(start.state_dict())
    z = torch.randn(2, 9, 9, 16)
    mask = torch.rand(2, 9, 9) < 0.8
    expected = start(z.transpose(1, 2), mask.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(end(z, mask), expected, atol=ROUNDING, rtol=ROUNDING)


def test_triangle_attention_matches_a_direct_formula():
    """Starting node, written out as in AF3 Algorithm 13 with explicit loops over heads."""
    _seed()
    layer = TriangleAttention(8, 2, 4, node="starting", kernels="torch")
    z = torch.randn(1, 5, 5, 8)
    mask = torch.ones(1, 5, 5, dtype=torch.bool)
    mask[0, :, 3] = False  # key 3 masked everywhere
    proj = layer.proj(z)[0]
    inner = 8
    q, k, v, g = (proj[..., i * inner : (i + 1) * inner].unflatten(-1, (2, 4)) for i in range(4))
    b = proj[..., 4 * inner :]
    logits = torch.einsum("ijhd,ikhd->ijkh", q, k) / math.sqrt(4) + b[None, :, :, :]
    logits[:, :, 3, :] = float("-inf")
    weights = torch.softmax(logits, dim=2)
    out = torch.einsum("ijkh,ikhd->ijhd", weights, v)
    expected = layer.linear_out((torch.sigmoid(g) * out).flatten(-2))
    torch.testing.assert_close(layer(z, mask)[0], expected, atol=ROUNDING, rtol=ROUNDING)


def test_pair_weighted_averaging_ignores_padded_tokens():
    _seed()
    layer = PairWeightedAveraging(8, 16, 2, 4, kernels="torch")
    m = torch.randn(1, 3, 7, 8)
    z = torch.randn(1, 7, 7, 16)
    token_mask = torch.arange(7)[None] < 5
    out = layer(m, z, token_mask)
    m2, z2 = m.clone(), z.clone()
    m2[:, :, 5:] = torch.randn(1, 3, 2, 8)  # change only padded tokens
    z2[:, :, 5:] = torch.randn(1, 7, 2, 16)
    torch.testing.assert_close(layer(m2, z2, token_mask)[:, :, :5], out[:, :, :5])
    assert torch.isfinite(out).all()


def test_outer_product_mean_averages_over_valid_rows_only():
    _seed()
    layer = OuterProductMean(8, 16, 4, kernels="torch")
    m = torch.randn(1, 4, 6, 8)
    mask = torch.ones(1, 4, 6, dtype=torch.bool)
    mask[:, 2:] = False  # rows 2 and 3 are padding
    out = layer(m, mask)
    m2 = m.clone()
    m2[:, 2:] = torch.randn(1, 2, 6, 8)
    torch.testing.assert_close(layer(m2, mask), out)
    # two valid rows: the same as an MSA of just those rows
    torch.testing.assert_close(layer(m[:, :2], mask[:, :2]), out, atol=ROUNDING, rtol=ROUNDING)


@pytest.mark.parametrize(
    "layer_name",
    [
        "attention_pair_bias",
        "pair_weighted_averaging",
        "outer_product_mean",
        "triangle_attention_starting",
        "triangle_attention_ending",
    ],
)
def test_triton_path_matches_torch_path(layer_name):
    _seed()
    length = 9
    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the kernels run interpreted
    z = torch.randn(1, length, length, 16, device=device, requires_grad=True)
    s = torch.randn(1, length, 32, device=device, requires_grad=True)
    m = torch.randn(1, 3, length, 8, device=device, requires_grad=True)
    token_mask = torch.arange(length, device=device)[None] < 7
    pair_mask = token_mask[:, :, None] & token_mask[:, None, :]
    builders = {
        "attention_pair_bias": (
            lambda kernels: AttentionPairBias(32, 16, 2, 8, kernels=kernels),
            lambda layer: layer(s, z, token_mask),
        ),
        "pair_weighted_averaging": (
            lambda kernels: PairWeightedAveraging(8, 16, 2, 8, kernels=kernels),
            lambda layer: layer(m, z, token_mask),
        ),
        "outer_product_mean": (
            lambda kernels: OuterProductMean(8, 16, 8, kernels=kernels),
            lambda layer: layer(m, token_mask[:, None, :].expand(1, 3, length)),
        ),
        "triangle_attention_starting": (
            lambda kernels: TriangleAttention(16, 2, 8, node="starting", kernels=kernels),
            lambda layer: layer(z, pair_mask),
        ),
        "triangle_attention_ending": (
            lambda kernels: TriangleAttention(16, 2, 8, node="ending", kernels=kernels),
            lambda layer: layer(z, pair_mask),
        ),
    }
    build, call = builders[layer_name]
    reference, fused = build("torch").to(device), build("triton").to(device)
    fused.load_state_dict(reference.state_dict())
    upstream = None
    results = []
    for layer in (reference, fused):
        for tensor in (z, s, m):
            tensor.grad = None
        out = call(layer)
        upstream = torch.randn_like(out) if upstream is None else upstream
        (out * upstream).sum().backward()
        results.append(
            (
                out.detach(),
                [t.grad.clone() for t in (z, s, m) if t.grad is not None],
                {n: p.grad for n, p in layer.named_parameters()},
            )
        )
    (out_ref, in_ref, par_ref), (out_fused, in_fused, par_fused) = results
    torch.testing.assert_close(out_fused, out_ref, atol=1e-4, rtol=1e-4)
    for got, want in zip(in_fused, in_ref):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for name, want in par_ref.items():
        torch.testing.assert_close(par_fused[name], want, atol=1e-4, rtol=1e-4, msg=lambda text: f"{name}: {text}")


def test_unknown_kernels_and_node_are_rejected():
    with pytest.raises(ValueError, match="kernels must be one of .* got 'cuda'"):
        TriangleAttention(16, 2, 8, kernels="cuda")
    with pytest.raises(ValueError, match="node is 'middle'"):
        TriangleAttention(16, 2, 8, node="middle", kernels="torch")


def test_every_triangle_attention_holds_the_same_cpu_function():
    """The torch kernels' triangle attention is one module-level function (not a partial made per
    module): every module built holds that same object."""
    from featurecache.kernels.reference import gated_pair_attention_rows

    starting, ending = (TriangleAttention(16, 2, 8, node=node, kernels="torch") for node in ("starting", "ending"))
    assert starting.gated_attention is ending.gated_attention is gated_pair_attention_rows


def test_kernel_inputs_take_the_autocast_dtype():
    """Under bf16 autocast the fused ops get bf16 inputs (their output dtype follows the input)."""
    from featurecache.kernels.layernorm_linear import LayerNormLinear
    from featurecache.model.network.layers import kernel_module

    layer = kernel_module(LayerNormLinear, 16, 8, kernels="torch")
    seen = {}
    layer.register_forward_pre_hook(lambda module, args: seen.update(dtype=args[0].dtype))
    x = torch.randn(3, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x)
    assert seen["dtype"] == torch.bfloat16
    layer(x)
    assert seen["dtype"] == torch.float32


@pytest.mark.parametrize("leading", [(), (3,), (2, 7, 5)])
def test_linear_matches_nn_linear_and_its_gradients(leading):
    """The bias-gradient Linear against nn.Linear on the same parameters: outputs and all three
    gradients, fp32 (the bias gradient sums over every leading position)."""
    _seed()
    reference = torch.nn.Linear(16, 9)
    layer = Linear(16, 9)
    layer.load_state_dict(reference.state_dict())
    x = torch.randn(*leading, 16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    grad_out = torch.randn(*leading, 9)
    out, out_ref = layer(x), reference(x_ref)
    torch.testing.assert_close(out, out_ref, atol=ROUNDING, rtol=ROUNDING)
    out.backward(grad_out)
    out_ref.backward(grad_out)
    rows = max(1, math.prod(leading))
    tolerance = summation_tolerance(torch.float32, rows)
    torch.testing.assert_close(x.grad, x_ref.grad, atol=ROUNDING, rtol=ROUNDING)
    torch.testing.assert_close(layer.weight.grad, reference.weight.grad, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(layer.bias.grad, reference.bias.grad, atol=tolerance, rtol=tolerance)


def test_linear_under_autocast_computes_as_nn_linear_does():
    """bf16 autocast: the output in bf16, the parameters' gradients in fp32, and the values
    those of nn.Linear under the same autocast (the same casts, the same bf16 products)."""
    _seed()
    reference = torch.nn.Linear(32, 12)
    layer = Linear(32, 12)
    layer.load_state_dict(reference.state_dict())
    x = torch.randn(4, 6, 32)
    grad_out = torch.randn(4, 6, 12)
    results = []
    for module in (layer, reference):
        leaf = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(leaf)
        out.backward(grad_out.to(out.dtype))
        results.append((out, leaf.grad, module.weight.grad, module.bias.grad))
    (out, grad_x, grad_w, grad_b), (out_ref, grad_x_ref, grad_w_ref, grad_b_ref) = results
    assert out.dtype == out_ref.dtype == torch.bfloat16
    assert grad_x.dtype == torch.float32 and grad_w.dtype == grad_b.dtype == torch.float32
    # bf16 outputs of fp32 sums in possibly different orders: one bf16 rounding apart
    bf16 = 2**-7
    for value, expected in ((out, out_ref), (grad_x, grad_x_ref), (grad_w, grad_w_ref), (grad_b, grad_b_ref)):
        torch.testing.assert_close(value.float(), expected.float(), atol=bf16 * expected.abs().max().item(), rtol=bf16)


def test_linear_without_gradient_is_nn_linear():
    _seed()
    layer = Linear(8, 5)
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize("bias_width", [3, 9])
def test_a_leading_bias_is_the_product_plus_the_bias_on_its_first_columns(bias_width):
    """leading_bias_linear(x, w, b) = x w^T with b added to the first len(b) outputs: values and
    the three gradients against that composition (fp32; the bias's gradient only from its own
    columns), and without gradient the padded bias kept once per sampler scope."""
    from featurecache.kernels.weight_casts import cached_weight_casts

    _seed()
    x, weight, bias = torch.randn(2, 5, 16), torch.randn(9, 16), torch.randn(bias_width)
    grad_out = torch.randn(2, 5, 9)
    results = []
    for function in (leading_bias_linear, _leading_bias_composed):
        leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
        out = function(*leaves)
        out.backward(grad_out)
        results.append((out, *(leaf.grad for leaf in leaves)))
    tolerance = summation_tolerance(torch.float32, 16)
    for value, expected in zip(*results):
        torch.testing.assert_close(value, expected, atol=tolerance, rtol=tolerance)
    with torch.no_grad(), cached_weight_casts():
        first, second = leading_bias_linear(x, weight, bias), leading_bias_linear(x, weight, bias)
        assert torch.equal(first, second)
        torch.testing.assert_close(first, results[1][0], atol=tolerance, rtol=tolerance)
    with pytest.raises(ValueError, match="a bias of 10 for 9 outputs"):
        leading_bias_linear(x, weight, torch.zeros(10))


def _leading_bias_composed(x, weight, bias):
    out = x @ weight.t()
    return torch.cat([out[..., : bias.shape[0]] + bias, out[..., bias.shape[0] :]], dim=-1)


def test_column_sums_on_a_hand_checked_case():
    rows = torch.tensor([[1.0, -2.0, 0.5], [3.0, 4.0, 0.25]])
    assert torch.equal(column_sums(rows), torch.tensor([4.0, 2.0, 0.75]))


def test_every_linear_the_model_calls_casts_through_the_step_scope():
    """A CUDA-graph step runs autocast without its cache, so an nn.Linear would cast its weight at
    every call (the diffusion transformer's forward, its recomputation, the mini-rollout); the
    Linears the model calls are layers.Linear, which cast once a step (weight_casts.step_weight_casts).
    (The fused ops' nn.Linear children only hold parameters: the kernels read them.)"""
    from featurecache.model import AF3Model, preset
    from featurecache.testing.synthetic import random_batch

    model = AF3Model(preset("tiny", kernels="torch")).train()
    called = []
    for name, module in model.named_modules():
        if type(module) is torch.nn.Linear:
            module.register_forward_pre_hook(lambda module, args, name=name: called.append(name))
    batch = random_batch([6], [3], [1], torch.Generator().manual_seed(0))
    outputs = model(batch, num_cycles=1, diffusion_batch=2)
    model.loss(batch, outputs)[0].backward()
    assert not called, f"nn.Linear called where layers.Linear belongs: {sorted(set(called))}"


def test_every_module_of_a_triton_model_runs_its_kernels():
    """A module built without passing `kernels` on falls back to the PyTorch path silently (the
    token transformer's transition AdaLN did, 4 passes over [B, 48, L, 768] instead of one). Every
    module of a kernels="triton" model that holds the setting holds "triton", but the one left on
    PyTorch by design (the diffusion conditioning's single_in: 833 columns overflow the kernel's
    shared memory, diffusion.py)."""
    from featurecache.model import AF3Model, preset

    model = AF3Model(preset("tiny", kernels="triton"))
    by_design = {"diffusion_module.conditioning.single_in"}
    holding = {name: module.kernels for name, module in model.named_modules() if hasattr(module, "kernels")}
    assert len(holding) > 50  # the walk found the modules
    elsewhere = {name: kernels for name, kernels in holding.items() if kernels != "triton" and name not in by_design}
    assert not elsewhere, f"modules on another path than the model's kernels: {elsewhere}"
    assert all(holding[name] == "torch" for name in by_design)


def test_a_bias_free_linear_casts_once_a_step_and_matches_nn_linear():
    """Two differentiated calls inside step_weight_casts, autocast's cache off: one bf16 copy of
    the weight, and the values and gradients of nn.Linear under the same autocast (bf16 products
    of fp32 sums: one bf16 rounding apart; the weight gradient sums two calls' products)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from featurecache.kernels.weight_casts import step_weight_casts

    class Casts(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.aten._to_copy.default and args[0].shape == (12, 32):
                Casts.count += 1
            return func(*args, **kwargs)

    _seed()
    reference, layer = torch.nn.Linear(32, 12, bias=False), Linear(32, 12, bias=False)
    layer.load_state_dict(reference.state_dict())
    x = torch.randn(5, 32)
    results = []
    for module, scope in ((layer, step_weight_casts), (reference, contextlib.nullcontext)):
        leaf = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False), scope(), Casts():
            Casts.count = 0
            out = module(leaf) + module(leaf * 2)
            casts = Casts.count
            out.float().square().sum().backward()
        results.append((casts, out, leaf.grad, module.weight.grad))
    (casts, out, grad_x, grad_w), (casts_ref, out_ref, grad_x_ref, grad_w_ref) = results
    assert casts == 1 and casts_ref == 2
    bf16 = 2**-7
    for value, expected in ((out, out_ref), (grad_x, grad_x_ref), (grad_w, grad_w_ref)):
        torch.testing.assert_close(value.float(), expected.float(), atol=bf16 * expected.abs().max().item(), rtol=bf16)
