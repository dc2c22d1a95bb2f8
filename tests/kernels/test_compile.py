"""torch.compile with the kernels in the graph: every Triton op is a torch.library custom op
under compile (Dynamo and Inductor never trace the launchers), with fake and autograd
implementations that opcheck verifies.

aot_eager runs the same graph capture and autograd partitioning as Inductor without a C
compiler; the kernels run under the interpreter (conftest), at tiny sizes.
"""

from __future__ import annotations

import pytest
import torch

from featurecache.kernels.layernorm_linear import LayerNormLinear
from featurecache.kernels.smooth_lddt import inclusion_radius, smooth_lddt_sums
from featurecache.kernels.transition import Transition
from featurecache.kernels.triangle_mult import TriangleMultiplication
from featurecache.model.network.atom_attention import AtomWindows
from featurecache.model.network.pairformer import PairformerBlock
from featurecache.model.network.transformer import ConditionedAttention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _randomized(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    for parameter in module.parameters():
        parameter.data.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return module.to(DEVICE)


def test_pairformer_block_compiles_whole_and_matches_eager():
    torch.manual_seed(0)
    block = _randomized(PairformerBlock(16, 8, 2, 8, 2, 8, 2, kernels="triton"), 0)
    s = torch.randn(1, 7, 16, device=DEVICE)
    z = torch.randn(1, 7, 7, 8, device=DEVICE)
    token_mask = torch.ones(1, 7, dtype=torch.bool, device=DEVICE)
    token_mask[0, -2:] = False  # crop padding
    pair_mask = token_mask[:, :, None] & token_mask[:, None, :]

    def run(fn):
        s_, z_ = s.clone().requires_grad_(), z.clone().requires_grad_()
        s_out, z_out = fn(s_, z_, token_mask, pair_mask)
        (s_out.square().sum() + z_out.square().sum()).backward()
        return [s_out.detach(), z_out.detach(), s_.grad, z_.grad] + [
            p.grad.clone() for p in block.parameters() if p.grad is not None
        ]

    eager = run(block)
    block.zero_grad(set_to_none=True)
    compiled = run(torch.compile(block, backend="aot_eager", fullgraph=True))
    assert len(compiled) == len(eager)
    for index, (got, want) in enumerate(zip(compiled, eager)):
        error = (got - want).abs().max().item()
        assert error <= 1e-5 * (1 + want.abs().max().item()), f"result {index}: compiled differs by {error:.2e}"


def test_atom_attention_compiles_whole_and_matches_eager():
    """The diffusion side's windowed attention: window_attention's custom ops inside the glue
    (the windows' gather and its backward, AdaLN, the gates)."""
    torch.manual_seed(1)
    attention = _randomized(ConditionedAttention(16, 16, 4, 2, kernels="triton"), 4)
    atoms, queries, keys = 45, 8, 24
    windows = -(-atoms // queries)
    a = torch.randn(1, 3, atoms, 16, device=DEVICE)
    s = torch.randn(1, 1, atoms, 16, device=DEVICE)
    pair = torch.randn(1, windows, queries, keys, 4, device=DEVICE)
    atom_mask = torch.arange(atoms, device=DEVICE)[None] < 40

    def layer(a_, s_, pair_):
        return attention(a_, s_, pair_, AtomWindows(atom_mask, queries, keys))

    def run(fn):
        inputs = [x.clone().requires_grad_() for x in (a, s, pair)]
        out = fn(*inputs)
        out.square().sum().backward()
        return (
            [out.detach()]
            + [x.grad for x in inputs]
            + [p.grad.clone() for p in attention.parameters() if p.grad is not None]
        )

    eager = run(layer)
    attention.zero_grad(set_to_none=True)
    compiled = run(torch.compile(layer, backend="aot_eager", fullgraph=True))
    assert len(compiled) == len(eager)
    for index, (got, want) in enumerate(zip(compiled, eager)):
        error = (got - want).abs().max().item()
        assert error <= 1e-5 * (1 + want.abs().max().item()), f"result {index}: compiled differs by {error:.2e}"


def _opcheck_with_grads(op, args):
    torch.library.opcheck(
        op,
        args,
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )


@pytest.mark.parametrize("masked", [True, False])
def test_triangle_mult_ops_pass_opcheck(masked):
    module = _randomized(TriangleMultiplication(8, 8, direction="incoming"), 1)
    z = torch.randn(1, 5, 5, 8, device=DEVICE, requires_grad=True)
    mask = (torch.rand(1, 5, 5, device=DEVICE) > 0.3) if masked else None
    params = [p.detach().requires_grad_() for p in module.parameters()]
    _opcheck_with_grads(torch.ops.featurecache.triangle_mult_fwd.default, (z, mask, *params, "incoming", 1e-5))


def test_layernorm_linear_and_transition_ops_pass_opcheck():
    x = torch.randn(2, 5, 16, device=DEVICE, requires_grad=True)
    linear = _randomized(LayerNormLinear(16, 24, bias=True), 2)
    params = [
        p.detach().requires_grad_()
        for p in (linear.norm.weight, linear.norm.bias, linear.linear.weight, linear.linear.bias)
    ]
    _opcheck_with_grads(torch.ops.featurecache.layernorm_linear_fwd.default, (x, *params, 1e-5))
    _opcheck_with_grads(torch.ops.featurecache.layernorm_linear_fwd.default, (x, *params[:3], None, 1e-5))
    transition = _randomized(Transition(16, expansion=2), 3)
    params = [p.detach().requires_grad_() for p in transition.parameters()]
    _opcheck_with_grads(torch.ops.featurecache.transition_fwd.default, (x, *params, 1e-5))


def test_smooth_lddt_compiles_and_matches_eager():
    generator = torch.Generator().manual_seed(5)
    true = torch.rand(1, 21, 3, generator=generator) * 15.0
    predicted = true[:, None] + torch.randn(1, 2, 21, 3, generator=generator)
    nucleotide, resolved = (torch.rand(1, 21, generator=generator) < share for share in (0.3, 0.9))
    radius = inclusion_radius(nucleotide, resolved)

    def loss(x):
        scores, count = smooth_lddt_sums(x * 1.5, true, radius)
        return (scores / count[:, None]).square().sum()

    results = []
    for fn in (loss, torch.compile(loss, backend="aot_eager", fullgraph=True)):
        x = predicted.clone().requires_grad_()
        value = fn(x)
        value.backward()
        results.append((value.detach(), x.grad))
    for got, want in zip(*results[::-1]):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    _opcheck_with_grads(
        torch.ops.featurecache.smooth_lddt_sums.default, (predicted.clone().requires_grad_(), true, radius)
    )
