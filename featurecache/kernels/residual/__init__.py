"""Residual add of an update to a stream, with the update's shared dropout drawn in the same pass.

Two cases, one kernel each way:
- an fp32 stream under bf16 autocast (a residual stream kept in fp32, every update reading it in
  bf16): new = z + update in fp32, written once in fp32 and once in bf16; backward d_z = d_new +
  d_low (fp32) and d_update = d_z in the update's dtype. Composed from PyTorch ops that is four
  memory-bound passes around each update (benchmarks/NOTES-train_step.md);
- a stream in the update's dtype with dropout: the model's own case, since the trunk's pair and
  the MSA come out of bf16 products under autocast and stay bf16 (NOTES-activation_memory.md).
  The add alone is one kernel anyway; the mask, hashed from the seed with PyTorch operators,
  is ~40 small kernels and a multiply per site (four sites a pair stack, one an MSA block).
The mask is hashed in the kernel from the seed on the device: no mask tensor, no pass of its own.
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
