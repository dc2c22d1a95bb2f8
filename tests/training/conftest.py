"""Fixtures of the training-recipe tests: a real cache of three sample targets (built once)."""

import json
from pathlib import Path

import pytest

from featurecache.config import SampleConfig
from featurecache.training import TrainConfig
from tests.conftest import copy_sample_structures

# 209d: DNA and a peptide; 721p: Ras with its GNP ligand; 7a4d: a larger protein complex
STRUCTURES = ("209d-assembly1.cif", "721p-assembly1.cif", "7a4d-assembly1.cif")


@pytest.fixture(scope="session")
def recipe_cache(tmp_path_factory, shared_data) -> Path:
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    inputs = copy_sample_structures(STRUCTURES, tmp_path_factory.mktemp("recipe-inputs"))
    cache_dir = tmp_path_factory.mktemp("recipe-cache") / "cache"
    summary = precompute(
        PrecomputeOptions(
            inputs=[inputs],
            cache_dir=cache_dir,
            alignments_dir=shared_data / "alignments",
            template_dir=shared_data / "templates" / "mmcif",
            num_workers=1,
            progress=False,
            executor="inline",
        )
    )
    assert summary.failed == 0, summary.format()
    return cache_dir


def tiny_config(cache: Path, out: Path, **changes) -> TrainConfig:
    """The tiny preset on 16-token crops, on the CPU, one diffusion sample per step: seconds a step."""
    settings = dict(
        cache=str(cache),
        out=str(out),
        preset="tiny",
        kernels="torch",
        steps=2,
        num_workers=0,
        warmup=2,
        lr=1e-3,
        checkpoint_every=2,
        device="cpu",
        model_settings={"diffusion_batch": 1, "max_recycling_cycles": 1},
        sample=SampleConfig(crop_size=16, msa_rows_per_sample=8),
    )
    settings.update(changes)
    return TrainConfig(**settings)


def read_log(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
