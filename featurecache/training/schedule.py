"""The learning-rate schedule: linear warmup to the peak, and its CUDA-graph form."""

from __future__ import annotations

from typing import Callable

import torch


def warmup_schedule(warmup: int) -> Callable[[int], float]:
    """LambdaLR's factor: rises linearly to 1 over `warmup` steps, then stays (AF3's warmup)."""
    return lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


class GraphLearningRate:
    """The learning rate of a CUDA-graph run, kept in one GPU tensor that the captured AdamW
    step reads: the scheduler computes each step's value, this writes it into the tensor (a
    float would be frozen into the graph at capture)."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.optimizer = optimizer
        self.value = torch.tensor(float(optimizer.param_groups[0]["lr"]), device=device)
        self.set(float(optimizer.param_groups[0]["lr"]))

    def set(self, lr: float) -> None:
        # LR schedulers of some torch versions assign a float to group["lr"], newer ones fill
        # the tensor in place: either way the group reads the tensor again afterwards.
        self.value.fill_(float(lr))
        for group in self.optimizer.param_groups:
            group["lr"] = self.value
