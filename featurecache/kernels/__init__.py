"""Triton kernels with pure-PyTorch references.

Only torch and triton are needed to import this package. Importing it defines every op's
kernels and registers its custom ops; nothing compiles until a kernel is first launched.

Every op is a package `kernels/<op>/` with the same parts, one file each, in the order a call
goes through them:
  kernels.py   the @triton.jit kernels
  config.py    block configurations, where an op picks them by more than the tuned table
               (evo_attention/, window_attention/, transition/, conditioned_transition/)
  launch.py    input checks and the launchers: allocate, pick block sizes, launch
  autograd.py  the autograd Function and custom ops, and the entry-point function
  module.py    the nn.Module, where the op has one (layernorm_linear/, transition/,
               triangle_mult/, window_attention/)
An op without a part has no file for it. Under torch.compile every op runs as a torch.library
custom op with fake and autograd implementations (eager calls skip that dispatch), so neither
Dynamo nor Inductor traces a launcher; gated_pair_attention and residual_add compile as their
references over those ops. Shared by all:
  runtime.py     host side: the kernel switch (KERNEL_CHOICES), TRITON_INTERPRET, tuned block
                 configurations (configs/*.json), launch checks and tile sizes
  primitives.py  @triton.jit building blocks: mma, cast, the LayerNorm prologue and backward
  reference.py   the pure-PyTorch references: the CPU path and the tests' ground truth

Several entry points share their op's name (evo_attention, conditioned_transition, transition,
layernorm_linear): `featurecache.kernels.transition` is the function, bound below after its
package was imported; the package is reached by importing from it
(`from featurecache.kernels.transition import Transition`), never as an attribute.
"""

from featurecache.kernels.conditioned_transition import adaptive_layernorm, conditioned_transition
from featurecache.kernels.evo_attention import evo_attention
from featurecache.kernels.gated_attention import gated_pair_attention
from featurecache.kernels.layernorm_linear import LayerNormLinear, layernorm_linear
from featurecache.kernels.reference import (
    conditioned_transition_reference,
    evo_attention_reference,
    gated_pair_attention_reference,
    window_attention_reference,
)
from featurecache.kernels.residual import residual_add
from featurecache.kernels.runtime import KERNEL_CHOICES
from featurecache.kernels.smooth_lddt import smooth_lddt_sums
from featurecache.kernels.transition import Transition, transition
from featurecache.kernels.triangle_mult import TriangleMultiplication, triangle_mult
from featurecache.kernels.window_attention import WindowAttention, window_attention

__all__ = [
    "KERNEL_CHOICES",
    "LayerNormLinear",
    "Transition",
    "TriangleMultiplication",
    "WindowAttention",
    "adaptive_layernorm",
    "conditioned_transition",
    "conditioned_transition_reference",
    "evo_attention",
    "evo_attention_reference",
    "gated_pair_attention",
    "gated_pair_attention_reference",
    "layernorm_linear",
    "residual_add",
    "smooth_lddt_sums",
    "transition",
    "triangle_mult",
    "window_attention",
    "window_attention_reference",
]
