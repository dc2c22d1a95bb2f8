"""LayerNorm fused into the prologue of a Linear: y = linear(layer_norm(x)).

The normalized input never goes to memory in the forward: each [BLOCK_M, K] tile is normalized
in registers and fed to tl.dot, and only the per-row mean and rstd (8 bytes a row) are saved.
The backward's dx kernel recomputes it from x. For the weight gradient there are two strategies
(WEIGHT_GRADS in configs/fused_ops.json): "matmul", where the dx kernel also writes LN(x) (a
transient [rows, K] buffer, 36 MiB at 147,456 rows x 128 in bf16) and cuBLAS forms dy^T @ LN(x),
and "recompute", a Triton kernel that re-normalizes x for every output tile and writes nothing
[rows, K]. "recompute" re-reads x once per BLOCK_N outputs, so it loses where outputs are wide
(the sweep's figures: benchmarks/NOTES-fused_ops.md).
Layout, in the order a call goes through it (as for every op of featurecache.kernels):
  kernels.py   the @triton.jit kernels (forward, dx, the weight gradients' recompute)
  launch.py    the launchers (layernorm_linear_fwd / _bwd); their tiles are the tuned
               configurations of configs/fused_ops.json (runtime.tile_config), so no config.py
  autograd.py  the custom ops, the autograd Function and `layernorm_linear`, the entry point
  module.py    LayerNormLinear, the nn.Module
"""

from featurecache.kernels.layernorm_linear.autograd import layernorm_linear
from featurecache.kernels.layernorm_linear.launch import layernorm_linear_bwd, layernorm_linear_fwd
from featurecache.kernels.layernorm_linear.module import LayerNormLinear

__all__ = ["LayerNormLinear", "layernorm_linear", "layernorm_linear_bwd", "layernorm_linear_fwd"]
