"""Pure-PyTorch references of every kernel: the CPU path and the ground truth for tests.

Each function has the same signature as its Triton counterpart. lDDT's numbers live here too
(thresholds, inclusion radii, `inclusion_radius`): the smooth LDDT's reference and kernel and
the model's lDDT share them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading

import torch
from torch._subclasses.fake_tensor import is_fake

from featurecache.kernels.weight_casts import cast_weight

# lDDT's numbers, defined once for the kernels and the model (model/objectives/lddt.py imports them)
LDDT_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)  # Angstrom
INCLUSION_RADIUS = 15.0  # Angstrom
NUCLEOTIDE_INCLUSION_RADIUS = 30.0  # Angstrom


def evo_attention_reference(q, k, v, bias=None, mask=None, scale=None):
    """Attention with pair bias and key mask.

    q, k, v: [B, N, L, H, D]; bias: [B, 1 or N, H, L, L]; mask: [B, N, L] bool (True = attend).
    Returns [B, N, L, H, D] in q's dtype. Rows whose keys are all masked give zeros.
    Softmax statistics are kept in fp32 whatever the input dtype.
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    # [B, N, H, Lq, Lk]
    logits = torch.einsum("bnqhd,bnkhd->bnhqk", q.float() * scale, k.float())
    if bias is not None:
        logits = logits.add_(bias.float())
    weights = masked_softmax(logits, None if mask is None else mask[:, :, None, None, :])
    out = torch.einsum("bnhqk,bnkhd->bnqhd", weights, v.float())
    return out.to(q.dtype)


def masked_softmax(logits: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis of the keys `keep` marks (broadcast over logits); a row with no
    key kept gets zeros. One fused softmax: each of the [..., Lq, Lk] temporaries of a written-out
    softmax costs a pass (and a saved tensor) on the CPU path, where triangle attention's L^3
    logits dominate a step. Masked logits get the dtype's lowest finite value rather than -inf:
    a row with no key then gives finite weights (zeroed below), never NaN, forward or backward."""
    if keep is None:
        return torch.softmax(logits, dim=-1)
    logits = logits.masked_fill_(~keep, torch.finfo(logits.dtype).min)
    return torch.softmax(logits, dim=-1).masked_fill(~keep.any(dim=-1, keepdim=True), 0.0)


def window_attention_reference(q, k, v, bias=None, mask=None, scale=None):
    """Attention inside windows with a bias and key mask shared by the samples.

    q [B, S, W, Q, H, D]; k, v [B, S, W, K, H, D]; bias [B, W, H, Q, K]; mask [B, W, K] bool
    (True = attend). Returns [B, S, W, Q, H, D] in q's dtype; queries whose keys are all masked
    give zeros. Computed in fp32 (float64 for float64 inputs), as evo_attention_reference.
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    batch, windows = q.shape[0], q.shape[2]

    def rows(t):  # [B, S, W, L, H, D] -> [B * W, S, L, H, D]
        return t.transpose(1, 2).flatten(0, 1)

    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    logits = torch.einsum("nsqhd,nskhd->nshqk", rows(q).to(work) * scale, rows(k).to(work))
    if bias is not None:
        logits = logits.add_(bias.to(work).flatten(0, 1)[:, None])
    keep = None if mask is None else mask.flatten(0, 1)[:, None, None, None, :]
    weights = masked_softmax(logits, keep)
    out = torch.einsum("nshqk,nskhd->nsqhd", weights, rows(v).to(work))
    return out.unflatten(0, (batch, windows)).transpose(1, 2).to(q.dtype)


def sigmoid_gate_reference(gate: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """sigmoid(gate) * out in gate's dtype (the attention modules' output gate)."""
    return torch.sigmoid(gate) * out.to(gate.dtype)


def swiglu_reference(gate: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """silu(gate) * out in gate's dtype (the SwiGLU's product, Algorithm 11)."""
    return torch.nn.functional.silu(gate) * out.to(gate.dtype)


def gated_pair_attention_reference(
    packed, mask, heads, head_dim, transpose=False, scale=None, attention=evo_attention_reference
):
    """Gated attention over a pair representation, from one packed projection.

    packed [B, L, L, P >= 4 * H * D + H]: per pair, the columns [q | k | v | gate | bias]
    (heads-major, D per head; the bias has one column per head). mask [B, L, L] bool.
    Row i attends over its keys (i, k) with the bias of pair (j, k) (triangle attention around
    the starting node); transpose=True attends down the columns instead (the ending node).
    Returns sigmoid(gate) * attention, [B, L, L, H * D]. `attention` is the attention function
    (this reference, or evo_attention where the packed op itself is not used).
    """
    inner = heads * head_dim
    # one split: its backward is a single concatenation (see featurecache.model.network.layers)
    *qkvg, bias, _ = packed.split([inner] * 4 + [heads, packed.shape[-1] - 4 * inner - heads], dim=-1)
    q, k, v, gate = (t.unflatten(-1, (heads, head_dim)) for t in qkvg)
    if transpose:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        bias = bias.permute(0, 3, 2, 1)
        mask = None if mask is None else mask.transpose(1, 2)
    else:
        bias = bias.permute(0, 3, 1, 2)
    mask = None if mask is None else mask.contiguous()
    out = attention(q, k, v, bias=bias.unsqueeze(1).contiguous(), mask=mask, scale=scale)
    if transpose:
        out = out.transpose(1, 2)
    # the gate is a strided slice of the packed columns: on the CPU a sigmoid over it takes the
    # scalar path, 4x slower than a copy and the vectorized one (20 -> 4.6 ms at L = 384, c = 16)
    return (torch.sigmoid(gate.contiguous()) * out).flatten(-2)


# Fused small ops (layernorm_linear, transition, triangle_mult). Convention shared with the Triton
# kernels: LayerNorm statistics and affine in fp32, its output rounded to the input dtype, and
# every matmul run in the input dtype with weights cast to it (parameters may stay fp32).


def _layer_norm(x, weight, bias, eps):
    out = torch.nn.functional.layer_norm(
        x.float(), x.shape[-1:], weight.float(), None if bias is None else bias.float(), eps
    )
    return out.to(x.dtype)


def _linear(x, weight, bias=None):
    return torch.nn.functional.linear(
        x, cast_weight(weight, x.dtype), None if bias is None else cast_weight(bias, x.dtype)
    )


def layernorm_linear_reference(x, norm_weight, norm_bias, weight, bias=None, eps=1e-5, any_layout=False):
    """linear(layer_norm(x)): x [..., K], weight [N, K], bias [N] or None -> [..., N].

    any_layout: the caller reads the result through its strides, so on the CPU it may come back
    channel-first (a transposed view) where that product is the faster one (_channel_first_faster)."""
    xn = _layer_norm(x, norm_weight, norm_bias, eps)
    if any_layout and _channel_first_faster(xn, weight):
        return _linear_channel_first(xn, weight, bias)
    return _linear(xn, weight, bias)


# MKL's x @ W^T on this repository's CPUs (AMD EPYC, 1-2 threads) is 2-3x slower where W has a number
# of rows that is not a multiple of 16 than the same sums as W @ x^T: at 147,456 rows, K = 16 -> N =
# 66 (the tiny preset's packed triangle-attention projection) 23 ms against 8.4, K = 128 -> 516 332
# against 286 (benchmarks/NOTES.md section 22). Below a few thousand rows the difference is noise.
CHANNEL_FIRST_MIN_ROWS = 4096


def _channel_first_faster(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and weight.shape[0] % 16 != 0
        and x.numel() >= CHANNEL_FIRST_MIN_ROWS * x.shape[-1]
        and not torch.compiler.is_compiling()
    )


def _linear_channel_first(x, weight, bias=None):
    """_linear's values as the transposed view of W @ x^T: [..., N] with the channels strided."""
    rows = x.reshape(-1, x.shape[-1])
    weight = cast_weight(weight, x.dtype)
    if bias is None:
        out = torch.mm(weight, rows.t())
    else:
        out = torch.addmm(cast_weight(bias, x.dtype)[:, None], weight, rows.t())
    return out.t().unflatten(0, x.shape[:-1])


def transition_reference(x, norm_weight, norm_bias, weight_a, weight_b, weight_out, eps=1e-5):
    """AF3 Transition (Algorithm 11).

    x [..., C]; weight_a, weight_b [n*C, C]; weight_out [C, n*C] -> [..., C].
    """
    xn = _layer_norm(x, norm_weight, norm_bias, eps)
    hidden = torch.nn.functional.silu(_linear(xn, weight_a)) * _linear(xn, weight_b)
    return _linear(hidden, weight_out)


def triangle_mult_reference(
    z,
    mask,
    norm_in_weight,
    norm_in_bias,
    weight_a_p,
    weight_a_g,
    weight_b_p,
    weight_b_g,
    weight_g,
    norm_out_weight,
    norm_out_bias,
    weight_z,
    direction="outgoing",
    eps=1e-5,
):
    """AF3 triangle multiplicative update (Algorithms 12/13) without the residual.

    z [B, L, L, C]; mask [B, L, L] bool or None; weight_{a,b}_{p,g} [H, C]; weight_g [C, C];
    norm_out over H; weight_z [C, H]. Returns [B, L, L, C] in z's dtype.
    """
    if direction not in ("outgoing", "incoming"):
        raise ValueError(f"direction must be 'outgoing' or 'incoming', got {direction!r}")
    zn = _layer_norm(z, norm_in_weight, norm_in_bias, eps)
    a = torch.sigmoid(_linear(zn, weight_a_g)) * _linear(zn, weight_a_p)
    b = torch.sigmoid(_linear(zn, weight_b_g)) * _linear(zn, weight_b_p)
    if mask is not None and not _keeps_every_pair(mask):
        keep = mask.unsqueeze(-1).to(a.dtype)
        a = a * keep
        b = b * keep
    x = _triangle_product(a, b, direction == "outgoing")
    gate = torch.sigmoid(_linear(zn, weight_g))
    return gate * _linear(_layer_norm(x, norm_out_weight, norm_out_bias, eps), weight_z)


def _keeps_every_pair(mask: torch.Tensor) -> bool:
    """A CPU mask with no pair masked (a crop without padding): multiplying by it is the identity,
    four passes over [B, L, L, H] a call forward and backward. Elsewhere the question would cost a
    device sync (and break CUDA graphs and compiled graphs), and a fake tensor (FLOP counting,
    tracing) has no values to ask: the product stays."""
    return mask.device.type == "cpu" and not torch.compiler.is_compiling() and not is_fake(mask) and bool(mask.all())


def _triangle_product(a: torch.Tensor, b: torch.Tensor, outgoing: bool) -> torch.Tensor:
    """x[b, i, j, c] = sum_k a[b, i, k, c] b[b, j, k, c] (outgoing) or a[b, k, i, c] b[b, k, j, c]
    (incoming), as one batched product over channel-first copies of a and b, returned as a
    channel-last view. The same sums as torch.einsum, whose own layout for these runs the CPU's
    products ~1.4x slower (fwd + bwd at L = 384, C = 16: 134 -> 95 ms, 1 thread)."""
    a_cf, b_cf = (t.permute(0, 3, 1, 2).contiguous() for t in (a, b))
    x = torch.matmul(a_cf, b_cf.transpose(-1, -2)) if outgoing else torch.matmul(a_cf.transpose(-1, -2), b_cf)
    return x.permute(0, 2, 3, 1)


# AF3's conditioned transition (Algorithms 25, 26). Same convention as above, except that the
# normalization and the sigmoid modulations are computed in float64 for float64 inputs (the tests'
# truth) rather than fp32.


def _wide(x):
    return x.double() if x.dtype == torch.float64 else x.float()


def adaln_conditioning(s, norm_s_weight, scale_weight, scale_bias, shift_weight, eps=1e-5):
    """AdaLN's s side: (Linear(LN(s)), LinearNoBias(LN(s))), the scale logits and the shift,
    [..., C_a] each in s's dtype. LN(s) has a weight and no bias (Algorithm 26)."""
    s_norm = torch.nn.functional.layer_norm(_wide(s), s.shape[-1:], _wide(norm_s_weight), None, eps).to(s.dtype)
    return _linear(s_norm, scale_weight, scale_bias), _linear(s_norm, shift_weight)


def adaln_modulate(a, scale, shift, eps=1e-5):
    """sigmoid(scale) * LayerNorm(a) + shift, the LayerNorm without affine; a's dtype."""
    a_norm = torch.nn.functional.layer_norm(_wide(a), a.shape[-1:], None, None, eps)
    return (torch.sigmoid(_wide(scale)) * a_norm + _wide(shift)).to(a.dtype)


def conditioned_transition_reference(
    a,
    s,
    norm_s_weight,
    scale_weight,
    scale_bias,
    shift_weight,
    weight_a,
    weight_b,
    weight_out,
    gate_weight,
    gate_bias,
    eps=1e-5,
):
    """AF3 ConditionedTransitionBlock (Algorithm 25) with its AdaLN (Algorithm 26).

    a [..., C_a]; s [..., C_s] with a's leading shape or one broadcast to it (s [B, 1, L, C_s]
    shared by the samples of a [B, S, L, C_a]); weight_a, weight_b [n*C_a, C_a]; weight_out
    [C_a, n*C_a]; scale_weight, shift_weight, gate_weight [C_a, C_s]. Returns [..., C_a] in a's
    dtype: sigmoid(Linear(s)) * LinearNoBias(swish(LinearNoBias(x)) * LinearNoBias(x)),
    x = AdaLN(a, s).
    """
    scale, shift = adaln_conditioning(s, norm_s_weight, scale_weight, scale_bias, shift_weight, eps)
    x = adaln_modulate(a, scale, shift, eps)
    hidden = torch.nn.functional.silu(_linear(x, weight_a)) * _linear(x, weight_b)
    out = _linear(hidden, weight_out)
    gate = _linear(s, gate_weight, gate_bias)
    return (torch.sigmoid(_wide(gate)) * _wide(out)).to(a.dtype)


# --- Dropout masks from a seed (AF3 Algorithms 8 and 17: DropoutRowwise, DropoutColumnwise) ----
# A mask is a pure function of a per-call seed tensor, the site it serves, and the indices it
# covers: no generator state is read, so the recomputation of a checkpointed block draws the very
# same mask, a CUDA graph replays it from the seed drawn on the device at each replay, and padding
# tokens (which come after the real ones) leave the real tokens' masks unchanged. The residual
# add's kernel (kernels/residual) computes the same hash per element, in 32-bit arithmetic.

DROPOUT_HASH_MULTIPLIER = 0x45D9F3B  # below 2**27: the products of 32-bit values stay inside int64
DROPOUT_SITE_MULTIPLIER = 0x9E3779B9
UINT32 = 0xFFFFFFFF


def hash32(value: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix (two multiply-xorshift rounds) of int64 values in [0, 2**32)."""
    value = ((value >> 16) ^ value) * DROPOUT_HASH_MULTIPLIER & UINT32
    value = ((value >> 16) ^ value) * DROPOUT_HASH_MULTIPLIER & UINT32
    return (value >> 16) ^ value


def dropout_site_mix(site: int) -> int:
    """What a site folds into the seed before the indices: seed ^ this, then hashed."""
    return site * DROPOUT_SITE_MULTIPLIER & UINT32


def dropout_threshold(rate: float) -> int:
    """An element is kept where its 32-bit hash is at least this."""
    return int(rate * 2**32)


@functools.cache  # per launch otherwise: a host tensor for two numbers
def dropout_scale(rate: float, dtype: torch.dtype) -> float:
    """1 / (1 - rate) as the dropped tensor's dtype holds it (the multiplier of a kept value)."""
    return torch.tensor(1.0 / (1.0 - rate), dtype=torch.float32).to(dtype).item()


def shared_dropout_reference(
    update: torch.Tensor, rate: float, seed: torch.Tensor | None, site: int, shared_dim: int
) -> torch.Tensor:
    """Dropout of `update` [B, X, Y, C] with one mask shared along `shared_dim` (1: AF3's
    DropoutRowwise, the same mask for every row; 2: DropoutColumnwise), kept values scaled by
    1 / (1 - rate). `seed` (0-d int64 in [0, 2**32)) None or rate 0: `update` unchanged."""
    if seed is None or rate <= 0.0:
        return update
    shape = list(update.shape)
    shape[shared_dim] = 1
    mixed = hash32(seed ^ dropout_site_mix(site))
    for dim, size in enumerate(shape):  # fold in each index along the mask's axes
        if dim != shared_dim:
            index = torch.arange(size, device=update.device).view([-1 if d == dim else 1 for d in range(len(shape))])
            mixed = hash32(mixed ^ index)
    keep = mixed >= dropout_threshold(rate)  # [B, 1, Y, C] or [B, X, 1, C]
    return update * (keep.to(update.dtype) * (1.0 / (1.0 - rate)))


@dataclasses.dataclass(frozen=True)
class DropoutSite:
    """A shared dropout applied to a residual update before it is added (shared_dropout_reference's
    arguments): the residual add's kernel draws the mask in the same pass."""

    rate: float
    seed: torch.Tensor  # 0-d int64
    site: int
    shared_dim: int  # 1 (rowwise) or 2 (columnwise) of a [B, X, Y, C] update


def residual_add_reference(
    z: torch.Tensor, update: torch.Tensor, dropout: DropoutSite | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(z + update, the same in autocast's dtype): PyTorch ops, with `dropout` applied to update
    first. Without autocast, or for a stream that is not fp32, both are the same tensor."""
    if dropout is not None:
        update = shared_dropout_reference(update, dropout.rate, dropout.seed, dropout.site, dropout.shared_dim)
    new = z + update
    if new.dtype == torch.float32 and torch.is_autocast_enabled(new.device.type):
        return new, new.to(torch.get_autocast_dtype(new.device.type))
    return new, new


def inclusion_radius(is_nucleotide: torch.Tensor, resolved: torch.Tensor) -> torch.Tensor:
    """Per atom [B, A]: NUCLEOTIDE_INCLUSION_RADIUS for nucleotide atoms, INCLUSION_RADIUS
    otherwise, 0 for unresolved atoms."""
    return torch.where(resolved, torch.where(is_nucleotide, NUCLEOTIDE_INCLUSION_RADIUS, INCLUSION_RADIUS), 0.0)


def smooth_lddt_sums_reference(
    predicted: torch.Tensor, true: torch.Tensor, radius: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the pair scores [B, S], number of pairs [B]) from dense [A, A] tensors; predicted
    [B, S, A, 3], true [B, A, 3], radius [B, A] (inclusion_radius). The tests' ground truth."""
    eye = torch.eye(true.shape[1], dtype=torch.bool, device=true.device)

    def distances(x):  # the diagonal (excluded below) set to 1: sqrt has no gradient at 0
        return ((x[..., :, None, :] - x[..., None, :, :]).square().sum(-1) + eye).sqrt()

    true_distance = distances(true)  # [B, A, A]
    resolved = radius > 0
    included = (true_distance < radius[..., None]) & resolved[:, :, None] & resolved[:, None, :] & ~eye
    error = (distances(predicted) - true_distance[:, None]).abs()
    score = sum(torch.sigmoid(threshold - error) for threshold in LDDT_THRESHOLDS) / len(LDDT_THRESHOLDS)
    included = included.to(score.dtype)
    return (score * included[:, None]).sum(dim=(-1, -2)), included.sum(dim=(-1, -2))


# --- EvoAttention a block of rows at a time (the CPU path) ---------------------------------------
# EvoAttention in PyTorch ops, a block of rows at a time: the attention of the CPU path.
#
# evo_attention_reference computes every row's [H, L, L] logits at once, and autograd keeps the
# softmax weights for backward: for triangle attention (N = L rows) that is H L^3 floats, 453 MB at
# L = 384 with the tiny preset's 2 heads, whatever the channel width, and a step makes several such
# temporaries per attention (logits, weights, their copies for the products, their gradients). Here
# forward takes the rows ROW_BLOCK_ELEMENTS logits at a time and keeps its inputs and output; backward
# recomputes each block's weights (one more q k^T) and forms the gradients from them, as a flash
# attention backward does. Memory then follows the inputs (L^2 per row block), not L^3. An
# attention whose logits fit one block (single attention at small sizes) runs the reference.
#
# The arithmetic per row is the reference's masked softmax, in base 2: the logits are formed times
# log2(e) (q scaled by scale * log2(e), the bias added times log2(e)) and exponentiated with exp2,
# which this CPU's torch runs 2.6x faster than exp and faster than softmax's own (benchmarks/
# NOTES.md section 25); the weights are the reference's to fp32 rounding. The key mask rides in
# the product as one more term (_logit_operands). Forward keeps two numbers per row beside its
# output, the peak logit and the inverse sum of exponentials, so that backward forms a block's
# weights as forward did (product, bias, minus the peak, exp2: no softmax) and folds the inverse
# sums into its thin operands. Weights times v are computed transposed, the thin operand on the
# left; the softmax gradient is flash attention's, w * (dw - dout . out), equal to autograd's to
# fp32 rounding.
# Off the CPU (the `torch` kernels on a GPU, a benchmark peer) evo_attention_rows is the reference itself.

# Logits per row block (B x rows x H x L x L fp32: 4 MiB; a block holds a few tensors this size,
# so they stay in a 32 MiB L3 beside the operands). Forward + backward of one triangle attention at
# L = 384, 2 heads, 4 rows masked (benchmarks/NOTES.md section 24), medians of 6:
#   2 threads: 0.35 s at 1 and 2 MiB, 0.34 s at 4 MiB, 0.42 s at 8 MiB
#   1 thread:  0.65-0.70 s at 1 to 4 MiB, 0.78 s at 8 MiB; 1.1 s at 32 MiB (out of cache)
ROW_BLOCK_ELEMENTS = 1 << 20
# A masked key's logit: far below any real one (so its weight is exactly 0), far above fp32's
# lowest value (so adding the bias cannot overflow to -inf).
MASKED_LOGIT = -1e30
# The logits of the row blocks are natural logits times log2(e), exponentiated by exp2.
LOG2_E = 1.0 / math.log(2.0)


def evo_attention_rows(q, k, v, bias=None, mask=None, scale=None, block_elements: int | None = None):
    """evo_attention_reference's contract (q, k, v [B, N, L, H, D]; bias [B, 1 or N, H, L, L];
    mask [B, N, L] bool, True = attend; rows with every key masked give zeros; output in q's
    dtype), computed on the CPU as many rows at a time as fit `block_elements` logits (default
    ROW_BLOCK_ELEMENTS, read at the call; at least one row). Attention whose logits fit one
    block is the reference itself (nothing to save by recomputing them)."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    block_elements = ROW_BLOCK_ELEMENTS if block_elements is None else block_elements
    batch, rows, length, heads, _ = q.shape
    if q.device.type != "cpu" or batch * rows * heads * length * length <= block_elements:
        return evo_attention_reference(q, k, v, bias, mask, scale)
    frames = [] if torch.compiler.is_compiling() else _recompute_frames()  # compiled code: no Python state
    if not frames:
        return _RowBlockAttention.apply(q, k, v, bias, mask, float(scale), block_elements, None)
    frame = frames[-1]
    if frame.replay:  # a checkpoint's recompute: the first forward's output, a backward node
        return _RowBlockAttention.apply(q, k, v, bias, mask, float(scale), block_elements, frame.take())
    if torch.is_grad_enabled():  # not a checkpoint's first forward (that runs without gradient)
        return _RowBlockAttention.apply(q, k, v, bias, mask, float(scale), block_elements, None)
    # a checkpoint's first forward: kept (taken from an enclosing recompute's, where checkpoints nest)
    enclosing = next((outer for outer in reversed(frames[:-1]) if outer.replay), None)
    kept = enclosing.take() if enclosing is not None else _row_block_forward(q, k, v, bias, mask, scale, block_elements)
    frame.results.append(kept)
    return kept[0].to(q.dtype, memory_format=torch.contiguous_format)


# --- Forward results kept for a checkpoint's recompute (the CPU path) ----------------------------
# A checkpointed block runs its forward twice: without gradient, then again in backward to build
# its graph. The row-block attention's forward (two products, the bias and the softmax over
# H L^3 logits) is a fifth of the triangle attention's cost, its output only L^2 H D: under
# `kept_for_recompute(results, replay=False)` (the first forward) evo_attention_rows appends its
# outputs (with their rows' softmax statistics) to `results`; under `replay=True` (the recompute)
# it takes them back in the same order and only builds the backward node.
# model/network/checkpointing.py opens both frames. Nested checkpoints (a group re-run with a
# checkpoint per block) hand the results down: an inner first forward takes from the enclosing
# recompute's and keeps them for its own.
_recompute = threading.local()


class _RecomputeFrame:
    def __init__(self, results: list, replay: bool) -> None:
        self.results, self.replay, self.next = results, replay, 0

    def take(self) -> tuple:
        if self.next >= len(self.results):
            raise RuntimeError("a checkpoint's recompute ran more attention calls than its first forward")
        out = self.results[self.next]
        self.results[self.next] = None  # each is taken once: free it with its node's saved tensors
        self.next += 1
        return out


def _recompute_frames() -> list:
    if not hasattr(_recompute, "frames"):
        _recompute.frames = []
    return _recompute.frames


@contextlib.contextmanager
def kept_for_recompute(results: list, replay: bool):
    """Within it, evo_attention_rows keeps its outputs in `results` (replay=False: a checkpoint's
    first forward) or takes them back in order (replay=True: the checkpoint's recompute)."""
    frames = _recompute_frames()
    frames.append(_RecomputeFrame(results, replay))
    try:
        yield
    finally:
        frames.pop()


def gated_pair_attention_rows(packed, mask, heads, head_dim, transpose=False, scale=None):
    """gated_pair_attention_reference over evo_attention_rows: the CPU path's triangle attention,
    one function (not a partial made per module), so every module built holds the same object."""
    return gated_pair_attention_reference(packed, mask, heads, head_dim, transpose, scale, attention=evo_attention_rows)


def _row_blocks(q: torch.Tensor, block_elements: int) -> list[slice]:
    batch, rows, length, heads, _ = q.shape
    per_block = max(1, block_elements // max(1, batch * heads * length * length))
    return [slice(start, min(start + per_block, rows)) for start in range(0, rows, per_block)]


def _heads_first(t: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """[B, N, L, H, D] -> fp32 [B, N, H, L, D], or with `transposed` [B, N, H, D, L], contiguous:
    each row block's products then read their operands in place (no copy per block)."""
    order = (0, 1, 3, 4, 2) if transposed else (0, 1, 3, 2, 4)
    return t.float().permute(order).contiguous()


def _logit_operands(q, k, mask, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q' [B, N, H, L, D'] and k'^T [B, N, H, D', L] whose product is the base-2 logits
    q k^T * scale * log2(e) with the key mask in them: with a mask, D' = D + 1, q' = [q * s, 1]
    and k' = [k, 0 or MASKED_LOGIT], so a masked key's logit is MASKED_LOGIT (its weight exactly
    0) without a masked_fill over the logits (a pass as costly as the product itself); a kept
    key's extra term is an exact 0. Each written once into its layout (q and k are strided views
    of a packed projection: a concatenation, then a copy to the layout, cost 2.5x)."""
    batch, rows, length, heads, head_dim = q.shape
    extended = head_dim + (mask is not None)
    q_heads = torch.empty(batch, rows, heads, length, extended, dtype=torch.float32, device=q.device)
    k_t = torch.empty(batch, rows, heads, extended, length, dtype=torch.float32, device=k.device)
    q_heads[..., :head_dim] = q.permute(0, 1, 3, 2, 4)
    q_heads.mul_(scale * LOG2_E)  # in fp32, as the reference scales q.float()
    k_t[..., :head_dim, :] = k.permute(0, 1, 3, 4, 2)
    if mask is not None:
        q_heads[..., head_dim] = 1.0
        k_t[..., head_dim, :] = torch.where(mask, 0.0, MASKED_LOGIT)[:, :, None, :]
    return q_heads, k_t


def _exponentials(
    q_heads, k_t, bias, rows: slice, peak: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block of rows' exp2(logits - peak) [B, rows, H, Lq, Lk] from _logit_operands, and the
    peak [B, rows, H, Lq, 1], each row's largest logit (given: backward's, the forward's own,
    so that both form the same numbers). In place (nothing here is recorded by autograd)."""
    q_block, k_block = q_heads[:, rows], k_t[:, rows]
    if bias is None:
        logits = torch.matmul(q_block, k_block)
    else:  # bias * log2(e) + q k^T as one product accumulating onto a copy of the bias: one pass fewer
        bias_rows = bias[:, rows if bias.shape[1] > 1 else slice(None)]
        logits = torch.empty(q_block.shape[:-1] + k_block.shape[-1:], dtype=torch.float32, device=q_block.device)
        logits.copy_(bias_rows.expand(logits.shape))
        length_q, length_k, depth = q_block.shape[-2], k_block.shape[-1], q_block.shape[-1]
        logits.view(-1, length_q, length_k).baddbmm_(
            q_block.reshape(-1, length_q, depth), k_block.reshape(-1, depth, length_k), beta=LOG2_E
        )
    if peak is None:
        peak = logits.amax(dim=-1, keepdim=True)
    return logits.sub_(peak).exp2_(), peak


def _inverse_totals(exponentials: torch.Tensor, mask, rows: slice) -> torch.Tensor:
    """1 / each row's sum of exponentials [B, rows, H, Lq, 1]: the softmax weights are
    exponentials times it. 0 for a row with no key kept, whose weights the reference zeroes."""
    inverse = exponentials.sum(dim=-1, keepdim=True).reciprocal_()
    if mask is not None:
        empty = ~mask[:, rows].any(dim=-1)[:, :, None, None, None]  # [B, rows, 1, 1, 1]: a row with no key kept
        if empty.any():
            inverse.masked_fill_(empty, 0.0)
    return inverse


# The [L, L] x [L, D] products below are computed transposed, [D, L] x [L, L] (values^T weights^T
# for weights x values): with D = 8 to 32 MKL runs them several times faster with the thin operand
# on the left; the same sums. Their operands and results stay in that [B, N, H, D, L] layout,
# made once per call (not per block), and go back to [B, N, L, H, D] once at the end.


def _row_block_forward(q, k, v, bias, mask, scale: float, block_elements: int):
    """The attention's fp32 output [B, N, L, H, D] (a view of [B, N, H, D, L]), a block of rows at
    a time, with its rows' softmax statistics for backward: the peak logits and the inverse
    sums of exponentials (_exponentials, _inverse_totals), each [B, N, H, L, 1]."""
    q_heads, k_t = _logit_operands(q, k, mask, scale)
    v_t = _heads_first(v, transposed=True)
    batch, rows_in_all, length, heads, _ = q.shape
    out_t = torch.empty(v_t.shape, dtype=torch.float32, device=q.device)  # [B, N, H, D, L]
    peaks, inverse_totals = (
        torch.empty(batch, rows_in_all, heads, length, 1, dtype=torch.float32, device=q.device) for _ in range(2)
    )
    for rows in _row_blocks(q, block_elements):
        exponentials, peaks[:, rows] = _exponentials(q_heads, k_t, bias, rows)
        inverse_totals[:, rows] = _inverse_totals(exponentials, mask, rows)
        # v^T w^T = (v^T e^T) scaled per query: the inverse sums on the thin result, not the weights
        out_t[:, rows] = torch.matmul(v_t[:, rows], exponentials.transpose(-1, -2)).mul_(
            inverse_totals[:, rows].transpose(-1, -2)
        )
    return out_t.permute(0, 1, 4, 2, 3), (peaks, inverse_totals)


def _heads_first_with_row(t: torch.Tensor, row: torch.Tensor | float) -> torch.Tensor:
    """[B, N, L, H, D] -> fp32 [B, N, H, D + 1, L] (_heads_first's transposed layout, one copy)
    with `row` ([B, N, H, L] or a number) as the last of the D + 1."""
    batch, rows, length, heads, depth = t.shape
    extended = torch.empty(batch, rows, heads, depth + 1, length, dtype=torch.float32, device=t.device)
    extended[..., :depth, :] = t.permute(0, 1, 3, 4, 2)
    extended[..., depth, :] = row
    return extended


class _RowBlockAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale, block_elements, known):
        """known: _row_block_forward's result from a checkpoint's first forward
        (kept_for_recompute), or None to compute it."""
        out, (peaks, inverse_totals) = (
            _row_block_forward(q, k, v, bias, mask, scale, block_elements) if known is None else known
        )
        ctx.save_for_backward(q, k, v, bias, mask, out, peaks, inverse_totals)
        ctx.scale, ctx.block_elements = scale, block_elements
        return out.to(q.dtype, memory_format=torch.contiguous_format)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, bias, mask, out, peaks, inverse_totals = ctx.saved_tensors
        scale = ctx.scale
        need_q, need_k, need_v, need_bias = ctx.needs_input_grad[:4]
        q_heads, k_t = _logit_operands(q, k, mask, scale)
        # A block's weights are its exponentials (formed as the forward formed them, from its
        # peaks) times each row's inverse total. The inverse totals go into dout^T instead, a
        # thin [D, L] operand: dv = (dout / total)^T e and, with the softmax's row sums dout . out
        # as one more row of dout^T (and a row of ones of v^T), dlogits = w * (dw - dout . out)
        # = e * ((dout / total) v^T - (dout . out) / total): no pass over the logits for either.
        row_sums = (grad_out.float() * out).sum(-1).permute(0, 1, 3, 2)  # [B, N, H, L]
        grad_out_rows = _heads_first_with_row(grad_out, -row_sums)
        grad_out_rows.mul_(inverse_totals.transpose(-1, -2))  # [B, N, H, D + 1, L] times [B, N, H, 1, L]
        v_rows = _heads_first_with_row(v, 1.0)
        head_dim = q.shape[-1]
        # gradients of q, k, v transposed, [B, N, H, D, L]
        transposed_shape = (*v_rows.shape[:-2], head_dim, v_rows.shape[-1])
        grad_q_t, grad_k_t, grad_v_t = (
            torch.empty(transposed_shape, dtype=torch.float32, device=q.device) if need else None
            for need in (need_q, need_k, need_v)
        )
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
        for rows in _row_blocks(q, ctx.block_elements):
            exponentials, _ = _exponentials(q_heads, k_t, bias, rows, peaks[:, rows])
            if need_v:
                grad_v_t[:, rows] = torch.matmul(grad_out_rows[:, rows, :, :head_dim], exponentials)
            # masked keys and rows with no key kept have weight 0, so no gradient
            grad_logits = torch.matmul(grad_out_rows[:, rows].transpose(-1, -2), v_rows[:, rows]).mul_(exponentials)
            if need_bias:
                if bias.shape[1] > 1:
                    grad_bias[:, rows] = grad_logits
                else:  # one bias shared by every row
                    grad_bias += grad_logits.sum(1, keepdim=True)
            if need_q:  # dq^T = k^T dlogits^T * scale
                grad_q_t[:, rows] = torch.matmul(k_t[:, rows, :, :head_dim], grad_logits.transpose(-1, -2))
            if need_k:  # dk^T = (q * scale)^T dlogits: q_heads holds q * scale * log2(e)
                grad_k_t[:, rows] = torch.matmul(q_heads[:, rows, :, :, :head_dim].transpose(-1, -2), grad_logits)
        if need_q:
            grad_q_t.mul_(scale)
        if need_k:
            grad_k_t.mul_(1.0 / LOG2_E)
        cast = [
            None if grad_t is None else grad_t.permute(0, 1, 4, 2, 3).to(t.dtype, memory_format=torch.contiguous_format)
            for grad_t, t in ((grad_q_t, q), (grad_k_t, k), (grad_v_t, v))
        ]
        cast.append(None if grad_bias is None else grad_bias.to(bias.dtype))
        return (*cast, None, None, None, None)
