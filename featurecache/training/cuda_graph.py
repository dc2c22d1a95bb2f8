"""A training step replayed as one CUDA graph, so the host launches it with a single call.

The Pairformer's kernels are short at training crops (a block at L = 384 launches ~230 of
them), so launching them from Python can take longer than running them: the GPU waits on the
host (benchmarks/RESULTS.md has the measurements). A CUDA graph records every launch of one step
once and replays them from the GPU's own queue.

What a captured step needs, and `CapturedStep` provides or checks:
- static shapes and addresses: inputs are copied into buffers owned by the graph (so batches
  must be padded to fixed sizes), and outputs are tensors the graph overwrites at each replay;
- no host synchronization inside the step (no `.item()`, no data-dependent Python branches);
- random draws only from the default CUDA generator, which a graph replays with the seed it holds
  at each replay (activation checkpointing here saves no RNG state; the model has no dropout);
- warm-up steps before capture, on a side stream: they compile the Triton kernels, build cuBLAS
  workspaces and create the optimizer's state, none of which may happen during capture;
- an optimizer built with `capturable=True` (its step counter stays on the GPU), and a learning
  rate held in a GPU tensor if it changes between steps (a float would be frozen into the graph).

Every call is one real step on that call's inputs: the first `warmup_steps` calls run eagerly,
the next one captures the graph and replays it once, and later calls only replay.

`GraphedUpdate` is the optimizer step of a `--cuda-graphs` run, on one GPU or data-parallel:
a graph for a micro-batch's forward, loss and backward (replayed once per micro-batch,
accumulating into fixed gradient buffers), one per shape of input (the padding buckets of
training/buckets.py: a few, each warmed up and captured the first time a batch takes it), and
one graph for clipping, the AdamW update and the EMA; in between, outside any graph, the
gradients are all-reduced over the ranks (training/distributed.py's GradientBuckets). The
graphs share one memory pool: one runs at a time, what lasts from step to step (weights,
optimizer state, gradient buffers) lies outside it, and each graph's outputs are copied before
the next replay, so the pool holds what the largest graph needs, not the sum. Ranks need not take the same bucket in a step: each rank's backward graph is its own,
and the all-reduce, between the graphs, reads the gradient buffers, whose shapes are the
parameters'. The same update runs without capture (`capture=False`) on the CPU, which is how
tests check it against DDP and the eager step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from featurecache.training.distributed import GradientBuckets

StepFunction = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


class CapturedStep:
    """Run `step(inputs) -> outputs` (dicts of tensors) eagerly `warmup_steps` times, then as a
    CUDA graph: each later call copies the inputs into the graph's static buffers, replays it
    and returns its static outputs (overwritten by the next call: copy what must outlive it).

    A step may call `optimizer.zero_grad(set_to_none=True)` itself: inside the capture that makes
    the gradients tensors of the graph, which overwrites them at each replay. Outside the step,
    leave them alone.

    With capture=False every call runs `step` eagerly on the inputs as given (on their device,
    no static buffers): the same code path without a graph, for the CPU.
    """

    def __init__(self, step: StepFunction, warmup_steps: int = 3, capture: bool = True, pool=None) -> None:
        """`pool`: a memory pool (torch.cuda.graph_pool_handle()) the graph shares with other graphs
        that are never replayed at the same time, None for a private one. In a shared pool a
        graph's outputs last only until the next replay of any graph in it (another graph's
        temporaries may lie where they do): read or copy them first."""
        self.capture = capture
        self.pool = pool
        if capture and not torch.cuda.is_available():
            raise RuntimeError("CapturedStep needs a CUDA device")
        if warmup_steps < 1:
            raise ValueError(
                f"CapturedStep: warmup_steps is {warmup_steps}, at least 1 is needed (the first "
                "call compiles kernels and creates optimizer state, which a capture must not do)"
            )
        self.step = step
        self.warmup_steps = warmup_steps
        self.steps_run = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: dict[str, torch.Tensor] = {}
        self.static_outputs: dict[str, torch.Tensor] = {}

    @property
    def is_captured(self) -> bool:
        return self.graph is not None

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self.capture:
            self.steps_run += 1
            return self.step(dict(inputs))
        if not self.static_inputs:
            # Allocated once, before any step: warm-up steps read them too, so no second copy of
            # the inputs (or of their gradients) stays alive beside the graph's.
            self.static_inputs = {
                name: torch.empty_like(value, device="cuda").requires_grad_(value.requires_grad)
                for name, value in inputs.items()
            }
        self._copy_inputs(inputs)
        if self.graph is None and self.steps_run < self.warmup_steps:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                outputs = self.step(self.static_inputs)
            torch.cuda.current_stream().wait_stream(side)
        else:
            if self.graph is None:
                graph = torch.cuda.CUDAGraph()
                # thread_local: other threads' CUDA calls (NCCL's watchdog polling its events, the
                # loader's pinning thread) may go on during the capture
                with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                    self.static_outputs = self.step(self.static_inputs)
                self.graph = graph
            self.graph.replay()
            outputs = self.static_outputs
        self.steps_run += 1
        return outputs

    def release(self) -> None:
        """Drop the graph and its buffers now (the step may be captured again afterwards)."""
        if self.graph is not None:
            torch.cuda.synchronize()  # no replay may still be running when its graph is destroyed
        self.graph = None
        self.static_inputs, self.static_outputs = {}, {}
        self.steps_run = 0

    def _copy_inputs(self, inputs: Mapping[str, torch.Tensor]) -> None:
        missing = sorted(set(self.static_inputs) - set(inputs))
        if missing:
            raise KeyError(f"captured step: inputs {missing} are missing (the graph was captured with them)")
        for name, buffer in self.static_inputs.items():
            value = inputs[name]
            if value.shape != buffer.shape or value.dtype != buffer.dtype:
                raise ValueError(
                    f"captured step: input {name!r} is {tuple(value.shape)} {value.dtype}, the graph was "
                    f"captured with {tuple(buffer.shape)} {buffer.dtype} (pad batches to fixed sizes)"
                )
            with torch.no_grad():  # leaf buffers that require grad take new values like any other
                buffer.copy_(value, non_blocking=True)


def input_shapes(inputs: Mapping[str, torch.Tensor]) -> tuple:
    """What a captured graph is specific to: every input's name, shape and dtype."""
    return tuple((name, tuple(value.shape), value.dtype) for name, value in sorted(inputs.items()))


class GraphedUpdate:
    """One optimizer step from gradient buffers: `backward(inputs)` (forward, loss, backward of
    one micro-batch, accumulating into `gradients`; returns its loss terms) for each micro-batch,
    then `gradients.all_reduce()` outside any graph, then `apply()` (clipping, update, EMA;
    returns the gradient norm). The backward is one CapturedStep per shape of inputs
    (`backward_steps`, by input_shapes), each with its own warm-up, all in one memory pool; the
    apply is one CapturedStep.

    `before_micro(micro)` runs before each micro-batch's backward, outside the graph (it reseeds
    the generator the replay draws from).
    """

    def __init__(
        self,
        backward: StepFunction,
        apply: Callable[[], torch.Tensor],
        gradients: GradientBuckets,
        warmup_steps: int = 3,
        capture: bool = True,
    ) -> None:
        self.gradients = gradients
        self.backward = backward
        self.warmup_steps = warmup_steps
        self.capture = capture
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.backward_steps: dict[tuple, CapturedStep] = {}
        self.apply = CapturedStep(lambda _: {"grad_norm": apply()}, warmup_steps, capture, self.pool)

    @property
    def is_captured(self) -> bool:
        """Whether every step so far replayed graphs only (each shape seen is captured)."""
        return (
            bool(self.backward_steps)
            and all(step.is_captured for step in self.backward_steps.values())
            and self.apply.is_captured
        )

    def release(self) -> None:
        """Drop every graph and buffer now, while the CUDA context and Triton's modules are still
        there: left to the garbage collector (the graphs' step functions refer back to the trainer,
        a cycle), they were destroyed during interpreter shutdown."""
        for step in [*self.backward_steps.values(), self.apply]:
            step.release()
        self.backward_steps = {}

    def backward_step(self, inputs: Mapping[str, torch.Tensor]) -> CapturedStep:
        """The backward CapturedStep of these inputs' shapes, made the first time they are seen."""
        shapes = input_shapes(inputs)
        if shapes not in self.backward_steps:
            self.backward_steps[shapes] = CapturedStep(self.backward, self.warmup_steps, self.capture, self.pool)
        return self.backward_steps[shapes]

    def __call__(
        self, micro_batches: Sequence[Mapping[str, torch.Tensor]], before_micro: Callable[[int], None]
    ) -> dict[str, torch.Tensor]:
        """The step's loss terms (mean over the micro-batches) and `grad_norm`: copies, not the
        graphs' outputs, which the next replay overwrites."""
        self.gradients.zero()
        terms: list[dict[str, torch.Tensor]] = []
        for micro, inputs in enumerate(micro_batches):
            before_micro(micro)
            outputs = self.backward_step(inputs)(inputs)
            terms.append({name: value.clone() for name, value in outputs.items()})
        self.gradients.all_reduce()
        means = {name: torch.stack([values[name] for values in terms]).mean() for name in terms[0]}
        return {**means, "grad_norm": self.apply({})["grad_norm"].clone()}
