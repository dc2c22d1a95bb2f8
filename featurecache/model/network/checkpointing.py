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

from featurecache.kernels.reference import kept_for_recompute


def checkpointed(function, *args):
    """function(*args), keeping only the tensor args for backward and re-running it there. The
    CPU path's row-block attention keeps its outputs from the first run for the re-run
    (kernels.reference.kept_for_recompute): a fifth of a triangle attention's cost, not re-run."""
    kept: list = []

    def run(*inputs):
        # the first run is without gradient (checkpoint's forward), the re-run with it
        with kept_for_recompute(kept, replay=torch.is_grad_enabled()):
            return function(*inputs)

    return checkpoint(run, *args, use_reentrant=True, preserve_rng_state=False)


def maybe_checkpointed(enabled: bool, function, *args):
    """checkpointed(function, *args) when `enabled` and autograd records, else function(*args):
    for the pair-sized paths that ModelConfig.checkpoint_group > 1 recomputes in backward."""
    if enabled and torch.is_grad_enabled():
        return checkpointed(function, *args)
    return function(*args)
