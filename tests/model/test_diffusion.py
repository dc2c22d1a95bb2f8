"""EDM preconditioning, noise, augmentation and AF3's sampler schedule against their formulas."""

import math

import pytest
import torch

from featurecache.model import preset
from featurecache.model.network.diffusion import FourierEmbedding, edm_preconditioning
from featurecache.model.network.diffusion_sampler import (
    centre_random_augmentation,
    noise_schedule,
    random_rotations,
    sample_diffusion,
    sample_noise_levels,
)


def test_edm_preconditioning_matches_its_formulas():
    sigma_data = 16.0
    c_skip, c_out, c_in, c_noise = edm_preconditioning(torch.tensor([16.0]), sigma_data)
    torch.testing.assert_close(c_skip, torch.tensor([0.5]))
    torch.testing.assert_close(c_out, torch.tensor([16.0 / math.sqrt(2)]))
    torch.testing.assert_close(c_in, torch.tensor([1 / (16.0 * math.sqrt(2))]))
    torch.testing.assert_close(c_noise, torch.tensor([0.0]))
    sigma = torch.tensor([0.5, 4.0, 160.0])
    c_skip, c_out, c_in, c_noise = edm_preconditioning(sigma, sigma_data)
    torch.testing.assert_close(c_skip, 256 / (256 + sigma**2))
    torch.testing.assert_close(c_out, sigma * 16 / (256 + sigma**2).sqrt())
    torch.testing.assert_close(c_in, 1 / (256 + sigma**2).sqrt())
    torch.testing.assert_close(c_noise, 0.25 * torch.log(sigma / 16))
    # EDM's design: unit-variance network input (data of variance sd^2 plus noise s^2)
    torch.testing.assert_close(c_in**2 * (sigma_data**2 + sigma**2), torch.ones(3))


def test_noise_schedule_ends_and_shape():
    schedule = noise_schedule(200)
    assert schedule.shape == (201,)
    torch.testing.assert_close(schedule[0], torch.tensor(16.0 * 160))
    torch.testing.assert_close(schedule[-1], torch.tensor(16.0 * 4e-4))
    assert (schedule[1:] < schedule[:-1]).all()
    middle = 16.0 * (160 ** (1 / 7) + 0.5 * (4e-4 ** (1 / 7) - 160 ** (1 / 7))) ** 7
    torch.testing.assert_close(schedule[100], torch.tensor(middle))
    with pytest.raises(ValueError, match="num_steps"):
        noise_schedule(0)


def test_sampler_steps_follow_afs_churn():
    """Each step denoises at t_hat = c_(tau-1) (1 + gamma), gamma = 0.8 while c_tau > 1, else 0."""
    config = preset("tiny")
    seen = []

    def denoise(noisy, sigma):
        seen.append(sigma[0, 0].item())
        return torch.zeros_like(noisy)

    positions = sample_diffusion(
        denoise,
        (1, 2, 5, 3),
        torch.ones(1, 5, dtype=torch.bool),
        config,
        num_steps=10,
        generator=torch.Generator().manual_seed(0),
    )
    assert positions.shape == (1, 2, 5, 3) and torch.isfinite(positions).all()
    schedule = noise_schedule(10).tolist()
    expected = [previous * (1.8 if level > 1.0 else 1.0) for previous, level in zip(schedule[:-1], schedule[1:])]
    assert seen == pytest.approx(expected, rel=1e-6)


def test_training_noise_is_log_normal_around_sigma_data():
    sigma = sample_noise_levels((20000,), preset("tiny"), torch.Generator().manual_seed(0))
    log_level = torch.log(sigma / 16.0)
    assert abs(log_level.mean().item() + 1.2) < 0.05
    assert abs(log_level.std().item() - 1.5) < 0.05


def test_augmentation_is_a_random_rigid_motion():
    generator = torch.Generator().manual_seed(2)
    rotations = random_rotations(64, generator)
    torch.testing.assert_close(
        rotations @ rotations.transpose(-1, -2), torch.eye(3).expand(64, 3, 3), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(torch.linalg.det(rotations), torch.ones(64), atol=1e-5, rtol=0)
    positions = torch.randn(1, 1, 9, 3, generator=generator).expand(1, 4, 9, 3) * 5 + 20
    mask = torch.ones(1, 9, dtype=torch.bool)
    moved = centre_random_augmentation(positions, mask, generator, translation_scale=0.0)
    torch.testing.assert_close(
        torch.cdist(moved[0], moved[0]), torch.cdist(positions[0], positions[0]), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(moved.mean(dim=2), torch.zeros(1, 4, 3), atol=1e-4, rtol=0)
    assert not torch.allclose(moved[0, 0], moved[0, 1], atol=1e-2)  # each copy its own rotation


def test_fourier_embedding_is_frozen_cosines():
    embedding = FourierEmbedding(8)
    assert not list(embedding.parameters())  # buffers: saved in checkpoints, never trained
    t = torch.tensor([0.3])
    torch.testing.assert_close(embedding(t)[0], torch.cos(2 * math.pi * (0.3 * embedding.weight + embedding.bias)))
