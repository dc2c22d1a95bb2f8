"""--deterministic: the settings under which two runs from one seed take bitwise identical steps.

Every random draw of a step already comes from generators seeded by (seed, step, micro-batch)
(featurecache.training.loop.noise_generator) and every sample's crop from (seed, epoch, index),
so what remains is the arithmetic: PyTorch's deterministic algorithms (an op without a
deterministic kernel raises instead of running one that isn't), cuDNN without autotuning, and
cuBLAS with a fixed workspace (CUBLAS_WORKSPACE_CONFIG, read when cuBLAS starts, so it is set
before the first CUDA matrix product). featurecache's Triton kernels follow the same switch:
EvoAttention's fastest backward on the H200 adds dQ and dBias with fp32 atomics, and it takes
its split backward (the bias gradient summed over rows in order, no atomics) whenever
torch.are_deterministic_algorithms_enabled(); every other kernel sums in a fixed order always.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

CUBLAS_WORKSPACE = ":4096:8"


@contextlib.contextmanager
def deterministic_mode(enabled: bool) -> Iterator[None]:
    """Within the block, deterministic algorithms if `enabled`; the process's settings are put
    back afterwards (a test or notebook that trains twice gets its own settings back)."""
    if not enabled:
        yield
        return
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
        if before[4] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
