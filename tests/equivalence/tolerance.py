"""The bound every comparison of tests/equivalence is held to.

Both sides compute in fp32 (unit roundoff 6e-8) the same operations in different orders (packed
versus separate projections, einsum versus matmul, softmax with masks added or filled). Sums of
n terms with rounding errors of random sign grow like sqrt(n) u: the widest sums here (an outer
product mean's or a triangle multiplication's, a few hundred terms, through a few LayerNorms and
softmaxes that can amplify by ~10) stay near 1e-6 in the norm-wise relative error
(featurecache.testing.compare.rel_error), and 1e-5, the bound issue 33 asks for, leaves that a
factor ~10. A missing term, a transposed matrix or a wrong mask gives errors of order 1.
"""

FP32_TOLERANCE = 1e-5
