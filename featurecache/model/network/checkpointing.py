"""Activation checkpointing as the model uses it: reentrant, no RNG state, nestable.

Reentrant: the recomputation builds an ordinary autograd graph, so any custom autograd Function
works inside it (the non-reentrant variant forbids reading ctx.saved_tensors twice in one
backward, which plain autograd allows), and checkpoints nest (a checkpointed group's re-run
checkpoints its blocks). The model reads no generator inside a checkpoint (dropout masks are
functions of a seed tensor, featurecache.model.network.layers.shared_dropout), so no RNG state is saved:
that also keeps the step capturable as a CUDA graph, where reading the generator's state is an
error.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def checkpointed(function, *args):
    """function(*args), keeping only the tensor args for backward and re-running it there."""
    return checkpoint(function, *args, use_reentrant=True, preserve_rng_state=False)


def maybe_checkpointed(enabled: bool, function, *args):
    """checkpointed(function, *args) when `enabled` and autograd records, else function(*args):
    for the pair-sized paths that ModelConfig.checkpoint_group > 1 recomputes in backward."""
    if enabled and torch.is_grad_enabled():
        return checkpointed(function, *args)
    return function(*args)
