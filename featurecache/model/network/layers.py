"""Building blocks of the trunk that sit on top of the kernels.

Every module takes `kernels` ("triton" or "torch"). Both build the same parameters, so a
state_dict moves between them;
"triton" runs `featurecache.kernels` (EvoAttention and the fused small ops), "torch" runs the
pure-PyTorch references. The glue is fused where it pays: each attention
computes all of its projections (queries, keys, values, gate, and the bias where it comes from
the same input) with one LayerNorm and one matrix product, and the kernels read q/k/v as strided
views of that product instead of copies. The views come from one `split`, whose backward is a
single concatenation; slicing each view out separately would make autograd build a zero-filled
gradient of the whole product per slice and add them up (at L = 384, five 150 MB buffers per
triangle attention).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from featurecache.kernels.layernorm_linear import LayerNormLinear
from featurecache.kernels.reference import hash32, shared_dropout_reference
from featurecache.kernels.runtime import check_kernels
from featurecache.kernels.weight_casts import cast_packed, cast_weight, kept_per_sampler, step_casts_open


def _cast_to_autocast_dtype(module: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook: floating-point inputs in the autocast dtype while autocast is on.

    The Triton ops compute and return in their input's dtype (autocast does not reach inside a
    custom autograd Function), so without this they would run the fp32 residual stream in fp32
    while the PyTorch path's matrix products run in bf16. Both paths take the hook, so they see
    the same precision; residual adds keep the dtype of the stream they add to.
    """
    cast = []
    for value in args:
        if (
            isinstance(value, torch.Tensor)
            and value.is_floating_point()
            and torch.is_autocast_enabled(value.device.type)
        ):
            value = value.to(torch.get_autocast_dtype(value.device.type))
        cast.append(value)
    return tuple(cast)


def full_precision(enabled: bool, device_type: str):
    """A context with autocast off (fp32 in, fp32 out) when `enabled`, else nothing: for the few
    small layers whose bf16 rounding would cost resolution (AF3 runs them at precision "highest").
    Inputs must be fp32 already: autocast off casts nothing."""
    return torch.autocast(device_type, enabled=False) if enabled else contextlib.nullcontext()


def column_sums(rows: torch.Tensor) -> torch.Tensor:
    """[N, C] -> [C], the sum over rows in rows' dtype (fp32 accumulation either way). On a GPU
    a cuBLAS product with a ones row: PyTorch's column reduction of a Linear's output gradient
    ran at ~0.3 TB/s at the pair's [147456, 128] (132 us a call on an H100, NOTES.md section 19;
    benchmarks/pair_forwards.py times the product beside it, not yet run on a GPU)."""
    if rows.device.type != "cuda":
        return rows.sum(0)
    return (rows.new_ones(1, rows.shape[0]) @ rows).squeeze(0)


class _LinearFunction(torch.autograd.Function):
    """F.linear with its backward written out: the same products as autograd's, the bias
    gradient by column_sums. Inputs already in the dtype the products run in. The bias may
    cover only the first k of the outputs (leading_bias_linear)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.bias_width = bias.shape[0]
        return torch.nn.functional.linear(x, weight, _padded_bias(bias, weight.shape[0]))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_rows = grad.reshape(-1, grad.shape[-1])  # [N, C_out]
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = grad @ weight
        if ctx.needs_input_grad[1]:
            grad_weight = grad_rows.t() @ x.reshape(-1, x.shape[-1])
        if ctx.needs_input_grad[2]:
            grad_bias = column_sums(grad_rows[:, : ctx.bias_width])
        return grad_x, grad_weight, grad_bias


def _padded_bias(bias: torch.Tensor, width: int) -> torch.Tensor:
    """bias [k] as a bias of `width` outputs: zeros past its k."""
    return bias if bias.shape[0] == width else torch.nn.functional.pad(bias, (0, width - bias.shape[0]))


def leading_bias_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) with bias [k] added to its first k outputs by the product itself (on a
    GPU cuBLAS's epilogue), not by a pass over their strided columns afterwards: the conditioned
    attention's packed projection, where only q has a bias (Algorithm 24). x, weight and bias
    in the dtype the product runs in. Without gradient the padded bias is made once per sampler
    call (weight_casts.kept_per_sampler); with it, the bias's gradient sums only its k columns."""
    if bias.shape[0] > weight.shape[0]:
        raise ValueError(f"leading_bias_linear: a bias of {bias.shape[0]} for {weight.shape[0]} outputs")
    if torch.is_grad_enabled():
        return _LinearFunction.apply(x, weight, bias)
    width = weight.shape[0]
    padded = kept_per_sampler((bias,), ("padded", width), lambda: _padded_bias(bias, width))
    return torch.nn.functional.linear(x, weight, padded)


class Linear(nn.Linear):
    """nn.Linear (same parameters, initialisation and state_dict) whose bias gradient is a cuBLAS
    product (column_sums) when the output is differentiated. Every Linear of the model is one.
    Under autocast its parameters are cast by cast_weight: once a training step inside
    step_weight_casts (kernels/weight_casts.py), so a checkpointed block's first forward, its
    recomputation and the mini-rollout share the copies (autocast's own cache is off in a
    CUDA-graph step: nn.Linear would cast its weight at every call)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> [..., out_features]."""
        differentiated = self.bias is not None and torch.is_grad_enabled()
        if not differentiated and not step_casts_open():
            return super().forward(x)  # autocast casts, with its own cache where that is on
        device_type = x.device.type
        weight, bias = self.weight, self.bias
        if torch.is_autocast_enabled(device_type):
            # autocast's casts made here (differentiable), as it would make them for F.linear
            dtype = torch.get_autocast_dtype(device_type)
            if x.dtype != torch.float64:
                x = x.to(dtype)
            weight, bias = (
                cast_weight(t, dtype) if t is not None and t.dtype != torch.float64 else t for t in (weight, bias)
            )
            with torch.autocast(device_type, enabled=False):
                return self._linear(x, weight, bias)
        return self._linear(x, weight, bias)

    @staticmethod
    def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if bias is None or not torch.is_grad_enabled():
            return torch.nn.functional.linear(x, weight, bias)
        return _LinearFunction.apply(x, weight, bias)


def packed_product(x: torch.Tensor, linears: tuple[Linear, ...]) -> torch.Tensor:
    """torch.cat([linear(x) for linear in linears], -1) for bias-free Linears of one input, as one
    matrix product of their weights side by side (weight_casts.cast_packed: cast and packed once
    per sampler call). Under autocast in its dtype, as each Linear would run."""
    if any(linear.bias is not None for linear in linears):
        raise ValueError("packed_product: the linears must be bias-free")
    weights = tuple(linear.weight for linear in linears)
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type) and x.dtype != torch.float64:
        dtype = torch.get_autocast_dtype(device_type)
        with torch.autocast(device_type, enabled=False):
            return torch.nn.functional.linear(x.to(dtype), cast_packed(weights, dtype))
    return torch.nn.functional.linear(x, torch.cat(weights))


def kernel_module(module_class: type[nn.Module], *args, kernels: str, **kwargs) -> nn.Module:
    """One of featurecache.kernels' fused-op modules (LayerNormLinear, Transition,
    TriangleMultiplication), built for `kernels`, its inputs cast to autocast's dtype."""
    check_kernels(kernels)
    module = module_class(*args, kernels=kernels, **kwargs)
    module.register_forward_pre_hook(_cast_to_autocast_dtype)
    return module


def freeze_norm_bias(layer_norm_linear: nn.Module) -> None:
    """Freeze the LayerNorm bias of a LayerNormLinear whose every effect a later step cancels.

    Two places have one: a projection to attention logits (the bias adds the same constant to
    every logit of a head, which the softmax over keys ignores), and the diffusion decoder's
    projection to position updates (the bias moves every atom of a sample by the same vector,
    which the rigidly aligned MSE, the LDDT and the bond loss all ignore). Its gradient is zero
    in exact arithmetic (float noise in practice). Frozen, it stays zero, keeps its place in the
    state_dict, and is not mistaken for a trainable weight.
    """
    layer_norm_linear.norm.bias.requires_grad_(False)


def attention_fn(kernels: str):
    """evo_attention for "triton"; for "torch" its PyTorch form that takes a block of rows at a
    time on the CPU (kernels/reference.py, evo_attention_rows: no L^3 logits in memory), the
    reference elsewhere."""
    if check_kernels(kernels) == "torch":
        from featurecache.kernels.reference import evo_attention_rows

        return evo_attention_rows
    # the submodule, not the package attribute: importing the submodule rebinds that name to it
    from featurecache.kernels.evo_attention import evo_attention

    return evo_attention


def residual_fn(kernels: str):
    """featurecache.kernels.residual's fused residual add (sum in fp32 and in bf16) or its reference."""
    from featurecache.kernels import residual

    return residual.residual_add_reference if check_kernels(kernels) == "torch" else residual.residual_add


def gated_pair_attention_fn(kernels: str):
    """The packed triangle-attention core (featurecache.kernels.gated_attention), or for "torch" its
    reference over the row blocks (kernels/reference.py, gated_pair_attention_rows)."""
    if check_kernels(kernels) == "torch":
        from featurecache.kernels.reference import gated_pair_attention_rows

        return gated_pair_attention_rows
    from featurecache.kernels.gated_attention import gated_pair_attention

    return gated_pair_attention


def gate_fn(kernels: str, swish: bool = False):
    """The attention modules' output gate sigmoid(gate) * out (swish: the SwiGLU's product
    silu(gate) * out): one kernel each way (featurecache.kernels.gated_attention.sigmoid_gate,
    swiglu), or for "torch" the composition."""
    if check_kernels(kernels) == "torch":
        from featurecache.kernels.reference import sigmoid_gate_reference, swiglu_reference

        return swiglu_reference if swish else sigmoid_gate_reference
    from featurecache.kernels.gated_attention import sigmoid_gate, swiglu

    return swiglu if swish else sigmoid_gate


class TriangleAttention(nn.Module):
    """Triangle self-attention around the starting or the ending node (AF3 Algorithms 14, 15).

    The ending node is the starting node on the transposed pair; the transpose is taken on views
    of the projections, so neither z nor q/k/v is copied. Everything between the two
    projections (attention with bias and mask, the gate) is one op on the packed projection.
    """

    def __init__(
        self,
        c_z: int,
        num_heads: int,
        head_dim: int,
        node: str = "starting",
        eps: float = 1e-5,
        kernels: str = "triton",
    ) -> None:
        super().__init__()
        if node not in ("starting", "ending"):
            raise ValueError(f"TriangleAttention node is {node!r}, expected 'starting' or 'ending'")
        self.node = node
        self.num_heads = num_heads
        self.head_dim = head_dim
        inner = num_heads * head_dim
        # q, k, v, gate and the per-head pair bias from one LayerNorm + one matrix product.
        # Rows of the product 16-element aligned: q/k/v are read from it as strided views, and
        # 4 * inner + heads (516 at AF3's sizes) would leave their row stride unaligned, which
        # keeps Triton from vectorizing EvoAttention's loads.
        self.proj = kernel_module(
            LayerNormLinear, c_z, 4 * inner + num_heads, bias=False, eps=eps, kernels=kernels, aligned_rows=True
        )
        self.linear_out = Linear(inner, c_z)
        self.gated_attention = gated_pair_attention_fn(kernels)

    def forward(self, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        """z [B, L, L, C], pair_mask [B, L, L] bool -> update [B, L, L, C] (caller adds it)."""
        # Starting node: rows i, queries j, keys k, bias b_jk, mask on (i, k). Ending node:
        # o_ij = sum_k softmax_k(q_ij . k_kj + b_ki) v_kj, the starting node on z^T.
        out = self.gated_attention(
            self.proj(z), pair_mask, self.num_heads, self.head_dim, transpose=self.node == "ending"
        )
        return self.linear_out(out)


class AttentionPairBias(nn.Module):
    """Gated self-attention on the single representation with a bias from the pair (Algorithm 24)."""

    def __init__(
        self, c_s: int, c_z: int, num_heads: int, head_dim: int, eps: float = 1e-5, kernels: str = "triton"
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        inner = num_heads * head_dim
        self.proj = kernel_module(LayerNormLinear, c_s, 4 * inner, bias=True, eps=eps, kernels=kernels)
        self.pair_bias = kernel_module(LayerNormLinear, c_z, num_heads, bias=False, eps=eps, kernels=kernels)
        freeze_norm_bias(self.pair_bias)
        self.linear_out = Linear(inner, c_s, bias=False)
        self.attention = attention_fn(kernels)
        self.gate = gate_fn(kernels)

    def forward(self, s: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        """s [B, L, C_s], z [B, L, L, C_z], token_mask [B, L] bool -> update [B, L, C_s]."""
        heads, dim = self.num_heads, self.head_dim
        inner = heads * dim
        proj = self.proj(s).unsqueeze(1)  # [B, 1, L, 4 * H * D]: one "row" for evo_attention
        q, k, v, gate = proj.split(inner, dim=-1)
        q, k, v = (t.unflatten(-1, (heads, dim)) for t in (q, k, v))
        bias = self.pair_bias(z).permute(0, 3, 1, 2).unsqueeze(1).contiguous()  # [B, 1, H, L, L]
        out = self.attention(q, k, v, bias=bias, mask=token_mask.unsqueeze(1))
        return self.linear_out(self.gate(gate, out.flatten(-2)).squeeze(1))


class PairWeightedAveraging(nn.Module):
    """MSA pair-weighted averaging (Algorithm 10): rows mix values with weights from the pair only.

    The weights do not depend on the MSA row, so they are one softmax per head over [L, L] and the
    averaging is a batched matrix product, already the fastest form on either path.
    """

    def __init__(
        self, c_m: int, c_z: int, num_heads: int, head_dim: int, eps: float = 1e-5, kernels: str = "triton"
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        inner = num_heads * head_dim
        self.proj = kernel_module(LayerNormLinear, c_m, 2 * inner, bias=False, eps=eps, kernels=kernels)
        self.pair_bias = kernel_module(LayerNormLinear, c_z, num_heads, bias=False, eps=eps, kernels=kernels)
        freeze_norm_bias(self.pair_bias)
        self.linear_out = Linear(inner, c_m, bias=False)
        self.gate = gate_fn(kernels)

    def forward(self, m: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        """m [B, S, L, C_m], z [B, L, L, C_z], token_mask [B, L] -> update [B, S, L, C_m]."""
        inner = self.num_heads * self.head_dim
        proj = self.proj(m)
        value, gate = proj.split(inner, dim=-1)
        value = value.unflatten(-1, (self.num_heads, self.head_dim))
        logits = self.pair_bias(z).float().permute(0, 3, 1, 2)  # [B, H, L, L]
        logits = logits.masked_fill(~token_mask[:, None, None, :], float("-inf"))
        # Padded query rows see only -inf: give them uniform weights instead of NaN.
        logits = logits.masked_fill(~token_mask[:, None, :, None], 0.0)
        weights = torch.softmax(logits, dim=-1).to(value.dtype)
        out = torch.einsum("bhij,bsjhd->bsihd", weights, value).flatten(-2)
        return self.linear_out(self.gate(gate, out))


class OuterProductMean(nn.Module):
    """MSA -> pair update: mean over valid rows of outer products (Algorithm 9), then the output
    Linear. `bias_divided`: the Linear (its bias too) of the sum, then divided by the row count,
    OpenFold's order, which Protenix keeps: the bias shrinks with the MSA's depth."""

    def __init__(
        self,
        c_m: int,
        c_z: int,
        hidden_dim: int,
        eps: float = 1e-5,
        kernels: str = "triton",
        bias_divided: bool = False,
    ) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.bias_divided = bias_divided
        self.proj = kernel_module(LayerNormLinear, c_m, 2 * hidden_dim, bias=True, eps=eps, kernels=kernels)
        self.linear_out = Linear(hidden_dim * hidden_dim, c_z)

    def forward(self, m: torch.Tensor, msa_mask: torch.Tensor) -> torch.Tensor:
        """m [B, S, L, C_m], msa_mask [B, S, L] bool -> update [B, L, L, C_z]."""
        mask = msa_mask.unsqueeze(-1).to(m.dtype)
        proj = self.proj(m)
        a, b = (t * mask for t in proj.split(self.hidden_dim, dim=-1))
        outer = torch.einsum("bsic,bsjd->bijcd", a, b).flatten(-2)
        # rows where both positions are valid; 1e-3 keeps fully padded pairs finite
        count = torch.einsum("bsi,bsj->bij", mask.squeeze(-1).float(), mask.squeeze(-1).float())
        rows = (count.unsqueeze(-1) + 1e-3).to(outer.dtype)
        if self.bias_divided:
            return self.linear_out(outer) / rows
        # Linear(outer / rows) as the product of the sum, divided, plus the bias: the same
        # function with the division over the c_z outputs, not the hidden^2 inputs (8x fewer
        # elements at AF3's 32^2 -> 128: three passes over a [B, L, L, 1024] tensor less a block).
        out = torch.nn.functional.linear(outer, cast_weight(self.linear_out.weight, outer.dtype)) / rows
        return out + cast_weight(self.linear_out.bias, out.dtype)


# --- Dropout (AF3 Algorithms 8 and 17: DropoutRowwise, DropoutColumnwise) ----------------------
# Masks are pure functions of a per-call seed tensor (kernels/reference.py, shared_dropout_reference):
# checkpointed blocks recompute the same masks and CUDA graphs replay them from a seed drawn on the
# device. The Pairformer's pair updates draw theirs inside the residual add's kernel (DropoutSite).

SITES_PER_BLOCK = 8  # dropout sites a block may hold (a PairStack uses 4, the MSA block one more)
shared_dropout = shared_dropout_reference


def dropout_seed(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """A fresh int64 seed on `device` (0-d), drawn from `generator` (None: the device's default)."""
    return torch.randint(0, 2**31 - 1, (), generator=generator, device=device)


def derived_seeds(seed: torch.Tensor, count: int) -> torch.Tensor:
    """[count] independent seeds from one (one per block, or per template)."""
    return hash32(hash32(seed ^ 0x5BD1E995) + torch.arange(count, device=seed.device))
