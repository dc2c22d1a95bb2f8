"""EvoAttention: attention with pair bias and key mask, as Triton kernels.

q, k, v: [B, N, L, H, D] with any strides; bias: [B, 1 or N, H, L, L] (fp32 or the input dtype);
mask: [B, N, L] bool (True = attend). Output [B, N, L, H, D]. Used by triangle attention (N = L
rows of the pair map), single attention with pair bias (N = 1) and template / MSA attention.

Layout, in the order a call goes through it (the same for every op of featurecache.kernels):
  kernels.py   the @triton.jit kernels
  config.py    block configurations: tuned per GPU in configs/evo_attention.json, or a heuristic
  launch.py    input checks and the launchers (evo_attention_forward / _backward)
  autograd.py  the custom ops, the autograd Function and `evo_attention`, the entry point
"""

from featurecache.kernels.evo_attention.autograd import evo_attention
from featurecache.kernels.evo_attention.config import (
    BlockConfig,
    EvoAttentionConfig,
    load_tuned_configs,
    select_config,
)
from featurecache.kernels.evo_attention.launch import (
    SUPPORTED_HEAD_DIMS,
    SizeLimitError,
    check_inputs,
    evo_attention_backward,
    evo_attention_forward,
    wide_index,
)

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "BlockConfig",
    "EvoAttentionConfig",
    "SizeLimitError",
    "check_inputs",
    "evo_attention",
    "evo_attention_backward",
    "evo_attention_forward",
    "load_tuned_configs",
    "select_config",
    "wide_index",
]
