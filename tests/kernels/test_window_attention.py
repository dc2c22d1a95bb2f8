"""Windowed attention kernels against a float64 eager attention.

Without CUDA the kernels run under TRITON_INTERPRET=1 (set in conftest): small windows of odd
sizes (queries and keys not powers of two), several sample groups (the interpreter's config puts
2 samples in a program, so 3 samples make a partial second group and a summed dBias), fully
masked windows, strided inputs. Each error is held to a small multiple of the error plain
PyTorch makes in the same dtype.
"""

from __future__ import annotations

import pytest
import torch

from featurecache.kernels.reference import window_attention_reference
from featurecache.kernels.window_attention.config import override_config
from featurecache.kernels.window_attention import (
    WindowAttention,
    WindowConfig,
    check_inputs,
    window_attention,
    window_attention_backward,
    window_attention_forward,
)
from featurecache.testing.compare import rel_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ERROR_FLOOR = {torch.float32: 2e-6, torch.bfloat16: 1e-4, torch.float16: 1e-5}
ERROR_FACTOR = 3.0


def _eager_attention(q, k, v, bias, mask, scale):
    """Plain windowed attention in the inputs' dtype, as eager PyTorch code would write it."""
    logits = torch.einsum("bswqhd,bswkhd->bswhqk", q, k) * scale
    if bias is not None:
        logits = logits + bias.to(q.dtype)[:, None]
    has_key = torch.ones((), dtype=torch.bool, device=q.device)
    if mask is not None:
        keep = mask[:, None, :, None, None, :]
        logits = logits.masked_fill(~keep, torch.finfo(q.dtype).min)  # finite: no NaN gradients
        has_key = keep.any(dim=-1, keepdim=True)
    weights = torch.softmax(logits, dim=-1) * has_key
    return torch.einsum("bswhqk,bswkhd->bswqhd", weights, v)


def _make_inputs(
    batch, samples, windows, queries, keys, heads, head_dim, dtype, masked=True, strided=False, bias_dtype=torch.float32
):
    """Fresh random inputs; `strided` reads q, k, v as slices of packed projections and the bias
    heads-last, as the model produces them."""
    if strided:
        q = torch.randn(batch, samples, windows, queries, heads, 3 * head_dim, device=DEVICE, dtype=dtype)
        q = q[..., head_dim : 2 * head_dim]
        kv = torch.randn(batch, samples, windows, keys, heads, 2 * head_dim, device=DEVICE, dtype=dtype)
        k, v = kv.split(head_dim, dim=-1)
        bias = torch.randn(batch, windows, queries, keys, heads, device=DEVICE, dtype=bias_dtype).permute(0, 1, 4, 2, 3)
    else:
        q = torch.randn(batch, samples, windows, queries, heads, head_dim, device=DEVICE, dtype=dtype)
        k, v = (
            torch.randn(batch, samples, windows, keys, heads, head_dim, device=DEVICE, dtype=dtype) for _ in range(2)
        )
        bias = torch.randn(batch, windows, heads, queries, keys, device=DEVICE, dtype=bias_dtype)
    mask = None
    if masked:
        mask = torch.rand(batch, windows, keys, device=DEVICE) > 0.3
        mask[0, windows - 1] = False  # one window with no key at all
    return q, k, v, bias, mask


def _check_against_truth(q, k, v, bias, mask, scale=None):
    dtype = q.dtype
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    grad_out = torch.randn(q.shape, device=DEVICE)

    def run(fn, cast):
        leaves = [x.detach().to(cast).requires_grad_() for x in (q, k, v)]
        bias_leaf = None
        if bias is not None:
            bias_leaf = bias.detach().to(cast if cast == torch.float64 else bias.dtype).requires_grad_()
        out = fn(*leaves, bias_leaf, mask, scale)
        out.backward(grad_out.to(out.dtype))
        return [out] + [leaf.grad for leaf in leaves] + ([bias_leaf.grad] if bias_leaf is not None else [])

    truth = run(_eager_attention, torch.float64)
    eager = run(_eager_attention, dtype)
    kernel = run(lambda *args: window_attention(*args[:3], bias=args[3], mask=args[4], scale=args[5]), dtype)
    for name, mine, theirs, exact in zip(["out", "dq", "dk", "dv", "dbias"], kernel, eager, truth):
        assert mine.shape == exact.shape and mine.dtype == theirs.dtype, name
        assert not torch.isnan(mine).any(), f"{name}: NaN"
        bound = ERROR_FACTOR * rel_error(theirs, exact) + ERROR_FLOOR[dtype]
        assert rel_error(mine, exact) <= bound, f"{name} ({dtype}): {rel_error(mine, exact):.2e} > {bound:.2e}"
    if mask is not None:
        empty = ~mask.any(dim=-1)  # [B, W]
        assert torch.all(kernel[0].transpose(1, 2)[empty] == 0), "windows without keys give zeros"
        assert torch.all(kernel[1].transpose(1, 2)[empty] == 0), "... and zero dq"
    return kernel


@pytest.mark.parametrize(
    "dtype, samples, windows, queries, keys, heads, head_dim, masked",
    [
        (torch.float32, 3, 2, 5, 11, 2, 8, True),  # odd window, partial sample group
        (torch.float32, 1, 3, 32, 40, 1, 24, False),  # no mask, keys not a power of two
        (torch.bfloat16, 3, 2, 7, 19, 2, 16, True),
        (torch.float16, 2, 2, 4, 9, 3, 8, True),
        (torch.bfloat16, 5, 1, 8, 24, 1, 32, True),  # three sample groups
    ],
)
def test_matches_float64_in_every_dtype(dtype, samples, windows, queries, keys, heads, head_dim, masked):
    _check_against_truth(*_make_inputs(1, samples, windows, queries, keys, heads, head_dim, dtype, masked))


def test_strided_inputs_batch_of_two_and_input_dtype_bias():
    inputs = _make_inputs(2, 3, 2, 6, 13, 2, 8, torch.bfloat16, strided=True, bias_dtype=torch.bfloat16)
    _check_against_truth(*inputs, scale=0.3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_pass_backward_matches_float64(dtype):
    with override_config(key_block=16):
        _check_against_truth(*_make_inputs(1, 3, 2, 7, 37, 2, 8, dtype))


def test_reference_matches_float64_eager():
    q, k, v, bias, mask = _make_inputs(1, 2, 3, 5, 9, 2, 8, torch.float32)
    truth = _eager_attention(q.double(), k.double(), v.double(), bias.double(), mask, 0.4)
    assert rel_error(window_attention_reference(q, k, v, bias, mask, 0.4), truth) < 1e-6
    # queries of a window without keys: zeros, as the kernels give
    assert torch.all(window_attention_reference(q, k, v, bias, mask)[:, :, -1] == 0)


def test_sample_groups_and_key_blocks_give_the_same_result():
    # dBias summed over groups (fp32 partials) against one program walking every sample; the
    # two-pass backward over key blocks (16 of the 40 keys, a partial last block) against one pass.
    q, k, v, bias, mask = _make_inputs(1, 5, 2, 6, 40, 2, 8, torch.float32)
    grad_out = torch.randn(q.shape, device=DEVICE)
    results = []
    for per_program, key_block in ((5, 0), (2, 0), (1, 0), (5, 16), (2, 16)):
        config = WindowConfig(samples_per_program=per_program, key_block=key_block)
        out, lse = window_attention_forward(q, k, v, bias, mask, 0.35, config)
        grads = window_attention_backward(grad_out, q, k, v, bias, mask, out, lse, 0.35, True, config)
        results.append((out, lse, *grads))
    for other in results[1:]:
        for name, a, b in zip(["out", "lse", "dq", "dk", "dv", "dbias"], results[0], other):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)


def test_bias_gradient_is_deterministic():
    q, k, v, bias, mask = _make_inputs(1, 3, 2, 5, 11, 2, 8, torch.float32)
    grads = []
    for _ in range(2):
        leaf = bias.detach().requires_grad_()
        window_attention(q, k, v, bias=leaf, mask=mask).square().sum().backward()
        grads.append(leaf.grad)
    assert torch.equal(*grads)


def test_without_bias_and_module_switch_agree():
    q, k, v, _, mask = _make_inputs(1, 2, 2, 5, 11, 2, 8, torch.float32)
    torch.testing.assert_close(
        WindowAttention("triton")(q, k, v, mask=mask),
        WindowAttention("torch")(q, k, v, mask=mask),
        rtol=1e-5,
        atol=1e-5,
    )


def test_cpu_without_interpreter_uses_reference(monkeypatch):
    if DEVICE == "cuda":
        pytest.skip("the reference fallback is the CPU path")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v, bias, mask = _make_inputs(1, 2, 2, 5, 11, 2, 8, torch.float32)
    assert torch.equal(window_attention(q, k, v, bias, mask), window_attention_reference(q, k, v, bias, mask))


def test_opcheck_forward_and_backward_ops():
    q, k, v, bias, mask = _make_inputs(1, 3, 2, 5, 11, 1, 8, torch.float32)
    leaves = [x.detach().requires_grad_() for x in (q, k, v, bias)]
    torch.library.opcheck(torch.ops.featurecache.window_attention_fwd.default, (*leaves, mask, 0.35))
    torch.library.opcheck(torch.ops.featurecache.window_attention_fwd.default, (q, k, v, None, None, 0.35))
    out, lse = torch.ops.featurecache.window_attention_fwd(q, k, v, bias, mask, 0.35)
    torch.library.opcheck(
        torch.ops.featurecache.window_attention_bwd.default,
        (torch.randn_like(out), q, k, v, bias, mask, out, lse, 0.35, True),
    )


def test_compiles_without_graph_break_and_matches_eager():
    q, k, v, bias, mask = _make_inputs(1, 3, 2, 5, 11, 2, 8, torch.float32)

    def layer(q_, k_, v_, bias_):
        return window_attention(q_ * 2.0, k_, v_, bias=bias_ + 1.0, mask=mask).square().sum()

    compiled = [x.detach().requires_grad_() for x in (q, k, v, bias)]
    torch.compile(layer, fullgraph=True, backend="aot_eager")(*compiled).backward()
    eager = [x.detach().requires_grad_() for x in (q, k, v, bias)]
    layer(*eager).backward()
    for name, got, want in zip(["dq", "dk", "dv", "dbias"], compiled, eager):
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda q, k, v, b, m: (q[0], k, v, b, m), "q has shape"),
        (lambda q, k, v, b, m: (q, k[:, :1], v, b, m), "k .* and v"),
        (lambda q, k, v, b, m: (q, k, v, b[..., :-1], m), "bias has shape"),
        (lambda q, k, v, b, m: (q, k, v, b.half(), m), "bias is torch.float16"),
        (lambda q, k, v, b, m: (q, k, v, b, m.float()), "mask is torch.float32"),
        (lambda q, k, v, b, m: (q.double(), k.double(), v.double(), None, None), "torch.float64"),
    ],
)
def test_rejects_bad_inputs_with_named_reason(change, message):
    inputs = change(*_make_inputs(1, 2, 2, 5, 11, 2, 8, torch.float32))
    with pytest.raises(ValueError, match=message):
        check_inputs(*inputs)
