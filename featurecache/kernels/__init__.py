"""Triton kernels with pure-PyTorch references.

Only torch and triton are needed to import this package. Names are resolved lazily so that
importing one op does not compile or import the others.
"""

from importlib import import_module

# Imported eagerly: the function shares its name with its module, and a lazy lookup would hand
# out the module once something imported `featurecache.kernels.evo_attention` directly.
from featurecache.kernels.evo_attention import evo_attention

_EXPORTS = {
    "evo_attention_reference": "featurecache.kernels.reference",
    "gated_pair_attention": "featurecache.kernels.gated_attention",
    "gated_pair_attention_reference": "featurecache.kernels.reference",
    "LayerNormLinear": "featurecache.kernels.layernorm_linear",
    "Transition": "featurecache.kernels.transition",
    "TriangleMultiplication": "featurecache.kernels.triangle_mult",
}

__all__ = sorted([*_EXPORTS, "evo_attention"])


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'featurecache.kernels' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
