"""Weights cast to the compute dtype once per sampler, not once per call.

Under autocast the fused kernels (and their references) compute in bf16 and cast their fp32
weights to it themselves (`runtime.weights_like`, `reference._linear`): one small copy kernel
per weight and call. A sampler calls the same modules with the same weights many times (the
mini-rollout 20 times per training step, inference 200 times per target): on a GPU the casts
were ~40 % of the mini-rollout's kernels (counted on the CPU, benchmarks/NOTES.md section 10).
Within `cached_weight_casts()` a weight is cast once and the copy reused.

Only without gradient: a cached copy made without gradient would cut the weight off from a
later differentiated use, and one made with gradient would tie later uses into the first use's
graph. The copy is keyed by the weight's identity and version (an in-place update makes it
stale), and dropped when the scope ends. Inside a CUDA graph capture the copies are the
graph's own memory, made once by the capture; a graph captured inside the scope reads copies
made before it, so it must not be replayed after the scope ends (a sampler's graph lives only
within its sampler call).

A training micro-batch is the other case (`step_weight_casts()`, around its forward and
backward): there each weight is cast once, with gradient, and every use shares the copy: the
checkpointed blocks' first forward (without gradient), their recomputation in backward and the
mini-rollout between them. Every differentiated use's gradient reaches the weight through the
one cast (its backward keeps no tensors, so each recomputation's backward may pass through it).
The trunk's blocks otherwise cast their weights twice a step (forward and recomputation): 1,296
copies of the af3 step's ~50,000 kernels (counted on the CPU, benchmarks/NOTES.md section 21).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_scope = threading.local()


@contextlib.contextmanager
def cached_weight_casts() -> Iterator[None]:
    """Within it, cast_weight casts each weight once per dtype while gradients are off.
    Nested scopes share the outermost one's copies.

    Entered without gradient, it also turns on autocast's own cache of cast weights, for the
    modules autocast casts (nn.Linear): a CUDA-graph training step runs with that cache off
    (training/loop.py), and the mini-rollout's linears cast ~6,300 weights a step at the af3
    preset, 44 % of the step's fp32 -> bf16 copies (counted on the CPU, benchmarks/NOTES.md
    section 17). The cache is cleared when the scope ends, so that no copy made without
    gradient is reused by a later differentiated call."""
    if getattr(_scope, "copies", None) is not None:
        yield
        return
    _scope.copies = {}
    autocast_cache = torch.is_autocast_cache_enabled()
    cache_linears = not torch.is_grad_enabled()
    if cache_linears:
        torch.set_autocast_cache_enabled(True)
    try:
        yield
    finally:
        _scope.copies = None
        if cache_linears:
            torch.set_autocast_cache_enabled(autocast_cache)
            torch.clear_autocast_cache()


@contextlib.contextmanager
def step_weight_casts() -> Iterator[None]:
    """Within it, cast_weight casts each weight once per dtype, with gradient, for every use in
    or out of gradient mode (one training micro-batch's forward and backward); a sampler's
    cached_weight_casts inside it (the mini-rollout) reads the same copies."""
    if getattr(_scope, "step_copies", None) is not None:
        yield
        return
    _scope.step_copies = {}
    try:
        yield
    finally:
        _scope.step_copies = None


def step_casts_open() -> bool:
    """Whether a step_weight_casts scope is open (cast_weight then shares one copy a step)."""
    return getattr(_scope, "step_copies", None) is not None


def cast_weight(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """weight.to(dtype), the same copy each time within cached_weight_casts (gradients off) or
    step_weight_casts (a differentiable copy)."""
    if weight.dtype == dtype:
        return weight
    if torch.compiler.is_compiling():  # compiled code: no Python state
        return weight.to(dtype)
    step_copies = getattr(_scope, "step_copies", None)
    if step_copies is not None:
        with torch.enable_grad():  # differentiable even when made in a checkpoint's first forward
            return _kept(step_copies, weight, dtype)
    copies = getattr(_scope, "copies", None)
    if copies is None or torch.is_grad_enabled():
        return weight.to(dtype)
    return _kept(copies, weight, dtype)


def _kept(copies: dict, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """copies' cast of weight to dtype, made now if missing or stale (the weight changed in place)."""
    key = (id(weight), dtype)
    kept = copies.get(key)
    if kept is not None and kept[0] is weight and kept[1] == weight._version:
        return kept[2]
    cast = weight.to(dtype)
    copies[key] = (weight, weight._version, cast)
    return cast
