"""benchmarks/flops.py counts a training step's FLOPs per part on fake tensors: on the tiny
preset that count equals the count on real tensors, part by part, and the parts add up to
FlopCounterMode's total; benchmarks/records.py turns a count and a step time into the headline's
TFLOP/s and share of a Hopper GPU's bf16 rate."""

from __future__ import annotations

import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def benchmarks():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import flops
        import records
    finally:
        sys.path.remove(str(BENCHMARKS))
    return flops, records


def test_fake_counting_equals_real_counting_part_by_part(benchmarks):
    flops, _ = benchmarks
    from featurecache.model import preset

    config = preset("tiny", kernels="torch", confidence_rollout_steps=1)
    shape = flops.StepShape(crop=16, diffusion_batch=2, msa_rows=4, templates=1, atoms_per_token=3)
    real, fake = flops.count_step(config, shape, fake=False), flops.count_step(config, shape, fake=True)
    assert real == fake
    assert sum(real[part] for part in flops.PARTS) == real["total"]
    # every part the step runs has matrix products
    for part in (
        "trunk (Pairformer)",
        "MSA module",
        "templates",
        "diffusion transformer",
        "atom attention",
        "confidence head",
        "diffusion conditioning",
        "mini-rollout",
    ):
        assert real[part] > 0, part
    # a further recycling cycle is one more trunk forward: less than the whole step
    assert 0 < flops.count_cycle(config, shape) < real["total"]


def test_the_headline_divides_the_counted_flops_by_the_step_time(benchmarks):
    _, records = benchmarks
    rows = [
        {
            "benchmark": "flops",
            "metric": "TFLOP total",
            "date": "2026-12-05 00:00 UTC",
            "value": 100.0,
            "shape": "full AF3 depth 48, diffusion batch 48, crop 384",
        }
    ]
    counted = records.counted_step_tflop(rows)
    shape = "training iteration, full AF3 depth 48, diffusion batch 48, crop 384"
    assert records.achieved(shape, "iteration ms", 1000.0, "NVIDIA H200", counted) == "100.0 (12.7 %)"
    assert records.achieved(shape, "iteration ms", 500.0, "other GPU", counted) == "200.0"
    assert records.achieved(shape, "peak GB", 10.0, "NVIDIA H200", counted) == "–"
    assert (
        records.achieved("training iteration, af3 depth 8, crop 384", "iteration ms", 300.0, "NVIDIA H200", counted)
        == "–"
    )


def test_a_cache_step_is_counted_per_padded_shape_and_averaged(benchmarks, sample_cache):
    flops, _ = benchmarks
    counts, shapes = flops.count_cache_steps(str(sample_cache), crop=16, cycles=1, batches=3, preset_name="tiny")
    assert counts["total"] > 0 and "in 3 batches" in shapes
    assert abs(sum(counts[part] for part in flops.PARTS) - counts["total"]) <= 1e-6 * counts["total"]


def test_the_headline_divides_a_real_data_count_by_tiny_steps_time(benchmarks):
    flops, records = benchmarks
    label = flops.real_data_label("af3", 384, 48, 1)
    rows = [
        {"benchmark": "flops", "metric": "TFLOP total", "date": "2026-12-06 00:00 UTC", "value": 100.0, "shape": label}
    ]
    counted = records.counted_step_tflop(rows)
    # tiny_step's rows carry the same shape and how the step ran; its metric is in seconds
    assert (
        records.achieved(f"{label}, CUDA graphs", "step s", 1.25, "NVIDIA H100 80GB HBM3", counted) == "80.0 (10.1 %)"
    )
    assert records.achieved(f"{label}, eager", "step s", 0.5, "NVIDIA A100-SXM4-80GB", counted) == "200.0"
    assert records.achieved(f"{label}, CUDA graphs", "step CPU s", 1.25, "NVIDIA H200", counted) == "–"
