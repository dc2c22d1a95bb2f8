"""Smooth LDDT (AF3 Algorithm 27) summed over atom pairs, for a whole diffusion batch, in one kernel.

Composed from PyTorch ops the loss builds [A, A] distance, error and sigmoid tensors for every
diffusion sample (48 per step, 9.4 M pairs each at 3,072 atoms); profiled on the H200 (crop 384,
2026-12-03) its distance kernels alone took 1.5 s of a 2.8 s step's device time. Here each
program takes a tile of atoms i of one sample and loops over all atoms j, computing predicted
and true distances on the fly, so nothing of size [A, A] is ever stored. The loss is a scalar
per sample, so the same pass also writes its gradient with respect to the predicted positions
(saved; the backward only scales it).

Pair (i, j) counts when i != j, both atoms are resolved and the true distance is below atom i's
inclusion radius (NUCLEOTIDE_INCLUSION_RADIUS, 30 A, for nucleotide atoms, INCLUSION_RADIUS, 15 A,
otherwise): `radius` carries both, 0 for an unresolved atom. The gradient of x_i collects the pairs
(i, j) and (j, i), whose radii differ.

lDDT's numbers (LDDT_THRESHOLDS and the two radii) are defined in kernels/reference.py, the
lowest layer that uses them, and exported here; model/objectives/lddt.py imports them (kernels
import nothing from the model). The Triton kernel spells the thresholds out as literals, one
sigmoid each.

Layout, in the order a call goes through it (as for every op of featurecache.kernels):
  kernels.py   the @triton.jit kernel (sums, counts and the gradient in one pass)
  launch.py    the launcher (smooth_lddt_sums_fwd)
  autograd.py  the autograd Function and custom op, and `smooth_lddt_sums`, the entry point
"""

from featurecache.kernels.reference import (
    INCLUSION_RADIUS,
    LDDT_THRESHOLDS,
    NUCLEOTIDE_INCLUSION_RADIUS,
    inclusion_radius,
    smooth_lddt_sums_reference,
)
from featurecache.kernels.smooth_lddt.autograd import smooth_lddt_sums
from featurecache.kernels.smooth_lddt.launch import smooth_lddt_sums_fwd

__all__ = [
    "INCLUSION_RADIUS",
    "LDDT_THRESHOLDS",
    "NUCLEOTIDE_INCLUSION_RADIUS",
    "inclusion_radius",
    "smooth_lddt_sums",
    "smooth_lddt_sums_fwd",
    "smooth_lddt_sums_reference",
]
