"""An exponential moving average of the model's weights (AF3 keeps one with decay 0.999).

After every optimizer step, each averaged tensor moves towards its parameter:

    ema <- decay * ema + (1 - decay) * parameter

The average starts as a copy of the initial weights. The update is one in-place foreach
operation over all tensors, with no host synchronization and no new allocations, so it can
run inside a captured CUDA-graph step (the averaged tensors are allocated once, before
capture) or right after an eager one. Buffers (not trained) are not averaged: the averaged
model takes them from the live model.
"""

from __future__ import annotations

import torch
from torch import nn


class WeightAverage:
    """The EMA of `model`'s floating-point parameters, in fp32 whatever the parameters' dtype."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.names = [name for name, parameter in model.named_parameters() if parameter.is_floating_point()]
        parameters = dict(model.named_parameters())
        self.parameters = [parameters[name] for name in self.names]
        self.averages = [parameter.detach().float().clone() for parameter in self.parameters]

    @torch.no_grad()
    def update(self) -> None:
        """One EMA step: averages += (1 - decay) * (parameters - averages), in place."""
        current = [parameter.detach().float() for parameter in self.parameters]
        torch._foreach_lerp_(self.averages, current, 1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The averaged parameters by name (CPU copies), for checkpoints."""
        return {name: average.detach().cpu().clone() for name, average in zip(self.names, self.averages)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = sorted(set(self.names) - set(state))
        if missing:
            raise KeyError(f"the checkpoint's EMA weights lack {len(missing)} parameters, e.g. {missing[0]}")
        with torch.no_grad():
            for name, average in zip(self.names, self.averages):
                average.copy_(state[name])

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """`model`'s state_dict with every averaged parameter in place of the live one (for
        `predict`, and for validation): load it into a model of the same config."""
        state = {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}
        for name, average in zip(self.names, self.averages):
            state[name] = average.detach().to(state[name].dtype).cpu().clone()
        return state

    @torch.no_grad()
    def swap(self) -> None:
        """Exchange the live parameters and the averages (call twice to undo): validation runs
        the averaged weights in the live model without a second copy of it."""
        for parameter, average in zip(self.parameters, self.averages):
            live = parameter.detach().float().clone()
            parameter.copy_(average)
            average.copy_(live)
