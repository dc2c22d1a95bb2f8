"""The on-device checks benchmarks/train_step.py --model af3 runs before timing: every parameter
gets a gradient, and the triton and torch paths give the same fp32 loss from the same weights."""

from __future__ import annotations

import harness  # noqa: F401  (puts the repository root on sys.path, for featurecache)
import torch
from step_timing import autocast, free_memory

from featurecache.model import AF3Model, preset
from featurecache.testing.synthetic import random_batch


def full_model_checks(
    config_overrides: dict, device: torch.device, length: int, diffusion_batch: int, atoms_per_token: int
) -> dict:
    """On the device, before timing: (1) one bf16 step of the triton model leaves no parameter
    without a gradient (None or all zero); (2) from the same weights, batch and random draws, the
    triton and torch paths give the same fp32 loss terms (relative difference per term)."""
    torch.manual_seed(0)
    models = {
        kernels: AF3Model(preset("af3", kernels=kernels, **config_overrides)).to(device)
        for kernels in ("triton", "torch")
    }
    models["torch"].load_state_dict(models["triton"].state_dict())
    generator = torch.Generator().manual_seed(length)
    batch = random_batch([length], [64], [2], generator, num_atoms_per_token=atoms_per_token)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    model = models["triton"]
    with autocast(device):
        outputs = model(
            batch, num_cycles=2, diffusion_batch=diffusion_batch, generator=torch.Generator(device).manual_seed(1)
        )
    loss, _ = model.loss(batch, outputs)
    loss.backward()
    dead = [
        name
        for name, p in model.named_parameters()
        if p.requires_grad and (p.grad is None or not bool(p.grad.abs().sum() > 0))
    ]
    terms = {}
    for kernels, model in models.items():
        model.zero_grad(set_to_none=True)
        outputs = model(
            batch, num_cycles=1, diffusion_batch=diffusion_batch, generator=torch.Generator(device).manual_seed(2)
        )
        _, metrics = model.loss(batch, outputs)
        terms[kernels] = {name: float(value) for name, value in metrics.items()}
    differences = {
        name: abs(terms["triton"][name] - terms["torch"][name]) / max(abs(terms["torch"][name]), 1e-12)
        for name in terms["torch"]
    }
    del models, outputs, loss
    free_memory()
    return {
        "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "dead_parameters": dead,
        "loss_fp32": terms,
        "relative_difference": differences,
        "max_relative_difference": max(differences.values()),
    }
