"""AF3 triangle multiplicative update (Algorithms 12 outgoing, 13 incoming), without the residual.

Three steps, each a single pass over the pair rows:
1. projection kernel: LayerNorm(z), the four gated projections and the mask, writing a and b
   channel-first, [B, H, L, L], the layout a batched matmul over channels wants;
2. the triangular product x = a @ b^T (outgoing) or a^T @ b (incoming) per channel, by cuBLAS
   through torch.matmul, which handles both transposes without copies;
3. output kernel: LayerNorm(x), linear_z, and the gate sigmoid(linear_g(LayerNorm(z))), with
   LayerNorm(z) recomputed from z rather than kept.

Saved for backward: z, the mask, x and four fp32 statistics per row. a and b are recomputed by
the projection kernel (a pass over z) instead of kept: at L=512, H=128 in bf16 that is 128 MiB
less resident between forward and backward. The backward runs an output-gradient kernel (dx),
the two matmuls for da and db, a projection-gradient kernel (dz and the LayerNorm(z) gradients)
and two weight-gradient kernels that accumulate over row splits in registers.

Layout, in the order a call goes through it (as for every op of featurecache.kernels):
  kernels.py   the @triton.jit kernels
  launch.py    the launchers (triangle_mult_fwd / _bwd)
  autograd.py  the autograd Function and `triangle_mult`, the entry point
  module.py    TriangleMultiplication, the nn.Module
"""

from featurecache.kernels.triangle_mult.autograd import triangle_mult
from featurecache.kernels.triangle_mult.launch import DIRECTIONS, triangle_mult_bwd, triangle_mult_fwd
from featurecache.kernels.triangle_mult.module import TriangleMultiplication

__all__ = ["DIRECTIONS", "TriangleMultiplication", "triangle_mult", "triangle_mult_bwd", "triangle_mult_fwd"]
