"""The conditioned transformer of AF3's diffusion side (Algorithms 23-26), shared by the
24-block token transformer of the diffusion module and the atom transformers (Algorithm 7).

Symbols: a (the stream being updated, `a` [B, S, L, C_a], S diffusion samples), s (its
conditioning, [B, S or 1, L, C_s]), z / p (the pair representation the attention bias comes from),
beta (an extra additive bias, `extra_bias`).

Where the attention runs is a *layout*: `TokenLayout` is full attention over L (the keys masked
by `token_mask`); `featurecache.model.network.atom_attention.AtomWindows` is AF3's sequence-local atom
attention. A layout runs the attention (`attend`): it turns the per-head bias projected from
the pair into its kernel's bias and lays q/k/v out for it (EvoAttention for tokens, window_attention
for atoms), so one attention module serves both, on the kernel path ("triton") or the reference
path ("torch") with the same parameters.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from featurecache.kernels.conditioned_transition import (
    FUSED_MAX_CHANNELS,
    adaptive_layernorm,
    adaptive_layernorm_modulated,
    conditioned_transition,
    conditioned_transition_modulated,
)
from featurecache.kernels.gated_attention import gated_attention, swiglu_packed
from featurecache.kernels.layernorm_linear import LayerNormLinear
from featurecache.kernels.runtime import autocast_input, check_kernels
from featurecache.kernels.weight_casts import cast_weight, kept_per_sampler, step_casts_paused
from featurecache.model.network.checkpointing import checkpointed
from featurecache.model.network.layers import (
    Linear,
    attention_fn,
    freeze_norm_bias,
    kernel_module,
    gate_fn,
    leading_bias_linear,
    packed_product,
)

# AF3 initialises every output gate sigmoid(Linear(s)) with bias -2 (Algorithms 24, 25).
GATE_BIAS_INIT = -2.0


def _gate(c_s: int, c_a: int) -> Linear:
    """sigmoid(linear(s)) gate: zero weights and bias -2, so it starts at sigmoid(-2) = 0.12
    everywhere and learns from there (adaLN-Zero, with AF3's bias)."""
    linear = Linear(c_s, c_a)
    nn.init.zeros_(linear.weight)
    nn.init.constant_(linear.bias, GATE_BIAS_INIT)
    return linear


@dataclass
class BlockConditioning:
    """What one ConditionedTransformerBlock computes from s alone: its AdaLNs' scale logits and
    shifts, the attention's output gate and the transition's gate logits, each [*s.shape[:-1],
    c_a]. ConditionedTransformer.conditioning computes them for every block at once (a sampler's
    calls, without gradient)."""

    attention: tuple[torch.Tensor, torch.Tensor]  # the attention AdaLN's (scale logits, shift)
    key: tuple[torch.Tensor, torch.Tensor] | None  # the keys' AdaLN's, where the block has one
    attention_gate: torch.Tensor  # sigmoid(gate logits): the attention applies no kernel of its own to it
    transition: tuple[torch.Tensor, torch.Tensor]
    transition_gate_logits: torch.Tensor  # the fused transition takes their sigmoid itself
    transition_gate: torch.Tensor | None = None  # their sigmoid, for a transition that is not fused


# The batched s side of one group of blocks stays under this many bytes (its scale logits,
# shifts and gate logits live through the group's blocks): the mini-rollout's 24 token blocks are
# one group (3.5 MB a block at one sample of 384 tokens), inference at 1,024 tokens x 5 samples
# takes five blocks a group (47 MB a block).
CONDITIONING_GROUP_BYTES = 256 * 2**20


@dataclass
class StackedConditioningWeights:
    """Every block's AdaLN and output-gate weights stacked block by block for
    ConditionedTransformer.conditioning's batched products (A AdaLNs a block: the attention's,
    the transition's, the keys' if any; 2 gates a block), in the dtype the products run in. A
    slice of blocks is a view; stacking copies, so a sampler stacks once for all its steps
    (DiffusionModule.for_sampling)."""

    norm: torch.Tensor  # [N, A, c_s] fp32: the AdaLNs' LayerNorm weights
    scale: torch.Tensor  # [N, A, c_s, c_a]
    scale_bias: torch.Tensor  # [N, A, 1, c_a]
    shift: torch.Tensor  # [N, A, c_s, c_a]
    gate: torch.Tensor  # [N, 2, c_s, c_a]
    gate_bias: torch.Tensor  # [N, 2, 1, c_a]
    eps: float

    def blocks(self, start: int, stop: int) -> StackedConditioningWeights:
        """The weights of blocks start..stop-1 (views)."""
        parts = ("norm", "scale", "scale_bias", "shift", "gate", "gate_bias")
        return dataclasses.replace(self, **{name: getattr(self, name)[start:stop] for name in parts})


def _stacked(tensors: list[list[torch.Tensor]], dtype: torch.dtype) -> torch.Tensor:
    """[N][k] tensors -> [N, k, ...] in `dtype`, without gradient."""
    return torch.stack([torch.stack([tensor.detach() for tensor in row]) for row in tensors]).to(dtype)


def _stacked_conditioning(s: torch.Tensor, weights: StackedConditioningWeights):
    """The batched products: (scale logits, shifts) [N, A, *s.shape[:-1], c_a] of every AdaLN
    and gate logits [N, 2, *s.shape[:-1], c_a]. LN(s) is normalised once and scaled by each
    AdaLN's weight (its LayerNorm has no bias), as the LayerNorm with that weight computes it."""
    lead, width = s.shape[:-1], s.shape[-1]
    dtype = weights.scale.dtype
    blocks, adalns, _, channels = weights.scale.shape
    normalised = F.layer_norm(s.reshape(-1, width).float(), (width,), eps=weights.eps)  # [R, c_s]
    inputs = (normalised * weights.norm.flatten(0, 1)[:, None, :]).to(dtype)  # [N * A, R, c_s]
    scales = torch.baddbmm(weights.scale_bias.flatten(0, 1), inputs, weights.scale.flatten(0, 1))
    shifts = torch.bmm(inputs, weights.shift.flatten(0, 1))
    gates = weights.gate.flatten(0, 1)
    rows = s.reshape(1, -1, width).to(dtype).expand(gates.shape[0], -1, -1)  # [N * 2, R, c_s]: one s for all
    gate_logits = torch.baddbmm(weights.gate_bias.flatten(0, 1), rows, gates)
    return (
        scales.view(blocks, adalns, *lead, channels),
        shifts.view(blocks, adalns, *lead, channels),
        gate_logits.view(blocks, 2, *lead, channels),
    )


def _normalised(s: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm(s) without affine, in s's dtype (statistics in fp32, or fp64 for fp64 s, as the
    AdaLN kernels' reference): what every AdaLN of a transformer normalises (each then scales by
    its own LayerNorm weight; none has a bias)."""
    wide = s.double() if s.dtype == torch.float64 else s.float()
    return F.layer_norm(wide, s.shape[-1:], eps=eps).to(s.dtype)


def _folded_adaln_side(adaln: AdaptiveLayerNorm, normalised_s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One AdaLN's s side (scale logits, shift) from the transformer's shared normalised s:
    LN(s) = normalised_s * w, so Linear(LN(s)) = normalised_s @ (W * w)^T + b. The LayerNorm's
    weight goes into the products' weights ([c_a, c_s], cast per use: they are new tensors each
    call, not parameters; the bias is one, cast by cast_weight) instead of a pass over s per AdaLN."""
    weight = adaln.norm_s.weight
    dtype = normalised_s.dtype
    scale = F.linear(normalised_s, (adaln.scale.weight * weight).to(dtype), cast_weight(adaln.scale.bias, dtype))
    shift = F.linear(normalised_s, (adaln.shift.weight * weight).to(dtype))
    return scale, shift


def gated_residual(a: torch.Tensor, gate: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """a + gate * update: one kernel (addcmul) where the three share a dtype. With mixed dtypes
    (fp32 atom activations, a bf16 update under autocast) the product and the sum stay two
    operations, as autocast would cast each operand of addcmul to the widest dtype first."""
    if a.dtype == gate.dtype == update.dtype:
        return _GatedResidual.apply(a, gate, update)
    return a + gate * update


class _GatedResidual(torch.autograd.Function):
    """addcmul(a, gate, update) with mul's backward: autograd's own addcmul backward scales each
    factor by `value` (1 here) first, two more passes over [B, S, L, c_a] per call."""

    @staticmethod
    def forward(ctx, a, gate, update):
        ctx.save_for_backward(gate, update)
        ctx.a_shape = a.shape
        return torch.addcmul(a, gate, update)

    @staticmethod
    def backward(ctx, grad):
        gate, update = ctx.saved_tensors
        need_a, need_gate, need_update = ctx.needs_input_grad
        return (
            grad.sum_to_size(ctx.a_shape) if need_a else None,
            (grad * update).sum_to_size(gate.shape) if need_gate else None,
            (grad * gate).sum_to_size(update.shape) if need_update else None,
        )


def _modulate(a: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float, kernels: str) -> torch.Tensor:
    """AdaLN with its s side given: sigmoid(scale) * LayerNorm(a) + shift (Algorithm 26)."""
    if kernels == "triton":
        return adaptive_layernorm_modulated(a, scale, shift, eps)
    return torch.sigmoid(scale) * F.layer_norm(a, a.shape[-1:], eps=eps) + shift


class TokenLayout:
    """Full attention over the L positions of [B, S, L, ...]; the pair bias [B, L, L, H] is shared
    by the S samples (evo_attention reads one bias for every row)."""

    def __init__(self, token_mask: torch.Tensor, extra_bias: torch.Tensor | None = None) -> None:
        self.token_mask = token_mask  # [B, L] bool
        self.extra_bias = extra_bias  # [B, L, L] or None: beta of Algorithm 23
        self._row_masks: dict[int, torch.Tensor] = {}  # S -> [B, S, L]: one copy for every block

    def attention_bias(self, pair_bias: torch.Tensor, kernels: str) -> torch.Tensor:
        """[B, L, L, H] -> the attention's bias [B, 1, H, L, L] (either kernel path)."""
        bias = pair_bias.permute(0, 3, 1, 2)
        if self.extra_bias is not None:
            bias = bias + self.extra_bias.unsqueeze(1).to(bias.dtype)
        return bias.unsqueeze(1).contiguous()

    def pack(self, q, k, v):
        """q, k, v [B, S, L, H, D] as they are, and the key mask [B, S, L]."""
        return q, k, v, self._row_mask(q.shape[1])

    def _row_mask(self, samples: int) -> torch.Tensor:
        """The key mask [B, S, L], made once per S (a sampler's call runs 24 blocks on one layout)."""
        if samples not in self._row_masks:
            self._row_masks[samples] = self.token_mask[:, None, :].expand(-1, samples, -1).contiguous()
        return self._row_masks[samples]

    def unpack(self, out: torch.Tensor) -> torch.Tensor:
        return out

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, kernels: str
    ) -> torch.Tensor:
        """q, k, v [B, S, L, H, D], bias from attention_bias -> [B, S, L, H, D]."""
        q_rows, k_rows, v_rows, mask = self.pack(q, k, v)
        return self.unpack(attention_fn(kernels)(q_rows, k_rows, v_rows, bias=bias, mask=mask))

    def gated_attend(self, packed: torch.Tensor, bias: torch.Tensor, heads: int) -> torch.Tensor:
        """The Triton path's attention and output gate as one op on the packed projection
        [B, S, L, 4C] = [q | k | v | gate]: sigmoid(gate) * attend(q, k, v, bias), [B, S, L, C],
        its gradient written back packed (kernels.gated_attention.gated_attention)."""
        return gated_attention(packed, bias, self._row_mask(packed.shape[1]), heads)


class AdaptiveLayerNorm(nn.Module):
    """Algorithm 26, AdaLN: LayerNorm of a without affine, scaled by sigmoid(Linear(LN(s))) and
    shifted by LinearNoBias(LN(s)). kernels="triton": normalize and modulate in one pass
    (featurecache.kernels.conditioned_transition.adaptive_layernorm), same parameters."""

    def __init__(self, c_a: int, c_s: int, kernels: str = "torch") -> None:
        super().__init__()
        self.kernels = check_kernels(kernels)
        self.norm_a = nn.LayerNorm(c_a, elementwise_affine=False)
        self.norm_s = nn.LayerNorm(c_s, bias=False)
        self.scale = Linear(c_s, c_a)
        self.shift = Linear(c_s, c_a, bias=False)

    def forward(self, a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """a: [..., S, L, c_a]; s: [..., S or 1, L, c_s] (1: shared by the S samples). Returns
        [..., S, L, c_a]."""
        if self.kernels == "triton":
            return adaptive_layernorm(
                a, s, self.norm_s.weight, self.scale.weight, self.scale.bias, self.shift.weight, self.norm_s.eps
            )
        s = self.norm_s(s)
        return torch.sigmoid(self.scale(s)) * self.norm_a(a) + self.shift(s)


class ConditionedTransition(nn.Module):
    """Algorithm 25, ConditionedTransitionBlock: a SwiGLU transition on AdaLN(a, s), gated by s.
    kernels="triton" runs it as one fused op (featurecache.kernels.conditioned_transition) on
    the same parameters; "torch" runs the modules below, the reference."""

    def __init__(self, c_a: int, c_s: int, expansion: int = 2, kernels: str = "torch") -> None:
        super().__init__()
        self.kernels = check_kernels(kernels)
        self.adaln = AdaptiveLayerNorm(c_a, c_s, kernels=kernels)
        self.linear_a = Linear(c_a, expansion * c_a, bias=False)
        self.linear_b = Linear(c_a, expansion * c_a, bias=False)
        self.linear_out = Linear(expansion * c_a, c_a, bias=False)
        self.swiglu = gate_fn(kernels, swish=True)
        self.output_gate = _gate(c_s, c_a)

    def forward(self, a: torch.Tensor, s: torch.Tensor, conditioning: BlockConditioning | None = None) -> torch.Tensor:
        """a: [..., S, L, c_a]; s: [..., S or 1, L, c_s] (1: shared by the S samples). Returns the
        update [..., S, L, c_a]. `conditioning`: the block's s side, if already computed."""
        gate, update = self.gate_and_update(a, s, conditioning)
        return update if gate is None else gate * update

    def residual(self, a: torch.Tensor, s: torch.Tensor, conditioning: BlockConditioning | None = None) -> torch.Tensor:
        """a + forward(a, s, conditioning), the gate's product and the sum in one kernel where
        the update is not already gated (gated_residual)."""
        gate, update = self.gate_and_update(a, s, conditioning)
        return a + update if gate is None else gated_residual(a, gate, update)

    def gate_and_update(self, a: torch.Tensor, s: torch.Tensor, conditioning: BlockConditioning | None = None):
        """(gate, ungated update), or (None, the gated update) where one fused op computes both."""
        if conditioning is not None:
            return self._conditioned(
                a, *conditioning.transition, conditioning.transition_gate_logits, conditioning.transition_gate
            )
        # Past FUSED_MAX_CHANNELS (the token width, 768) the kernel module's AdaLN + cuBLAS split
        # measured slower than these modules, launched and replayed (H200, 2026-12-04 03:21 UTC,
        # benchmarks/RESULTS.md): the fused op is used only where it fuses the whole block.
        if self.fused:
            adaln = self.adaln
            return None, conditioned_transition(
                a,
                s,
                adaln.norm_s.weight,
                adaln.scale.weight,
                adaln.scale.bias,
                adaln.shift.weight,
                self.linear_a.weight,
                self.linear_b.weight,
                self.linear_out.weight,
                self.output_gate.weight,
                self.output_gate.bias,
                adaln.norm_s.eps,
            )
        return torch.sigmoid(self.output_gate(s)), self._swiglu(self.adaln(a, s))

    @property
    def fused(self) -> bool:
        """Whether the block runs as one fused op (which takes the gate's logits)."""
        return self.kernels == "triton" and self.linear_a.in_features <= FUSED_MAX_CHANNELS

    def _conditioned(self, a, scale, shift, gate_logits: torch.Tensor, gate: torch.Tensor | None = None):
        """gate_and_update on the s side given (scale and gate logits, shift; the gate itself
        where already computed): the fused op where it fuses the whole block, else the one-pass
        AdaLN (Triton) and the modules' products."""
        eps = self.adaln.norm_s.eps
        if self.fused:
            weights = (self.linear_a.weight, self.linear_b.weight, self.linear_out.weight)
            return None, conditioned_transition_modulated(a, scale, shift, gate_logits, *weights, eps)
        gate = torch.sigmoid(gate_logits) if gate is None else gate
        return gate, self._swiglu(_modulate(a, scale, shift, eps, self.kernels))

    def _swiglu(self, x: torch.Tensor) -> torch.Tensor:
        """LinearNoBias(swish(LinearNoBias(x)) * LinearNoBias(x)) on AdaLN's x, before the gate.
        On the Triton path linear_a and linear_b are one product whose two halves the SwiGLU
        kernel reads in place (one launch fewer a call, and backward one product for x's
        gradient instead of two and their sum)."""
        if self.kernels == "triton":
            return self.linear_out(swiglu_packed(packed_product(x, (self.linear_a, self.linear_b))))
        return self.linear_out(self.swiglu(self.linear_a(x), self.linear_b(x)))


class ConditionedAttention(nn.Module):
    """Algorithm 24, AttentionPairBias with conditioning: AdaLN(a, s), gated multi-head attention
    with a per-head bias LinearNoBias(LayerNorm(pair)) (+ beta), and AF3's output gate on s.

    `key_adaln`: keys and values from their own AdaLN(a, s) (`key_adaln`, other weights), queries
    and gate from `adaln`, as AF3's code runs the atom transformer's cross attention; without it
    one AdaLN feeds all four (Algorithm 24 as printed). `key_adaln_nested`: the keys' AdaLN reads
    the queries' AdaLN output, AdaLN_k(AdaLN_q(a, s), s), as Protenix's cross_attention_mode does."""

    def __init__(
        self,
        c_a: int,
        c_s: int,
        c_pair: int,
        num_heads: int,
        kernels: str,
        key_adaln: bool = False,
        key_adaln_nested: bool = False,
    ) -> None:
        super().__init__()
        if c_a % num_heads:
            raise ValueError(f"ConditionedAttention: width {c_a} is not a multiple of {num_heads} heads")
        if key_adaln_nested and not key_adaln:
            raise ValueError("ConditionedAttention: key_adaln_nested needs key_adaln")
        self.key_adaln_nested = key_adaln_nested
        self.num_heads = num_heads
        self.head_dim = c_a // num_heads
        self.adaln = AdaptiveLayerNorm(c_a, c_s, kernels=kernels)
        self.key_adaln = AdaptiveLayerNorm(c_a, c_s, kernels=kernels) if key_adaln else None
        # q, k, v and the gate from one matrix product; only q has a bias (Algorithm 24)
        self.proj = Linear(c_a, 4 * c_a, bias=False)
        self.query_bias = nn.Parameter(torch.zeros(c_a))
        self.pair_bias = kernel_module(LayerNormLinear, c_pair, num_heads, bias=False, kernels=kernels)
        freeze_norm_bias(self.pair_bias)
        self.linear_out = Linear(c_a, c_a, bias=False)
        self.output_gate = _gate(c_s, c_a)
        self.kernels = check_kernels(kernels)
        self.gate = gate_fn(kernels)

    def attention_bias(self, pair: torch.Tensor, layout) -> torch.Tensor:
        """The per-head bias LinearNoBias(LayerNorm(pair)) laid out for the layout's attention: a
        function of the pair alone, so a sampler's steps can share it (`biases` of
        ConditionedTransformer.forward)."""
        return layout.attention_bias(self.pair_bias(pair), self.kernels)

    def forward(
        self,
        a: torch.Tensor,
        s: torch.Tensor,
        pair: torch.Tensor,
        layout,
        bias: torch.Tensor | None = None,
        conditioning: BlockConditioning | None = None,
    ) -> torch.Tensor:
        """a: [B, S, L, c_a]; s: [B, S or 1, L, c_s]; pair: as the layout reads it (TokenLayout:
        [B, L, L, c_pair]; AtomWindows: per window); bias: attention_bias(pair, layout) if already
        computed; conditioning: the block's s side, if already computed. Returns the update of a
        [B, S, L, c_a]."""
        gate, update = self.gate_and_update(a, s, pair, layout, bias, conditioning)
        return gate * update

    def residual(self, a, s, pair, layout, bias=None, conditioning: BlockConditioning | None = None) -> torch.Tensor:
        """a + forward(...), the output gate's product and the sum in one kernel (gated_residual)."""
        return gated_residual(a, *self.gate_and_update(a, s, pair, layout, bias, conditioning))

    def gate_and_update(self, a, s, pair, layout, bias=None, conditioning: BlockConditioning | None = None):
        """forward's output gate sigmoid(Linear(s)) [B, S or 1, L, c_a] and the ungated update."""
        width = a.shape[-1]
        queries = self._adaln(self.adaln, a, s, None if conditioning is None else conditioning.attention)
        if bias is None:
            bias = self.attention_bias(pair, layout)
        # the weights' casts are shared a step or a sampler call (weight_casts); the query bias in
        # the product's dtype, added by the product itself to q's columns (leading_bias_linear)
        dtype = _product_dtype(queries)
        weight, query_bias = (cast_weight(t, dtype) for t in (self.proj.weight, self.query_bias))
        if self.key_adaln is None:
            packed = leading_bias_linear(queries.to(dtype), weight, query_bias)  # [q | k | v | gate]
            if self.kernels == "triton" and isinstance(layout, TokenLayout):
                gated = layout.gated_attend(packed, bias, self.num_heads)
                return self._output_gate(s, conditioning), self.linear_out(gated)
            q, k, v, gate = packed.split(width, dim=-1)
        else:  # the same weights, q and gate from one normalisation, k and v from the other
            blocks = weight.unflatten(0, (4, width))  # q, k, v, gate
            w_qg, w_kv = (
                kept_per_sampler((weight,), ("blocks", pair), lambda pair=pair: torch.cat([blocks[i] for i in pair]))
                for pair in ((0, 3), (1, 2))
            )
            q, gate = leading_bias_linear(queries.to(dtype), w_qg, query_bias).split(width, dim=-1)
            key_input = queries if self.key_adaln_nested else a
            keys = self._adaln(self.key_adaln, key_input, s, None if conditioning is None else conditioning.key)
            k, v = F.linear(keys.to(dtype), w_kv).split(width, dim=-1)
        q, k, v = (t.unflatten(-1, (self.num_heads, self.head_dim)) for t in (q, k, v))
        out = layout.attend(q, k, v, bias, self.kernels).flatten(-2)  # [B, S, L, c_a]
        return self._output_gate(s, conditioning), self.linear_out(self.gate(gate, out))

    def _output_gate(self, s: torch.Tensor, conditioning: BlockConditioning | None) -> torch.Tensor:
        """sigmoid(Linear(s)), or the conditioning's where it is given."""
        return torch.sigmoid(self.output_gate(s)) if conditioning is None else conditioning.attention_gate

    def _adaln(self, adaln: AdaptiveLayerNorm, a: torch.Tensor, s: torch.Tensor, given) -> torch.Tensor:
        """adaln(a, s), or on its s side `given` (scale logits, shift) when not None."""
        if given is None:
            return adaln(a, s)
        return _modulate(a, *given, adaln.norm_s.eps, self.kernels)


class ConditionedTransformerBlock(nn.Module):
    def __init__(
        self,
        c_a: int,
        c_s: int,
        c_pair: int,
        num_heads: int,
        kernels: str,
        key_adaln: bool = False,
        key_adaln_nested: bool = False,
        transient_weight_casts: bool = False,
    ) -> None:
        super().__init__()
        self.attention = ConditionedAttention(c_a, c_s, c_pair, num_heads, kernels, key_adaln, key_adaln_nested)
        self.transition = ConditionedTransition(c_a, c_s, kernels=kernels)
        self.transient_weight_casts = transient_weight_casts

    def forward(
        self,
        a: torch.Tensor,
        s: torch.Tensor,
        pair: torch.Tensor,
        layout,
        bias: torch.Tensor | None = None,
        conditioning: BlockConditioning | None = None,
        normalised_s: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """a: [B, S, L, c_a]; s: [B, S or 1, L, c_s]; pair: as the layout reads it (TokenLayout:
        [B, L, L, c_pair]; AtomWindows: per window); bias: the attention's, and conditioning: the
        block's s side, if already computed; else normalised_s, LayerNorm(s) without affine
        shared by the transformer's blocks (kernels "triton"), from which the block forms it.
        Returns the new a [B, S, L, c_a]."""
        # Here, not around the transformer: a checkpoint's recomputation calls the block itself.
        with step_casts_paused(self.transient_weight_casts):
            if conditioning is None and normalised_s is not None:
                conditioning = self.conditioning(s, normalised_s)
            # Residual after each half, as Protenix and Boltz run Algorithm 23 (its line 3 as
            # printed would drop a's residual path).
            a = self.attention.residual(a, s, pair, layout, bias, conditioning)
            return self.transition.residual(a, s, conditioning)

    def conditioning(self, s: torch.Tensor, normalised_s: torch.Tensor) -> BlockConditioning:
        """The block's s side with gradient: its AdaLNs' from the shared normalised s
        (_folded_adaln_side), its gates' from s itself (Algorithm 24's and 25's Linear(s))."""
        attention, transition = self.attention, self.transition
        gate_logits = transition.output_gate(s)
        return BlockConditioning(
            attention=_folded_adaln_side(attention.adaln, normalised_s),
            key=None if attention.key_adaln is None else _folded_adaln_side(attention.key_adaln, normalised_s),
            attention_gate=torch.sigmoid(attention.output_gate(s)),
            transition=_folded_adaln_side(transition.adaln, normalised_s),
            transition_gate_logits=gate_logits,
            transition_gate=None if transition.fused else torch.sigmoid(gate_logits),
        )


class ConditionedTransformer(nn.Module):
    """Algorithm 23, DiffusionTransformer: N blocks of conditioned attention and transition.

    While training with `checkpoint_blocks`, each block keeps only its input a for backward (s and
    the pair are shared by every block); `checkpoint_group` K > 1 keeps one a per K blocks and
    backward re-runs each group, a checkpoint per block inside, as the Pairformer's
    (featurecache.model.network.pairformer.run_blocks): N / K + K inputs held instead of N. `key_adaln`,
    `key_adaln_nested`: ConditionedAttention's. `transient_weight_casts`: the blocks' weights are
    cast per use, not once a training step (weight_casts.step_casts_paused), for a transformer
    whose weights are too large to hold as copies through the step (the token transformer's)."""

    def __init__(
        self,
        c_a: int,
        c_s: int,
        c_pair: int,
        num_blocks: int,
        num_heads: int,
        kernels: str,
        checkpoint_blocks: bool = True,
        checkpoint_group: int = 1,
        key_adaln: bool = False,
        key_adaln_nested: bool = False,
        transient_weight_casts: bool = False,
    ) -> None:
        super().__init__()
        self.checkpoint_blocks = checkpoint_blocks
        self.checkpoint_group = checkpoint_group
        self.blocks = nn.ModuleList(
            ConditionedTransformerBlock(
                c_a, c_s, c_pair, num_heads, kernels, key_adaln, key_adaln_nested, transient_weight_casts
            )
            for _ in range(num_blocks)
        )

    def attention_biases(self, pair: torch.Tensor, layout) -> list[torch.Tensor]:
        """Each block's attention bias from the pair (ConditionedAttention.attention_bias)."""
        with step_casts_paused(self.blocks[0].transient_weight_casts):
            return [block.attention.attention_bias(pair, layout) for block in self.blocks]

    def conditioning_weights(self, dtype: torch.dtype | None = None) -> StackedConditioningWeights:
        """The blocks' AdaLN and gate weights stacked for conditioning(), in `dtype` (the
        products'; default: autocast's where it is on for the weights' device, else theirs)."""
        if dtype is None:
            dtype = _product_dtype(self.blocks[0].transition.output_gate.weight)
        adalns = [
            [block.attention.adaln, block.transition.adaln]
            + ([block.attention.key_adaln] if block.attention.key_adaln is not None else [])
            for block in self.blocks
        ]
        gates = [[block.attention.output_gate, block.transition.output_gate] for block in self.blocks]
        return StackedConditioningWeights(
            norm=_stacked([[adaln.norm_s.weight for adaln in row] for row in adalns], torch.float32),
            scale=_stacked([[adaln.scale.weight for adaln in row] for row in adalns], dtype).transpose(2, 3),
            scale_bias=_stacked([[adaln.scale.bias for adaln in row] for row in adalns], dtype).unsqueeze(2),
            shift=_stacked([[adaln.shift.weight for adaln in row] for row in adalns], dtype).transpose(2, 3),
            gate=_stacked([[gate.weight for gate in row] for row in gates], dtype).transpose(2, 3),
            gate_bias=_stacked([[gate.bias for gate in row] for row in gates], dtype).unsqueeze(2),
            eps=adalns[0][0].norm_s.eps,
        )

    def conditioning(
        self, s: torch.Tensor, weights: StackedConditioningWeights | None = None
    ) -> list[BlockConditioning]:
        """The s side of every block `weights` holds (its AdaLNs' and gates' products) from
        three batched products, for calls without gradient. A sampler's call at one sample is
        launch-bound (the mini-rollout: 24 token blocks x 20 steps), and per block the s side is
        ~16 small products and pointwise ops. s: [B, S or 1, L, c_s]; weights:
        conditioning_weights(the products' dtype) or some of its blocks, if already stacked
        (default: all blocks')."""
        s = self._conditioning_input(s)
        weights = self.conditioning_weights(_product_dtype(s)) if weights is None else weights
        scales, shifts, gate_logits = _stacked_conditioning(s, weights)
        # every block's gates through their sigmoid in one kernel; a fused transition takes logits
        fused_transition = self.blocks[0].transition.fused
        gates = torch.sigmoid(gate_logits[:, :1] if fused_transition else gate_logits)
        keyed = scales.shape[1] == 3
        return [
            BlockConditioning(
                attention=(scales[index, 0], shifts[index, 0]),
                key=(scales[index, 2], shifts[index, 2]) if keyed else None,
                attention_gate=gates[index, 0],
                transition=(scales[index, 1], shifts[index, 1]),
                transition_gate_logits=gate_logits[index, 1],
                transition_gate=None if fused_transition else gates[index, 1],
            )
            for index in range(scales.shape[0])
        ]

    def _conditioning_input(self, s: torch.Tensor) -> torch.Tensor:
        """s as the blocks' s side reads it: the kernels compute it from s in autocast's dtype."""
        return autocast_input(s) if self.blocks[0].attention.kernels == "triton" else s

    def _run_conditioned_groups(self, a, s, pair, layout, biases, weights: StackedConditioningWeights | None):
        """A sampler's call: the blocks in groups whose batched s side fits CONDITIONING_GROUP_BYTES."""
        blocks = list(self.blocks)
        weights = self.conditioning_weights(_product_dtype(s)) if weights is None else weights
        tensors_per_block = 2 * weights.scale.shape[1] + 2  # each AdaLN's scale and shift, two gates
        per_block = tensors_per_block * s[..., :1].numel() * a.shape[-1] * weights.scale.element_size()
        group = max(1, CONDITIONING_GROUP_BYTES // max(1, per_block))
        for start in range(0, len(blocks), group):
            stop = min(start + group, len(blocks))
            conditioning = self.conditioning(s, weights.blocks(start, stop))
            a = _run_plain(blocks[start:stop], a, s, pair, layout, biases[start:stop], conditioning)
        return a

    def forward(
        self,
        a: torch.Tensor,
        s: torch.Tensor,
        pair: torch.Tensor,
        layout,
        biases: list[torch.Tensor] | None = None,
        conditioning: list[BlockConditioning] | StackedConditioningWeights | None = None,
    ) -> torch.Tensor:
        """a: [B, S, L, c_a] (S diffusion samples, L tokens or atoms); s: [B, S or 1, L, c_s];
        pair: as the layout reads it (TokenLayout: [B, L, L, c_pair]; AtomWindows: per window).
        `biases`: attention_biases(pair, layout), computed once for many calls on one pair (a
        sampler's steps; without gradient: a checkpointed block recomputes its bias from the pair).
        With them the blocks' s side is `conditioning` where given as conditioning(s) (s the same
        for many calls), else computed here for all blocks at once (from `conditioning`'s stacked
        weights where given). Returns the new a [B, S, L, c_a]."""
        blocks = list(self.blocks)
        checkpoint = self.checkpoint_blocks and self.training and torch.is_grad_enabled()
        if biases is not None:
            if checkpoint:
                raise ValueError("ConditionedTransformer: precomputed biases are for calls without gradient")
            if isinstance(conditioning, list):
                return _run_plain(blocks, a, s, pair, layout, biases, conditioning)
            return self._run_conditioned_groups(a, s, pair, layout, biases, conditioning)
        # The Triton path normalises s once for every AdaLN of every block (and backward runs one
        # LayerNorm backward), not once per AdaLN in each forward, recomputation and backward.
        normalised_s = self._shared_normalised_s(s)
        if not checkpoint:
            return _run_plain(blocks, a, s, pair, layout, normalised_s=normalised_s)
        group = self.checkpoint_group
        if group > 1 and len(blocks) > 1:
            for start in range(0, len(blocks), group):
                chunk = blocks[start : start + group]
                # s and the pair are the group's inputs, not captured: backward must return their
                # gradients through the checkpoint (captured tensors would be differentiated twice)
                a = (
                    _run_checkpointed(chunk, a, s, pair, layout, normalised_s)
                    if len(chunk) == 1
                    else checkpointed(functools.partial(_run_group, chunk, layout), a, s, pair, normalised_s)
                )
            return a
        return _run_checkpointed(blocks, a, s, pair, layout, normalised_s)

    def _shared_normalised_s(self, s: torch.Tensor) -> torch.Tensor | None:
        """LayerNorm(s) without affine for the blocks' AdaLNs (kernels "triton"; as the AdaLN
        kernels read it: s in autocast's dtype), or None for the PyTorch modules (the reference)."""
        if self.blocks[0].attention.kernels != "triton":
            return None
        return _normalised(self._conditioning_input(s), self.blocks[0].attention.adaln.norm_s.eps)


def _product_dtype(s: torch.Tensor) -> torch.dtype:
    """The dtype matrix products on s run in: autocast's where it is on, else s's."""
    device_type = s.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else s.dtype


def _run_group(blocks: list, layout, a, s, pair, normalised_s: torch.Tensor | None) -> torch.Tensor:
    """One group: plain in the first forward (no grad), a checkpoint per block when backward
    re-runs it."""
    if torch.is_grad_enabled():
        return _run_checkpointed(blocks, a, s, pair, layout, normalised_s)
    return _run_plain(blocks, a, s, pair, layout, normalised_s=normalised_s)


def _run_checkpointed(blocks: list, a, s, pair, layout, normalised_s: torch.Tensor | None) -> torch.Tensor:
    for block in blocks:
        # reentrant, no RNG state (model.network.checkpointing); normalised_s an input like s
        a = checkpointed(block, a, s, pair, layout, None, None, normalised_s)
    return a


def _run_plain(
    blocks: list,
    a: torch.Tensor,
    s: torch.Tensor,
    pair: torch.Tensor,
    layout,
    biases: list | None = None,
    conditioning: list | None = None,
    normalised_s: torch.Tensor | None = None,
) -> torch.Tensor:
    for index, block in enumerate(blocks):
        bias = None if biases is None else biases[index]
        a = block(a, s, pair, layout, bias, None if conditioning is None else conditioning[index], normalised_s)
    return a
