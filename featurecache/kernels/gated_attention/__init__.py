"""Gated attention read from one packed projection: triangle attention's core over the pair
(`gated_pair_attention`) and the diffusion transformer's over its tokens (`gated_attention`,
the same saving below for [q | k | v | gate] with the pair bias passed apart).

TriangleAttention projects z once into [q | k | v | gate | bias] (one LayerNorm+Linear). This op
takes that packed tensor and returns sigmoid(gate) * attention(q, k, v, bias, mask), laid out
for the output projection. What it saves against composing `split`, evo_attention and the gate
in autograd (the reference, `gated_pair_attention_reference`):
- the backward writes dq, dk, dv, d_gate and d_bias straight into one packed gradient laid out
  like the projection (rows 16-element aligned), which the projection's backward reads in
  place; autograd would concatenate five gradients into a new buffer, one more pass over the
  largest tensor of triangle attention;
- the gate is one kernel each way (sigmoid, product and both gradients), not four to five
  elementwise kernels, and it reads the attention output through the ending node's transpose
  instead of copying it.
Layout, in the order a call goes through it (as for every op of featurecache.kernels):
  kernels.py   the @triton.jit gate kernels (forward, backward)
  launch.py    the packed tensor's views and the gate's launchers (the attention itself is
               evo_attention's)
  autograd.py  the autograd Function and `gated_pair_attention`, the entry point; `sigmoid_gate`,
               the gate alone (the conditioned attention's, over [B, S, L, c_a]), and `swiglu`,
               the same kernels with silu for sigmoid; `swiglu_packed`, swiglu on the two halves
               of one product's output (the conditioned transition's), one packed gradient back;
               `gated_attention`, the conditioned attention's core on its packed [q | k | v | gate]
               projection, its gradient written back packed as gated_pair_attention's
"""

from featurecache.kernels.gated_attention.autograd import (
    gated_attention,
    gated_pair_attention,
    sigmoid_gate,
    swiglu,
    swiglu_packed,
)
from featurecache.kernels.gated_attention.launch import gate_backward, gate_forward, packed_views

__all__ = [
    "gate_backward",
    "gate_forward",
    "gated_attention",
    "gated_pair_attention",
    "packed_views",
    "sigmoid_gate",
    "swiglu",
    "swiglu_packed",
]
