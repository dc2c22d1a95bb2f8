"""Noise: the training noise levels (SI 3.7.1), random rigid augmentation (Algorithm 19) and AF3's
EDM sampler (Algorithm 18).

Symbols: c_tau (`schedule`, noise levels from sigma_data * 160 down to sigma_data * 4e-4),
gamma_0 / gamma_min (the stochastic churn and the level under which it stops), lambda
(`noise_scale`), eta (`step_scale`). Every random draw comes from the caller's generator.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from featurecache.kernels.weight_casts import cached_weight_casts
from featurecache.model.config import ModelConfig
from featurecache.model.network.rotations import quaternion_to_rotation


def standard_normal(shape, generator: torch.Generator | None, device, dtype=torch.float32) -> torch.Tensor:
    """N(0, 1) from `generator` on its own device, moved to `device` (a training loop may own a
    CPU generator for a CUDA model)."""
    if generator is None:
        return torch.randn(shape, device=device, dtype=dtype)
    value = torch.randn(shape, generator=generator, device=generator.device, dtype=dtype)
    return value if device is None else value.to(device)


def sample_noise_levels(
    shape, config: ModelConfig, generator: torch.Generator | None = None, device=None
) -> torch.Tensor:
    """Training noise levels: sigma = sigma_data * exp(-1.2 + 1.5 N(0, 1))."""
    normal = standard_normal(shape, generator, device)
    diffusion = config.diffusion
    return diffusion.sigma_data * torch.exp(diffusion.noise_log_mean + diffusion.noise_log_std * normal)


def noise_levels(
    num_steps: int, sigma_data: float = 16.0, sigma_max: float = 160.0, sigma_min: float = 4e-4, rho: float = 7.0
) -> list[float]:
    """The num_steps + 1 levels c_tau = sigma_data (smax^(1/p) + tau / T (smin^(1/p) - smax^(1/p)))^p,
    tau = 0..T, from sigma_data * sigma_max to sigma_data * sigma_min: computed in float64 on the
    host and rounded to float32 (the sampler's dtype). Python floats, so the sampler's loop reads
    no tensor back from a device (and runs on fake tensors, benchmarks/flops.py)."""
    if num_steps < 1:
        raise ValueError(f"noise_schedule: num_steps must be >= 1, got {num_steps}")
    fraction = np.arange(num_steps + 1, dtype=np.float64) / num_steps
    start, end = sigma_max ** (1 / rho), sigma_min ** (1 / rho)
    return (sigma_data * (start + fraction * (end - start)) ** rho).astype(np.float32).tolist()


def noise_schedule(
    num_steps: int,
    sigma_data: float = 16.0,
    sigma_max: float = 160.0,
    sigma_min: float = 4e-4,
    rho: float = 7.0,
    device=None,
) -> torch.Tensor:
    """noise_levels as a float32 tensor [num_steps + 1]."""
    return torch.tensor(
        noise_levels(num_steps, sigma_data, sigma_max, sigma_min, rho), dtype=torch.float32, device=device
    )


def random_rotations(count: int, generator: torch.Generator | None, device=None) -> torch.Tensor:
    """[count, 3, 3] rotations uniform on SO(3): the rotations of quaternions drawn from 4-d
    normals (uniform in direction)."""
    return quaternion_to_rotation(standard_normal((count, 4), generator, device))


def centre_random_augmentation(
    positions: torch.Tensor, atom_mask: torch.Tensor, generator: torch.Generator | None, translation_scale: float = 1.0
) -> torch.Tensor:
    """Algorithm 19: centre each sample on the mean of its `atom_mask` atoms, rotate it uniformly
    at random and translate it by translation_scale * N(0, I).

    positions [B, S, A, 3]; atom_mask [B, A] bool -> [B, S, A, 3].
    """
    batch_size, samples = positions.shape[:2]
    weights = atom_mask.to(positions.dtype)[:, None, :, None]
    centre = (positions * weights).sum(dim=2, keepdim=True) / weights.sum(dim=2, keepdim=True).clamp(min=1)
    rotation = random_rotations(batch_size * samples, generator, positions.device).view(batch_size, samples, 1, 3, 3)
    translation = translation_scale * standard_normal((batch_size, samples, 1, 3), generator, positions.device)
    moved = ((positions - centre).unsqueeze(-2) * rotation.to(positions.dtype)).sum(-1)  # R x
    return moved + translation.to(positions.dtype)


# The diffusion module with its context bound: denoise(x_noisy [B, S, A, 3], sigma [B, S]) -> D(x; sigma).
Denoiser = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def sample_diffusion(
    denoise: Denoiser,
    shape: tuple,
    atom_mask: torch.Tensor,
    config: ModelConfig,
    num_steps: int | None = None,
    generator: torch.Generator | None = None,
    device=None,
) -> torch.Tensor:
    """Algorithm 18, SampleDiffusion: from noise at c_0 down the schedule with AF3's churn,
    noise scale and step scale. `denoise(x_noisy [B, S, A, 3], sigma [B, S])` is the diffusion
    module with its context bound. shape = (B, S, A, 3); atom_mask [B, A] (centring)."""
    sampler = config.sampler
    steps = sampler.sampler_steps if num_steps is None else num_steps
    schedule = noise_levels(
        steps, config.diffusion.sigma_data, sampler.sampler_sigma_max, sampler.sampler_sigma_min, sampler.sampler_rho
    )
    translation = config.diffusion.augmentation_translation
    positions = schedule[0] * standard_normal(shape, generator, device)
    with cached_weight_casts():  # without gradient, the steps share the bf16 copies of the weights
        for previous, level in zip(schedule[:-1], schedule[1:]):
            positions = centre_random_augmentation(positions, atom_mask, generator, translation)
            gamma = sampler.sampler_gamma_0 if level > sampler.sampler_gamma_min else 0.0
            t_hat = previous * (gamma + 1)
            noise = (
                sampler.sampler_noise_scale
                * (t_hat**2 - previous**2) ** 0.5
                * standard_normal(shape, generator, device)
            )
            noisy = positions + noise
            denoised = denoise(noisy, torch.full(shape[:2], t_hat, device=noisy.device))
            direction = (noisy - denoised) / t_hat
            positions = noisy + sampler.sampler_step_scale * (level - t_hat) * direction
    return positions
