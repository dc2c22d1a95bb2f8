"""Triton kernels with pure-PyTorch references.

Only torch and triton are needed to import this package. Names are resolved lazily so that
importing one op does not compile or import the others.

Every op has the same parts, in the order a call goes through them: @triton.jit kernels,
launchers (allocate, pick block sizes, launch), the autograd Function (and custom op) with the
entry-point function, and the nn.Module where there is one. A large op is a package with one
file per part: kernels.py, launch.py, autograd.py, and module.py (triangle_mult/,
window_attention/) and/or config.py (evo_attention/, whose block sizes are tuned per shape class;
window_attention/). Under torch.compile every op runs as a torch.library custom op with fake and
autograd implementations (eager calls skip that dispatch), so neither Dynamo nor Inductor traces
a launcher; gated_pair_attention and residual_add compile as their references over those ops.
A small op is one file with the
same sections in the same order (layernorm_linear.py, transition.py, gated_attention.py,
residual.py, conditioned_transition.py). Shared by all:
  runtime.py     host side: the kernel switch (KERNEL_CHOICES), TRITON_INTERPRET, tuned block
                 configurations (configs/*.json), launch checks and tile sizes
  primitives.py  @triton.jit building blocks: mma, cast, the LayerNorm prologue and backward
  reference.py   the pure-PyTorch references: the CPU path and the tests' ground truth
"""

from importlib import import_module

# Imported eagerly: the function shares its name with its package, and a lazy lookup would hand
# out the package once something imported `featurecache.kernels.evo_attention` directly.
from featurecache.kernels.evo_attention import evo_attention

_EXPORTS = {
    "KERNEL_CHOICES": "featurecache.kernels.runtime",
    "adaptive_layernorm": "featurecache.kernels.conditioned_transition",
    "conditioned_transition": "featurecache.kernels.conditioned_transition",
    "conditioned_transition_reference": "featurecache.kernels.reference",
    "evo_attention_reference": "featurecache.kernels.reference",
    "gated_pair_attention": "featurecache.kernels.gated_attention",
    "gated_pair_attention_reference": "featurecache.kernels.reference",
    "LayerNormLinear": "featurecache.kernels.layernorm_linear",
    "Transition": "featurecache.kernels.transition",
    "TriangleMultiplication": "featurecache.kernels.triangle_mult",
    "WindowAttention": "featurecache.kernels.window_attention",
    "window_attention_reference": "featurecache.kernels.reference",
}

__all__ = sorted([*_EXPORTS, "evo_attention"])


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'featurecache.kernels' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
