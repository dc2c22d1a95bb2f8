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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

StepFunction = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


class CapturedStep:
    """Run `step(inputs) -> outputs` (dicts of tensors) eagerly `warmup_steps` times, then as a
    CUDA graph: each later call copies the inputs into the graph's static buffers, replays it
    and returns its static outputs (overwritten by the next call: copy what must outlive it).

    A step may call `optimizer.zero_grad(set_to_none=True)` itself: inside the capture that makes
    the gradients tensors of the graph, which overwrites them at each replay. Outside the step,
    leave them alone.
    """

    def __init__(self, step: StepFunction, warmup_steps: int = 3) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CapturedStep needs a CUDA device")
        if warmup_steps < 1:
            raise ValueError(f"CapturedStep: warmup_steps is {warmup_steps}, at least 1 is needed (the first "
                             "call compiles kernels and creates optimizer state, which a capture must not do)")
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
        if not self.static_inputs:
            # Allocated once, before any step: warm-up steps read them too, so no second copy of
            # the inputs (or of their gradients) stays alive beside the graph's.
            self.static_inputs = {name: torch.empty_like(value, device="cuda").requires_grad_(value.requires_grad)
                                  for name, value in inputs.items()}
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
                with torch.cuda.graph(graph):
                    self.static_outputs = self.step(self.static_inputs)
                self.graph = graph
            self.graph.replay()
            outputs = self.static_outputs
        self.steps_run += 1
        return outputs

    def _copy_inputs(self, inputs: Mapping[str, torch.Tensor]) -> None:
        missing = sorted(set(self.static_inputs) - set(inputs))
        if missing:
            raise KeyError(f"captured step: inputs {missing} are missing (the graph was captured with them)")
        for name, buffer in self.static_inputs.items():
            value = inputs[name]
            if value.shape != buffer.shape or value.dtype != buffer.dtype:
                raise ValueError(f"captured step: input {name!r} is {tuple(value.shape)} {value.dtype}, the graph was "
                                 f"captured with {tuple(buffer.shape)} {buffer.dtype} (pad batches to fixed sizes)")
            with torch.no_grad():  # leaf buffers that require grad take new values like any other
                buffer.copy_(value, non_blocking=True)
