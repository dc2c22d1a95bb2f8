"""AF3's conditioned transition (Algorithm 25) with its adaptive LayerNorm (Algorithm 26), fused:

    x = sigmoid(scale) * LayerNorm(a) + shift          scale, shift = Linear(LN(s)), LinearNoBias(LN(s))
    y = sigmoid(gate) * W_out (swish(W_a x) * W_b x)    gate = Linear(s), bias -2 at init

Where the bytes are: a and y are [rows, C_a] (rows = 48 samples x tokens), and so are the three
s-derived tensors scale, shift and gate when s is per sample (the token transformer: s carries
the noise level); in the atom transformers s is [B, 1, A, C] and they are shared by the samples.
The s side (LN(s) and three [C_s -> C_a] products, one per s row, not per sample) stays with
PyTorch: it is a plain matmul on the smaller tensor. One kernel does the rest of the forward: it
reads a row tile of a, normalizes and modulates it in registers (reading scale and shift at the
tile's s rows), walks the 2*C_a hidden in chunks as transition/ does (the SwiGLU is formed in
registers, the [rows, n*C_a] hidden never touches memory), and gates the accumulated output with
sigmoid(gate) before the one store. It also stores the ungated output (one [rows, C_a] tensor)
and two floats a row, what the backward needs besides a.

The backward's kernel recomputes x and the hidden chunks and forms da and the gradients of
scale, shift and gate (per a row in a's dtype; summed in fp32 over the samples where s is shared),
and writes the operands of the weight gradients ([d_a | d_b], the hidden, x, d_out) for cuBLAS,
the "matmul" strategy of transition/ (benchmarks/NOTES-fused_ops.md: recomputing them in a
second Triton kernel was twice as slow on the H200).

Rows wider than FUSED_MAX_CHANNELS (c_token 768) do not fit registers whole: there a one-pass
AdaLN kernel (also the conditioned attention's AdaLN, `adaptive_layernorm`) writes x, and the
three products and the SwiGLU and gate stay with PyTorch/cuBLAS.

Layout, in the order a call goes through it (as for every op of featurecache.kernels):
  kernels.py   the @triton.jit kernels: the fused forward and backward, the one-pass AdaLN
  config.py    FUSED_MAX_CHANNELS and the tile sizes from register and shared-memory budgets
  launch.py    the launchers (conditioned_transition_fwd / _bwd, adaln_fwd / _bwd)
  autograd.py  the custom ops, the autograd Functions and the entry points
               `conditioned_transition` and `adaptive_layernorm`
The nn.Module is the model's (featurecache.model.network.transformer.ConditionedTransition).
"""

from featurecache.kernels.conditioned_transition.autograd import (
    adaptive_layernorm,
    adaptive_layernorm_modulated,
    conditioned_transition,
    conditioned_transition_modulated,
)
from featurecache.kernels.conditioned_transition.config import FUSED_MAX_CHANNELS
from featurecache.kernels.conditioned_transition.launch import (
    adaln_bwd,
    adaln_fwd,
    conditioned_transition_bwd,
    conditioned_transition_fwd,
)

__all__ = [
    "FUSED_MAX_CHANNELS",
    "adaln_bwd",
    "adaln_fwd",
    "adaptive_layernorm",
    "adaptive_layernorm_modulated",
    "conditioned_transition",
    "conditioned_transition_modulated",
    "conditioned_transition_bwd",
    "conditioned_transition_fwd",
]
