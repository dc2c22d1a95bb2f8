"""The learning-rate schedule (AF3 SI 5.4: linear warm-up, then a step decay) and its CUDA-graph form."""

from __future__ import annotations

from collections.abc import Callable

import torch


def lr_factor(warmup: int, decay_factor: float = 0.95, decay_every: int = 50_000) -> Callable[[int], float]:
    """LambdaLR's factor of the peak learning rate for optimizer step `step` (0-based).

    AF3: the rate rises linearly over the first `warmup` steps, (step + 1) / warmup, so the
    first step already moves; from step `warmup` on it is the peak times
    decay_factor ** ((step - warmup) // decay_every): 0.95 after 50,000 steps past the warm-up,
    0.95^2 after 100,000, and so on.
    """

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return decay_factor ** ((step - warmup) // decay_every)

    return factor


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
