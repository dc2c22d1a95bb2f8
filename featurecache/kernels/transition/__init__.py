"""AF3 Transition (Algorithm 11) as one fused MLP: LayerNorm -> two projections to n*C -> SwiGLU ->
projection back to C.

The forward walks the hidden dimension in chunks of BLOCK_H, keeping a, b and silu(a) * b for one
chunk in registers and accumulating the output projection: the [rows, n*C] hidden never touches
memory, and only x and two floats a row are saved. The backward recomputes the chunks (at L=384,
C=128, n=4 in bf16 each saved [rows, 4C] tensor would be 144 MiB): one kernel over row tiles
produces dx and the LayerNorm parameter gradients. The weight gradients follow the strategy
named by WEIGHT_GRADS in configs/fused_ops.json:
- "recompute": a second kernel over (hidden chunk, row split) recomputes the chunks and
  accumulates the three weight gradients in registers; nothing [rows, n*C] is written.
- "matmul": the dx kernel also writes [d_a | d_b], the hidden and LN(x) (460 MiB of transient
  memory at the size above), and cuBLAS forms the weight gradients: large products run at
  cuBLAS's speed instead of the small tiles the recompute kernel can hold in registers
  (figures: benchmarks/NOTES-fused_ops.md).
Layout, in the order a call goes through it (as for every op of featurecache.kernels):
  kernels.py   the @triton.jit kernels (forward, dx, weight gradients)
  config.py    the tile sizes from the tuned configurations under shared-memory budgets
  launch.py    the launchers (transition_fwd / _bwd)
  autograd.py  the custom ops, the autograd Function and `transition`, the entry point
  module.py    Transition, the nn.Module
"""

from featurecache.kernels.transition.autograd import transition
from featurecache.kernels.transition.launch import transition_bwd, transition_fwd
from featurecache.kernels.transition.module import Transition

__all__ = ["Transition", "transition", "transition_bwd", "transition_fwd"]
