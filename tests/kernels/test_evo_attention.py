"""EvoAttention kernels against a float64 eager attention.

Without CUDA the Triton kernels run under TRITON_INTERPRET=1 (set in conftest), so shapes stay
small (L <= 40, N <= 3, H <= 2) but odd, to cover ragged blocks. Each error is held to a small
multiple of the error that plain PyTorch makes in the same dtype.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from featurecache.kernels.evo_attention import (
    SUPPORTED_HEAD_DIMS,
    BlockConfig,
    SizeLimitError,
    check_inputs,
    evo_attention,
    evo_attention_backward,
    evo_attention_forward,
    select_config,
    wide_index,
)
from featurecache.kernels.evo_attention import config as evo_config
from featurecache.kernels.evo_attention import launch as evo_launch
from featurecache.kernels.evo_attention.config import CONFIG_FILE, load_tuned_configs, padded_head_dim
from featurecache.kernels.reference import evo_attention_reference
from featurecache.testing.compare import rel_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Relative error allowed even when PyTorch's own error is smaller still (fp32 rounding paths differ).
ERROR_FLOOR = {torch.float32: 2e-6, torch.bfloat16: 1e-4, torch.float16: 1e-5}
ERROR_FACTOR = 3.0


def _eager_attention(q, k, v, bias, mask, scale):
    """Plain attention computed entirely in the inputs' dtype, as eager PyTorch code would."""
    logits = torch.einsum("bnqhd,bnkhd->bnhqk", q, k) * scale
    if bias is not None:
        logits = logits + bias.to(q.dtype)
    row_has_key = torch.ones(q.shape[:2], dtype=torch.bool, device=q.device)[:, :, None, None, None]
    if mask is not None:
        keep = mask[:, :, None, None, :]
        # A finite fill keeps gradients of fully masked rows finite; those rows are zeroed below.
        logits = logits.masked_fill(~keep, torch.finfo(q.dtype).min)
        row_has_key = keep.any(dim=-1, keepdim=True)
    weights = torch.softmax(logits, dim=-1) * row_has_key
    return torch.einsum("bnhqk,bnkhd->bnqhd", weights, v)


def _make_inputs(batch, rows, seq_len, heads, head_dim, bias_rows, masked, strided, dtype):
    """Fresh random inputs; `strided` gives q, k, v, bias and mask non-contiguous layouts."""
    if strided:
        # q, k, v as slices of one [B, L, N, H, 3D] tensor read with rows and positions swapped,
        # the way triangle attention around the ending node sees the pair map.
        qkv = torch.randn(batch, seq_len, rows, heads, 3 * head_dim, device=DEVICE, dtype=dtype).transpose(1, 2)
        q, k, v = qkv.split(head_dim, dim=-1)
    else:
        q, k, v = (torch.randn(batch, rows, seq_len, heads, head_dim, device=DEVICE, dtype=dtype) for _ in range(3))
    bias = None
    if bias_rows is not None:
        count = 1 if bias_rows == "shared" else rows
        if strided:
            # Stored heads-last, as a linear projection of the pair map produces it.
            bias = torch.randn(batch, count, seq_len, seq_len, heads, device=DEVICE).permute(0, 1, 4, 2, 3)
        else:
            bias = torch.randn(batch, count, heads, seq_len, seq_len, device=DEVICE)
    mask = None
    if masked:
        mask = torch.rand(batch, seq_len, rows, device=DEVICE) > 0.25
        mask[0, :, rows - 1] = False  # one fully masked row
        mask = mask.transpose(1, 2) if strided else mask.contiguous().transpose(1, 2).contiguous()
    return q, k, v, bias, mask


def _check_against_truth(q, k, v, bias, mask, scale=None):
    """Run kernel and eager PyTorch in the inputs' dtype and float64 truth; compare all grads."""
    dtype = q.dtype
    if scale is None:
        scale = q.shape[-1] ** -0.5
    grad_out = torch.randn(q.shape, device=DEVICE)

    def run(fn, cast):
        leaves = [x.detach().to(cast).requires_grad_() for x in (q, k, v)]
        bias_leaf = None if bias is None else bias.detach().to(cast if cast == torch.float64 else bias.dtype)
        if bias_leaf is not None:
            bias_leaf.requires_grad_()
        out = fn(*leaves, bias_leaf, mask, scale)
        out.backward(grad_out.to(out.dtype))
        grads = [leaf.grad for leaf in leaves] + ([bias_leaf.grad] if bias_leaf is not None else [])
        return [out] + grads

    truth = run(_eager_attention, torch.float64)
    eager = run(_eager_attention, dtype)
    kernel = run(lambda q_, k_, v_, b_, m_, s_: evo_attention(q_, k_, v_, bias=b_, mask=m_, scale=s_), dtype)
    names = ["out", "dq", "dk", "dv", "dbias"]
    for name, mine, theirs, exact in zip(names, kernel, eager, truth):
        assert mine.shape == exact.shape, f"{name}: shape {tuple(mine.shape)} != {tuple(exact.shape)}"
        assert mine.dtype == theirs.dtype, f"{name}: dtype {mine.dtype}, eager gives {theirs.dtype}"
        assert not torch.isnan(mine).any(), f"{name}: NaN in result"
        mine_error = rel_error(mine, exact)
        eager_error = rel_error(theirs, exact)
        bound = ERROR_FACTOR * eager_error + ERROR_FLOOR[dtype]
        assert mine_error <= bound, (
            f"{name} ({dtype}): kernel error {mine_error:.2e} > {bound:.2e} (eager error {eager_error:.2e})"
        )
    if mask is not None:
        empty_rows = ~mask.any(dim=-1)  # [B, N]
        assert torch.all(kernel[0][empty_rows] == 0), "fully masked rows must give zeros"
        assert torch.all(kernel[1][empty_rows] == 0), "fully masked rows must give zero dq"
    return kernel


@pytest.mark.parametrize(
    "dtype, head_dim, seq_len, bias_rows, masked",
    [
        (torch.float32, 8, 17, "shared", True),
        (torch.float32, 24, 33, "per_row", True),
        (torch.float32, 48, 19, None, False),
        (torch.bfloat16, 24, 33, "shared", True),
        (torch.bfloat16, 32, 40, "per_row", False),
        (torch.bfloat16, 16, 23, None, True),
        (torch.float16, 48, 21, "shared", True),
        (torch.float16, 8, 9, "per_row", True),
    ],
)
def test_matches_float64_in_every_dtype(dtype, head_dim, seq_len, bias_rows, masked):
    q, k, v, bias, mask = _make_inputs(1, 3, seq_len, 2, head_dim, bias_rows, masked, strided=False, dtype=dtype)
    _check_against_truth(q, k, v, bias, mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias_rows", ["shared", "per_row"])
def test_non_contiguous_inputs(dtype, bias_rows):
    q, k, v, bias, mask = _make_inputs(2, 2, 27, 2, 24, bias_rows, True, strided=True, dtype=dtype)
    assert not q.is_contiguous() and not bias.is_contiguous() and not mask.is_contiguous()
    _check_against_truth(q, k, v, bias, mask)


@pytest.mark.parametrize("bias_rows", ["shared", "per_row"])
def test_tail_padding_skips_keys_and_keeps_gradients(bias_rows, monkeypatch):
    # Crop padding: keys past each row's last valid one are masked, a block or more of them, so
    # the kernels stop their key loops early (and write zeros where they skipped). Outputs are
    # allocated NaN-filled here, so any element a kernel leaves unwritten shows up.
    new_empty = torch.Tensor.new_empty

    def poisoned(self, *args, **kwargs):
        out = new_empty(self, *args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch.Tensor, "new_empty", poisoned)
    q, k, v, bias, _ = _make_inputs(1, 3, 37, 2, 16, bias_rows, False, strided=False, dtype=torch.float32)
    mask = torch.ones(1, 3, 37, dtype=torch.bool, device=DEVICE)
    mask[0, 0, 10:] = False  # ends inside the first block of 16
    mask[0, 1, 20:] = False
    mask[0, 1, 3] = False  # a hole before the end still counts
    mask[0, 2, :] = False  # fully padded row
    kernel = _check_against_truth(q, k, v, bias, mask)
    dk, dv = kernel[2], kernel[3]
    assert torch.all(dk[0, 0, 10:] == 0) and torch.all(dv[0, 1, 20:] == 0)
    if bias_rows == "per_row":
        assert torch.all(kernel[4][0, 0, :, :, 10:] == 0), "skipped keys need a zero bias gradient"


def test_bias_in_input_dtype_and_custom_scale():
    q, k, v, bias, mask = _make_inputs(1, 2, 25, 2, 16, "shared", True, strided=False, dtype=torch.bfloat16)
    _check_against_truth(q, k, v, bias.to(torch.bfloat16), mask, scale=0.37)


def test_broadcast_bias_equals_expanded_bias():
    q, k, v, bias, mask = _make_inputs(1, 3, 18, 2, 8, "shared", True, strided=False, dtype=torch.float32)
    shared = evo_attention(q, k, v, bias=bias, mask=mask)
    expanded = evo_attention(q, k, v, bias=bias.expand(-1, 3, -1, -1, -1).contiguous(), mask=mask)
    torch.testing.assert_close(shared, expanded, rtol=0, atol=0)


def test_bias_gradient_is_deterministic():
    q, k, v, bias, mask = _make_inputs(1, 3, 35, 2, 16, "shared", True, strided=False, dtype=torch.bfloat16)
    grad_out = torch.randn(q.shape, device=DEVICE, dtype=q.dtype)
    grads = []
    for _ in range(2):
        bias_leaf = bias.detach().clone().requires_grad_()
        evo_attention(q, k, v, bias=bias_leaf, mask=mask).backward(grad_out)
        grads.append(bias_leaf.grad)
    assert torch.equal(grads[0], grads[1]), "bias gradient differs between two identical runs"


def test_fully_masked_batch_gives_zeros_and_zero_grads():
    q, k, v, bias, _ = _make_inputs(1, 2, 13, 1, 8, "shared", False, strided=False, dtype=torch.float32)
    mask = torch.zeros(1, 2, 13, dtype=torch.bool, device=DEVICE)
    leaves = [x.detach().requires_grad_() for x in (q, k, v, bias)]
    out = evo_attention(*leaves[:3], bias=leaves[3], mask=mask)
    out.backward(torch.randn_like(out))
    assert torch.all(out == 0)
    for leaf in leaves:
        assert torch.all(leaf.grad == 0) and not torch.isnan(leaf.grad).any()


def test_reference_matches_float64_eager():
    q, k, v, bias, mask = _make_inputs(1, 2, 15, 2, 8, "shared", True, strided=False, dtype=torch.float32)
    scale = 8**-0.5
    truth = _eager_attention(q.double(), k.double(), v.double(), bias.double(), mask, scale)
    assert rel_error(evo_attention_reference(q, k, v, bias, mask, scale), truth) < 1e-6


def test_cpu_without_interpreter_uses_reference(monkeypatch):
    if DEVICE == "cuda":
        pytest.skip("the reference fallback is the CPU path; this machine runs the kernels on CUDA")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v, bias, mask = _make_inputs(1, 2, 11, 1, 8, "shared", True, strided=False, dtype=torch.float32)
    torch.testing.assert_close(
        evo_attention(q, k, v, bias=bias, mask=mask), evo_attention_reference(q, k, v, bias, mask), rtol=0, atol=0
    )


def test_opcheck_forward_and_backward_ops():
    q, k, v, bias, mask = _make_inputs(1, 2, 9, 1, 8, "shared", True, strided=False, dtype=torch.float32)
    leaves = [x.detach().requires_grad_() for x in (q, k, v, bias)]
    torch.library.opcheck(torch.ops.featurecache.evo_attention_fwd.default, (*leaves, mask, 0.35))
    torch.library.opcheck(torch.ops.featurecache.evo_attention_fwd.default, (q, k, v, None, None, 0.35))
    out, lse, key_end = torch.ops.featurecache.evo_attention_fwd(q, k, v, bias, mask, 0.35)
    grad_out = torch.randn_like(out)
    torch.library.opcheck(
        torch.ops.featurecache.evo_attention_bwd.default,
        (grad_out, q, k, v, bias, mask, out, lse, key_end, 0.35, True),
    )


def test_compiles_without_graph_break():
    q, k, v, bias, mask = _make_inputs(1, 2, 10, 1, 8, "per_row", True, strided=False, dtype=torch.float32)
    leaves = [x.detach().requires_grad_() for x in (q, k, v, bias)]

    def layer(q_, k_, v_, bias_):
        return evo_attention(q_ * 2.0, k_, v_, bias=bias_, mask=mask).sum()

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    compiled(*leaves).backward()
    expected = [x.detach().requires_grad_() for x in (q, k, v, bias)]
    layer(*expected).backward()
    for got, want in zip(leaves, expected):
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=0)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda q, k, v, b, m: (q[..., :5], k[..., :5], v[..., :5], None, None), "head dim 5"),
        (lambda q, k, v, b, m: (q, k[:, :1], v, b, m), "k has shape"),
        (lambda q, k, v, b, m: (q, k, v, b[..., :-1], m), "bias has shape"),
        (lambda q, k, v, b, m: (q, k, v, b.half(), m), "bias is torch.float16"),
        (lambda q, k, v, b, m: (q, k, v, b, m.float()), "mask is torch.float32"),
        (lambda q, k, v, b, m: (q.double(), k.double(), v.double(), None, None), "dtype torch.float64"),
    ],
)
def test_rejects_bad_inputs_with_named_reason(change, message):
    inputs = _make_inputs(1, 2, 7, 1, 8, "shared", True, strided=False, dtype=torch.float32)
    with pytest.raises(ValueError, match=message):
        evo_attention(*change(*inputs)[:3], bias=change(*inputs)[3], mask=change(*inputs)[4])


def test_tuned_config_file_parses_and_covers_every_head_dim():
    tuned = load_tuned_configs()
    assert tuned, f"no tuned GPU configs in {CONFIG_FILE}"
    for gpu, entries in tuned.items():
        largest_dim = max(dim_max for dim_max, _, _ in entries)
        assert largest_dim >= max(padded_head_dim(d) for d in SUPPORTED_HEAD_DIMS), gpu
        for _, _, config in entries:
            for block in (config.fwd, config.bwd_kv, config.bwd_q, config.bwd_bias):
                assert block.block_m >= 16 and block.block_n >= 16, f"{gpu}: {block}"
                assert block.block_m & (block.block_m - 1) == 0, f"{gpu}: {block} not a power of two"


def test_heuristic_config_for_unseen_device():
    config = select_config(24, 1000, torch.device("cpu"))
    assert isinstance(config.fwd, BlockConfig) and config.fwd.block_m >= 16


def test_row_group_kernels_match_plain_kernels():
    # N = 5 rows in groups of 4 leaves a partial last group; one row is fully masked.
    q, k, v, bias, mask = _make_inputs(1, 5, 21, 2, 24, "shared", True, strided=True, dtype=torch.bfloat16)
    grad_out = torch.randn(q.shape, device=DEVICE, dtype=q.dtype)
    scale = 24**-0.5
    base = select_config(24, 21, q.device)
    results = {}
    for rows in (1, 4):
        config = dataclasses.replace(
            base,
            fwd=dataclasses.replace(base.fwd, rows=rows),
            bwd_kv=dataclasses.replace(base.bwd_kv, rows=rows),
            bwd_q=dataclasses.replace(base.bwd_q, rows=rows),
        )
        out, lse, key_end = evo_attention_forward(q, k, v, bias, mask, scale, config)
        grads = evo_attention_backward(grad_out, q, k, v, bias, mask, out, lse, key_end, scale, True, config)
        results[rows] = (out, lse, *grads)
    truth = _eager_attention(q.double(), k.double(), v.double(), bias.double(), mask, scale)
    eager = _eager_attention(q, k, v, bias, mask, scale)
    bound = ERROR_FACTOR * rel_error(eager, truth) + ERROR_FLOOR[q.dtype]
    assert rel_error(results[4][0], truth) <= bound
    for name, plain, grouped in zip(["out", "lse", "dq", "dk", "dv", "dbias"], results[1], results[4]):
        finite = torch.isfinite(plain)
        assert torch.equal(finite, torch.isfinite(grouped)), f"{name}: non-finite entries differ"
        torch.testing.assert_close(grouped[finite], plain[finite], rtol=2e-2, atol=2e-2, msg=name)
    empty = ~mask.any(dim=-1)  # [B, N]
    assert torch.all(torch.isinf(results[4][1][empty]))


@pytest.mark.parametrize(
    "bias_rows, bias_dtype, strided",
    [
        ("shared", torch.float32, False),
        ("shared", torch.bfloat16, True),
        ("per_row", torch.float32, False),
        (None, None, False),
    ],
)
def test_fused_backward_matches_split_backward(bias_rows, bias_dtype, strided):
    # The fused backward sums dQ and dBias by atomics in another order than the split kernels:
    # same values up to rounding, against float64 truth as tightly as the split path. Odd sizes,
    # ragged blocks, one fully masked row; a per-row bias gradient, or none, takes the split
    # kernels. Strided: the gradients are written into views of one packed tensor, as gated
    # attention passes them (the fused path sums dq in a contiguous fp32 buffer, then copies it
    # into dq's own layout).
    q, k, v, bias, mask = _make_inputs(1, 3, 21, 2, 24, bias_rows, True, strided=strided, dtype=torch.bfloat16)
    if bias is not None:
        bias = bias.to(bias_dtype)
    grad_out = torch.randn(q.shape, device=DEVICE, dtype=q.dtype)
    scale = 24**-0.5
    base = select_config(24, 21, q.device)
    results = {}
    for mode in ("split", "fused"):
        config = dataclasses.replace(base, bwd_mode=mode, fp32_bias_bwd_mode=mode)
        out, lse, key_end = evo_attention_forward(q, k, v, bias, mask, scale, config)
        packed = torch.full((1, 21, 3, 2, 3 * 24), float("nan"), device=DEVICE, dtype=q.dtype).transpose(1, 2)
        grads = evo_attention_backward(
            grad_out,
            q,
            k,
            v,
            bias,
            mask,
            out,
            lse,
            key_end,
            scale,
            bias is not None,
            config,
            grads=tuple(packed.split(24, dim=-1)) if strided else None,
        )
        if strided:
            assert grads[0].data_ptr() == packed.data_ptr(), "dq must be written into the view it was given"
        results[mode] = [g for g in grads if g is not None]
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v) + ((bias,) if bias is not None else ())]
    truth_out = _eager_attention(*leaves[:3], leaves[3] if bias is not None else None, mask, scale)
    truth_out.backward(grad_out.double())
    for name, split, fused, leaf in zip(["dq", "dk", "dv", "dbias"], results["split"], results["fused"], leaves):
        assert fused.dtype == split.dtype and fused.shape == split.shape, name
        assert rel_error(fused, leaf.grad) <= 1.5 * rel_error(split, leaf.grad) + 1e-3, name
    empty = ~mask.any(dim=-1)  # [B, N]
    assert torch.all(results["fused"][0][empty] == 0), "fully masked rows must give zero dq"


def test_fp32_bias_mode_and_deterministic_runs_take_the_split_backward(monkeypatch):
    # An fp32 bias uses fp32_bias_bwd_mode; without a shared bias's gradient to sum, and under
    # torch.use_deterministic_algorithms, the fused mode takes the split kernels (whose results
    # are bitwise reproducible).
    q, k, v, bias, mask = _make_inputs(1, 3, 21, 2, 24, "shared", True, strided=False, dtype=torch.bfloat16)
    grad_out = torch.randn(q.shape, device=DEVICE, dtype=q.dtype)
    scale = 24**-0.5
    base = select_config(24, 21, q.device)
    fused = dataclasses.replace(base, bwd_mode="fused", fp32_bias_bwd_mode="split")
    assert fused.backward_mode(torch.float32) == "split" and fused.backward_mode(torch.bfloat16) == "fused"
    launched = []
    original = evo_launch._launch_fused_backward
    monkeypatch.setattr(evo_launch, "_launch_fused_backward", lambda *a, **kw: (launched.append(1), original(*a, **kw)))

    def backward(config, bias_, bias_grad=True):
        out, lse, key_end = evo_attention_forward(q, k, v, bias_, mask, scale, config)
        return evo_attention_backward(grad_out, q, k, v, bias_, mask, out, lse, key_end, scale, bias_grad, config)

    backward(fused, bias)  # fp32 bias: split
    backward(fused, bias.to(torch.bfloat16), bias_grad=False)  # no bias gradient: split, measured faster
    backward(fused, None, bias_grad=False)
    assert not launched
    backward(fused, bias.to(torch.bfloat16))
    assert launched == [1]
    split = backward(dataclasses.replace(base, bwd_mode="split"), bias.to(torch.bfloat16))
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    deterministic = backward(fused, bias.to(torch.bfloat16))
    assert launched == [1]
    for name, a, b in zip(["dq", "dk", "dv", "dbias"], split, deterministic):
        assert torch.equal(a, b), name


def _config_entry(**modes) -> dict:
    block = {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2, "rows": 1}
    return {
        "head_dim_max": 32,
        "seq_len_max": 1024,
        **modes,
        **{name: dict(block) for name in ("fwd", "bwd_kv", "bwd_q", "bwd_bias")},
    }


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    """A stand-in for configs/evo_attention.json: write(entries) fills it; the loader's cache is
    cleared before and after, so the real file is read again afterwards."""
    path = tmp_path / "evo_attention.json"
    monkeypatch.setattr(evo_config, "CONFIG_FILE", path)
    load_tuned_configs.cache_clear()
    yield lambda entries: path.write_text(json.dumps({"gpus": {"Test GPU": entries}}))
    load_tuned_configs.cache_clear()


def test_config_file_with_removed_backward_modes_still_loads(config_file):
    # Files written before the 2026-12-04 clean-up may name "atomic_dbias", "walk" and row pairs.
    old_block = {"block_m": 32, "block_n": 64, "num_warps": 8, "num_stages": 2, "rows": 1, "paired": True}
    entry = _config_entry(bwd_mode="atomic_dbias", fp32_bias_bwd_mode="walk")
    entry["bwd_kv"] = old_block
    config_file([entry])
    with pytest.warns(UserWarning) as caught:
        ((_, _, config),) = load_tuned_configs()["Test GPU"]
    assert [str(w.message).split(": ", 1)[1] for w in caught] == [
        "gpus['Test GPU'][0].bwd_mode 'atomic_dbias' was removed; running 'fused' instead",
        "gpus['Test GPU'][0].fp32_bias_bwd_mode 'walk' was removed; running 'split' instead",
    ]
    assert (config.bwd_mode, config.fp32_bias_bwd_mode) == ("fused", "split")
    assert config.bwd_kv == BlockConfig(32, 64, 8, 2)


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            _config_entry(bwd_mode="sideways"),
            r"\[0\]\.bwd_mode is 'sideways'; expected one of \('split', 'fused'\)",
        ),
        (_config_entry(fp32_bias_bwd_mode=3), r"\[0\]\.fp32_bias_bwd_mode is 3; expected one of"),
        ({**_config_entry(), "fwd": {"block_m": 64}}, r"bad block config at gpus\['Test GPU'\]\[0\]\.fwd"),
        ("fused", r"gpus\['Test GPU'\]\[0\] is str, expected an object"),
    ],
)
def test_config_file_errors_name_the_file_entry_and_field(config_file, entry, message):
    config_file([entry])
    with pytest.raises(ValueError, match=message) as raised:
        load_tuned_configs()
    assert str(raised.value).startswith(str(evo_config.CONFIG_FILE)) and raised.value.__cause__ is None


def test_config_rejects_an_unknown_backward_mode():
    base = select_config(24, 21, torch.device("cpu"))
    with pytest.raises(ValueError, match="bwd_mode"):
        dataclasses.replace(base, bwd_mode="sideways")


def test_custom_op_autograd_matches_eager_path():
    # torch.compile runs the custom ops and their registered autograd; eager runs an
    # autograd.Function over the same launchers. Both must give the same gradients.
    q, k, v, bias, mask = _make_inputs(1, 3, 14, 2, 16, "shared", True, strided=False, dtype=torch.float32)
    grad_out = torch.randn(q.shape, device=DEVICE)
    via_op = [x.detach().requires_grad_() for x in (q, k, v, bias)]
    out, _, _ = torch.ops.featurecache.evo_attention_fwd(*via_op, mask, 0.25)
    out.backward(grad_out)
    via_function = [x.detach().requires_grad_() for x in (q, k, v, bias)]
    evo_attention(*via_function[:3], bias=via_function[3], mask=mask, scale=0.25).backward(grad_out)
    for name, a, b in zip(["dq", "dk", "dv", "dbias"], via_op, via_function):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0, msg=name)


def test_wide_index_is_chosen_from_the_tile_extent_of_each_layout():
    # Meta tensors give the layouts of L = 2048 without memory: a triangle attention projection
    # [B, L, L, 528] (16-aligned rows of 4 x (4 x 32) + 4) read as q for either node.
    length = 2048
    packed = torch.empty(1, length, length, 528, device="meta", dtype=torch.bfloat16)
    starting = packed[..., :128].unflatten(-1, (4, 32))  # [B, i, j, H, D]: positions 528 apart
    ending = starting.transpose(1, 2)  # positions L x 528 apart: a tile spans 2.2e9 elements
    assert not wide_index(starting, starting, starting)
    assert wide_index(starting, ending, starting)
    contiguous = torch.empty(1, 4096, 4096, 4, 32, device="meta", dtype=torch.bfloat16)
    assert not wide_index(contiguous, bias=torch.empty(1, 1, 4, 4096, 4096, device="meta"))
    assert wide_index(bias=torch.empty(1, 1, 4, 46342, 46342, device="meta"))


def test_64_bit_tile_offsets_give_the_same_results(monkeypatch):
    # A forced limit of one element sends every launch down the WIDE_INDEX path; the results must
    # be bitwise those of the 32-bit path, for the plain, row-group and dBias kernels alike.
    q, k, v, bias, mask = _make_inputs(1, 5, 21, 2, 24, "shared", True, strided=True, dtype=torch.bfloat16)
    per_row = torch.randn(1, 5, 2, 21, 21, device=DEVICE)
    grad_out = torch.randn(q.shape, device=DEVICE, dtype=q.dtype)
    scale = 24**-0.5
    base = select_config(24, 21, q.device)
    grouped = dataclasses.replace(
        base,
        fwd=dataclasses.replace(base.fwd, rows=4),
        bwd_kv=dataclasses.replace(base.bwd_kv, rows=4),
        bwd_q=dataclasses.replace(base.bwd_q, rows=4),
    )

    def run_all():
        results = []
        for config, b in ((base, bias), (grouped, bias), (base, per_row)):
            out, lse, key_end = evo_attention_forward(q, k, v, b, mask, scale, config)
            results += [
                out,
                lse,
                key_end,
                *evo_attention_backward(grad_out, q, k, v, b, mask, out, lse, key_end, scale, True, config),
            ]
        return results

    narrow = run_all()
    assert not wide_index(q, k, v, bias=bias)
    monkeypatch.setattr(evo_launch, "INDEX_LIMIT", 1)
    assert wide_index(q, k, v, bias=bias)
    for index, (a, b) in enumerate(zip(narrow, run_all())):
        assert torch.equal(a, b), f"result {index} differs between 32 and 64-bit offsets"


def test_launches_past_the_grid_limit_are_refused_by_name():
    small = torch.empty((1, 2, 3, 1, 16), device="meta", dtype=torch.bfloat16)
    check_inputs(small, small, small, None, None)
    rows = torch.empty((1, 65536, 3, 1, 16), device="meta", dtype=torch.bfloat16)
    with pytest.raises(SizeLimitError, match=r"evo_attention: 65536 rows .* at most 65535"):
        check_inputs(rows, rows, rows, None, None)
