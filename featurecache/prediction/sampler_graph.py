"""The sampler's denoiser replayed as a CUDA graph (`featurecache predict --cuda-graphs`).

Algorithm 18 calls the diffusion module once per sampler step (200 in AF3) on inputs of one
shape, with the trunk's outputs fixed for the whole target: the same few hundred kernel launches
at every step, each short at inference sizes, so the GPU waits on the host between them. Here the
module is warmed up (the first calls compile the Triton kernels), captured once per target, and
each later step is one replay. The sampler's own arithmetic and its random draws (from the
caller's generator, possibly on the host) stay outside the graph, so a graphed prediction draws
the same noise as an eager one.

The graph reads the diffusion context (trunk outputs, conditioning) at the addresses it was
captured with: it lives only as long as the one `AF3Model.sample` call that made it.
"""

from __future__ import annotations

import torch

from featurecache.model.network.diffusion_sampler import Denoiser
from featurecache.training.cuda_graph import CapturedStep

# Eager calls before the capture: the first compiles the kernels and builds cuBLAS workspaces,
# the second runs as a replay will (a graph must capture no one-off work).
WARMUP_STEPS = 2


class GraphedDenoiser:
    """denoise(x_noisy, sigma) as a CapturedStep: WARMUP_STEPS eager calls, then one capture, then
    replays. Returns a copy of the graph's output (the next replay overwrites it). With
    capture=False every call is eager: the same path on the CPU, as tests run it."""

    def __init__(self, denoise: Denoiser, capture: bool = True, warmup_steps: int = WARMUP_STEPS) -> None:
        self._step = CapturedStep(
            lambda inputs: {"denoised": denoise(inputs["noisy"], inputs["sigma"])}, warmup_steps, capture
        )

    @property
    def is_captured(self) -> bool:
        return self._step.is_captured

    def __call__(self, noisy: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return self._step({"noisy": noisy, "sigma": sigma})["denoised"].clone()
