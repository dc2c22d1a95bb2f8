"""Residual add of a low-precision update to an fp32 stream, returning the sum in both precisions.

Under bf16 autocast the pair representation z stays fp32 between updates (as autocast leaves
any residual stream), while every update reads it in bf16. Composed from PyTorch ops, each of
the Pairformer's five pair updates then costs four memory-bound kernels around it: the add
(fp32 + bf16), the next module's cast to bf16, and in the backward the cast of that module's
bf16 input gradient back to fp32 and its add to the stream's gradient (plus a cast of the
update's gradient to bf16), each a full pass over the largest tensor of the trunk (profiles:
benchmarks/NOTES-train_step.md). Here each direction is one kernel:
- forward: new = z + update in fp32, written once in fp32 and once in bf16;
- backward: d_z = d_new + d_low (fp32) and d_update = d_z in the update's dtype.
Layout, in the order a call goes through it (as for every op of featurecache.kernels):
  kernels.py   the @triton.jit kernels (forward, backward)
  launch.py    the launchers (residual_add_fwd / _bwd), one launch each
  autograd.py  the autograd Function and `residual_add`, the entry point
The reference, residual_add_reference, is kernels/reference.py's, as every op's.
"""

from featurecache.kernels.reference import residual_add_reference
from featurecache.kernels.residual.autograd import residual_add
from featurecache.kernels.residual.launch import residual_add_bwd, residual_add_fwd

__all__ = ["residual_add", "residual_add_bwd", "residual_add_fwd", "residual_add_reference"]
