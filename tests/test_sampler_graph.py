"""The sampler's denoiser as a CUDA graph (prediction/sampler_graph.py, `predict --cuda-graphs`):
the sampler calls whatever AF3Model.sample's `wrap_denoiser` returns, and a graphed sampler draws
the eager sampler's structures."""

import pytest
import torch

from featurecache.model import AF3Model, preset
from featurecache.prediction.sampler_graph import WARMUP_STEPS, GraphedDenoiser
from featurecache.testing.synthetic import random_batch

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
STEPS, SAMPLES = 6, 2


def _model_and_batch(device: str, kernels: str = "torch") -> tuple[AF3Model, dict]:
    torch.manual_seed(0)
    model = AF3Model(preset("tiny", kernels=kernels)).to(device).eval()
    batch = random_batch([13], [5], [1], torch.Generator().manual_seed(1), num_atoms_per_token=3)
    return model, {
        name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in batch.items()
    }


def _sample(model: AF3Model, batch: dict, wrap=None) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        outputs = model.sample(
            batch, num_cycles=1, num_samples=SAMPLES, num_steps=STEPS, generator=generator, wrap_denoiser=wrap
        )
    return outputs["positions"]


def test_the_sampler_calls_the_wrapped_denoiser_at_every_step():
    model, batch = _model_and_batch("cpu")
    calls = []

    def wrap(denoise):
        def counted(noisy, sigma):
            calls.append((tuple(noisy.shape), tuple(sigma.shape)))
            return denoise(noisy, sigma)

        return counted

    eager = _sample(model, batch)
    wrapped = _sample(model, batch, wrap)
    atoms = batch["atom_pad_mask"].shape[1]
    assert calls == [((1, SAMPLES, atoms, 3), (1, SAMPLES))] * STEPS
    torch.testing.assert_close(wrapped, eager, rtol=0, atol=0)


def test_without_capture_the_graphed_denoiser_is_the_eager_one_and_owns_its_outputs():
    model, batch = _model_and_batch("cpu")
    made = []

    def wrap(denoise):
        made.append(GraphedDenoiser(denoise, capture=False))
        return made[-1]

    torch.testing.assert_close(_sample(model, batch, wrap), _sample(model, batch), rtol=0, atol=0)
    assert len(made) == 1 and not made[0].is_captured
    # each call's result is the caller's own tensor, not a buffer the next call overwrites
    noisy, sigma = torch.randn(1, 2, 4, 3), torch.ones(1, 2)
    denoiser = GraphedDenoiser(lambda x, s: x * s[..., None, None], capture=False)
    first = denoiser(noisy, sigma)
    second = denoiser(noisy * 2, sigma)
    assert torch.equal(first * 2, second) and first.data_ptr() != second.data_ptr()


@cuda_only
@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_a_graphed_sampler_draws_the_eager_samplers_structures(kernels):
    """Same weights, same generator: the graph replays the kernels the eager steps launch, on
    the static copies of the same inputs (fp32, so no autocast cache is involved)."""
    model, batch = _model_and_batch("cuda", kernels)
    made = []

    def wrap(denoise):
        made.append(GraphedDenoiser(denoise))
        return made[-1]

    eager = _sample(model, batch)
    graphed = _sample(model, batch, wrap)
    assert STEPS > WARMUP_STEPS and made[0].is_captured
    torch.testing.assert_close(graphed, eager, rtol=1e-5, atol=1e-4)


@cuda_only
def test_a_graphed_sampler_under_bf16_autocast_without_its_cache_matches_eager():
    model, batch = _model_and_batch("cuda", "triton")
    results = []
    for wrap in (None, GraphedDenoiser):
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            results.append(_sample(model, batch, wrap))
    # the same bf16 kernels on the same inputs: equal up to the order of atomics, if any
    torch.testing.assert_close(results[1], results[0], rtol=1e-3, atol=1e-2)
