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
Cast one by one, the ~2,000 weights of the af3 preset still cost a kernel each and their
gradients another: with a StepCastPlan (the Trainer's) the scope casts the weights the last
micro-batch cast all at once on entry, and their gradients back the same way (_BulkCast).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

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


class StepCastPlan:
    """The weights a training step cast, by dtype, kept from one step to the next (a Trainer holds
    one): the next step's scope casts them all at its start with a few multi-tensor kernels
    (_BulkCast), where casting each at its first use launches one kernel per weight (~2,000 at
    the af3 preset) and as many again for the gradients cast back."""

    def __init__(self) -> None:
        self.weights: dict[torch.dtype, list[torch.Tensor]] = {}

    def remember(self, step_copies: dict) -> None:
        """The weights of a finished step's copies (_kept's entries); frozen ones stay out (their
        bulk copies would track gradients)."""
        self.weights = {}
        for (_, dtype), (weight, _, _) in step_copies.items():
            if weight.requires_grad:
                self.weights.setdefault(dtype, []).append(weight)


class _BulkCast(torch.autograd.Function):
    """Many weights cast to one dtype by torch._foreach_copy_ (multi-tensor kernels on a GPU);
    the gradients that reach the copies are cast back to each weight's dtype the same way. Its
    backward keeps no tensors: each checkpoint's recomputation may pass its gradients through
    it, as through one weight's cast."""

    @staticmethod
    def forward(ctx, dtype: torch.dtype, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)  # the copies a backward pass did not use get None
        ctx.dtypes = [weight.dtype for weight in weights]
        copies = [torch.empty_like(weight, dtype=dtype) for weight in weights]
        torch._foreach_copy_(copies, list(weights))
        return tuple(copies)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):
        present = [i for i, grad in enumerate(grads) if grad is not None and ctx.needs_input_grad[i + 1]]
        result: list[torch.Tensor | None] = [None] * len(grads)
        if present:
            widened = [torch.empty_like(grads[i], dtype=ctx.dtypes[i]) for i in present]
            torch._foreach_copy_(widened, [grads[i] for i in present])
            for i, grad in zip(present, widened):
                result[i] = grad
        return (None, *result)


@contextlib.contextmanager
def step_weight_casts(plan: StepCastPlan | None = None) -> Iterator[None]:
    """Within it, cast_weight casts each weight once per dtype, with gradient, for every use in
    or out of gradient mode (one training micro-batch's forward and backward); a sampler's
    cached_weight_casts inside it (the mini-rollout) reads the same copies. With a `plan`, the
    weights an earlier step cast are cast at once on entry, and the plan then holds the weights
    this step cast, for the next one."""
    if getattr(_scope, "step_copies", None) is not None:
        yield
        return
    _scope.step_copies = {}
    try:
        if plan is not None and not torch.compiler.is_compiling():
            with torch.enable_grad():
                for dtype, weights in plan.weights.items():
                    for weight, copy in zip(weights, _BulkCast.apply(dtype, *weights)):
                        _scope.step_copies[(id(weight), dtype)] = (weight, weight._version, copy)
        yield
        if plan is not None:
            plan.remember(_scope.step_copies)
    finally:
        _scope.step_copies = None


@contextlib.contextmanager
def step_casts_paused(paused: bool = True) -> Iterator[None]:
    """Within it (where `paused`), cast_weight keeps no step-long copy: a weight is cast at each
    differentiated use (the copy lives as long as the graph that saved it) or once per sampler
    (cached_weight_casts), and the step's plan leaves it out. For large weights whose uses are
    one module's: their copies would otherwise be alive at the step's peak (the token
    transformer's 180 M weights, 0.34 GB in bf16: benchmarks/NOTES.md section 24)."""
    if not paused:
        yield
        return
    step_copies = getattr(_scope, "step_copies", None)
    _scope.step_copies = None
    try:
        yield
    finally:
        _scope.step_copies = step_copies


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


class _PackedCast(torch.autograd.Function):
    """Weights cast to one dtype into the rows of one tensor, side by side along the first axis
    (torch._foreach_copy_ into its slices: no concatenation of the fp32 weights first); backward
    casts each weight's rows of the gradient back to its dtype the same way."""

    @staticmethod
    def forward(ctx, dtype: torch.dtype, *weights: torch.Tensor) -> torch.Tensor:
        ctx.dtypes, ctx.rows = [weight.dtype for weight in weights], [weight.shape[0] for weight in weights]
        packed = weights[0].new_empty((sum(ctx.rows), *weights[0].shape[1:]), dtype=dtype)
        torch._foreach_copy_(list(packed.split(ctx.rows)), list(weights))
        return packed

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        parts = grad.split(ctx.rows)
        widened = [torch.empty_like(part, dtype=dtype) for part, dtype in zip(parts, ctx.dtypes)]
        torch._foreach_copy_(widened, list(parts))
        return (None, *widened)


def cast_packed(weights: tuple[torch.Tensor, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.cat(weights) in dtype: several products' weights as one (their outputs side by
    side), from cast_weight's shared copies within step_weight_casts, else cast into one tensor
    (_PackedCast), once per sampler call (kept_per_sampler)."""
    if torch.compiler.is_compiling():  # compiled code: no Python state
        return torch.cat(weights).to(dtype)
    if step_casts_open():
        return torch.cat([cast_weight(weight, dtype) for weight in weights])
    return kept_per_sampler(weights, ("packed", dtype), lambda: _PackedCast.apply(dtype, *weights))


def kept_per_sampler(weights: tuple[torch.Tensor, ...], key, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """make(): a tensor made from `weights` alone (cast, packed side by side, padded, sliced),
    named by `key` among the tensors made from the same weights. Within cached_weight_casts
    while gradients are off it is made once and kept for the scope (made again when a weight
    changes in place), as cast_weight keeps a cast; otherwise made at each call."""
    copies = getattr(_scope, "copies", None)
    if copies is None or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return make()
    entry = (tuple(id(weight) for weight in weights), key)
    versions = tuple(weight._version for weight in weights)
    kept = copies.get(entry)
    if kept is not None and all(a is b for a, b in zip(kept[0], weights)) and kept[1] == versions:
        return kept[2]
    made = make()
    copies[entry] = (weights, versions, made)
    return made


def _kept(copies: dict, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """copies' cast of weight to dtype, made now if missing or stale (the weight changed in place)."""
    key = (id(weight), dtype)
    kept = copies.get(key)
    if kept is not None and kept[0] is weight and kept[1] == weight._version:
        return kept[2]
    cast = weight.to(dtype)
    copies[key] = (weight, weight._version, cast)
    return cast
