"""Windowed attention with a pair bias and key mask shared by the samples: AF3's sequence-local
atom attention (Algorithm 7), 32 queries x 128 keys per window, for every diffusion sample.

q [B, S, W, queries, H, D], k and v [B, S, W, keys, H, D] (any strides); bias
[B, W, H, queries, keys] (fp32 or the input dtype); mask [B, W, keys] bool. Output
[B, S, W, queries, H, D]. Without the padding of each window's queries to `keys` rows that
EvoAttention would need (4x the work at AF3's sizes), and with the bias read from memory once
for a group of samples.

Layout, in the order a call goes through it (the same for every op of featurecache.kernels):
  kernels.py   the @triton.jit kernels
  config.py    samples per program, the backward's key block, launch options (a heuristic)
  launch.py    input checks and the launchers (window_attention_forward / _backward)
  autograd.py  the custom ops, the autograd Function and `window_attention`, the entry point
  module.py    WindowAttention, the nn.Module
"""

from featurecache.kernels.window_attention.autograd import window_attention
from featurecache.kernels.window_attention.config import WindowConfig, select_config
from featurecache.kernels.window_attention.launch import (
    check_inputs,
    window_attention_backward,
    window_attention_forward,
)
from featurecache.kernels.window_attention.module import WindowAttention

__all__ = [
    "WindowAttention",
    "WindowConfig",
    "check_inputs",
    "select_config",
    "window_attention",
    "window_attention_backward",
    "window_attention_forward",
]
