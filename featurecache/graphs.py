"""A training step replayed as one CUDA graph, so the host launches it with a single call.

The Pairformer's kernels are short at training crops (a block at L = 384 launches ~250 kernels
in ~11 ms of GPU time), and launching them from Python costs more than running them: on the
H200 machines of 2026-12-02 one block's forward + backward took 16-21 ms of host time. A CUDA graph records
every launch of one step once and replays them from the GPU's own queue.

What a captured step needs, and `CapturedStep` provides or checks:
- static shapes and addresses: inputs are copied into buffers owned by the graph (so batches
  must be padded to fixed sizes), and outputs are tensors the graph overwrites at each replay;
- no host synchronization inside the step (no `.item()`, no data-dependent Python branches);
- no RNG state reads (activation checkpointing here saves none; the trunk has no dropout);
- warm-up runs before capture, on a side stream: they compile the Triton kernels, build cuBLAS
  workspaces and create the optimizer's state, none of which may happen during capture;
- an optimizer built with `capturable=True` (its step counter stays on the GPU).

Warm-up runs are real steps: with a training step they update the model, as eager steps would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

StepFunction = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


class CapturedStep:
    """Capture `step(inputs) -> outputs` (dicts of tensors) once; each call copies new inputs
    into the static buffers, replays the graph and returns the static outputs.

    A step may call `optimizer.zero_grad(set_to_none=True)` itself: that runs in the warm-up
    and the capture only, so the gradients the capture allocates belong to the graph, which
    overwrites them at each replay. Outside the step, leave them alone.
    """

    def __init__(self, step: StepFunction, example_inputs: Mapping[str, torch.Tensor], warmup_steps: int = 3) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CapturedStep needs a CUDA device")
        # leaves keep requires_grad, so a step may also produce the inputs' gradients
        self.static_inputs = {name: value.detach().clone().requires_grad_(value.requires_grad)
                              for name, value in example_inputs.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup_steps):
                step(self.static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_outputs = step(self.static_inputs)

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for name, buffer in self.static_inputs.items():
            value = inputs[name]
            if value.shape != buffer.shape:
                raise ValueError(f"captured step: input {name!r} has shape {tuple(value.shape)}, the graph was "
                                 f"captured with {tuple(buffer.shape)} (pad batches to fixed sizes)")
            with torch.no_grad():  # leaf buffers that require grad take new values like any other
                buffer.copy_(value, non_blocking=True)
        self.graph.replay()
        return self.static_outputs
