"""`featurecache convert` through the real command group, and what takes its output: `predict`
on a real cache (209d) and `train --init-from` (fine-tuning, then --resume of that run)."""

import dataclasses
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from featurecache.model.config import PROTENIX_SETTINGS, RUNTIME_SETTINGS, saved_model_settings
from featurecache.prediction.run import load_model
from featurecache.testing.protenix import protenix_model
from featurecache.training import TrainConfig, TrainSetupError, train
from tests.conftest import copy_sample_structures

TARGET = "209d-assembly1"


def _cli(args: list) -> object:
    from featurecache.cli import cli

    return CliRunner().invoke(cli, [str(arg) for arg in args])


def _error_line(result) -> str:
    """The one line a refused command prints (exit 2, no traceback)."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.fixture(scope="module")
def checkpoints(small_protenix, tmp_path_factory) -> dict[str, Path]:
    """The small Protenix model saved as Protenix's DDP runs save it ("module." names, with its
    step), and its conversion by the command."""
    model, _, _ = small_protenix
    folder = tmp_path_factory.mktemp("checkpoints")
    protenix = folder / "protenix.pt"
    torch.save({"model": {f"module.{name}": value for name, value in model.state_dict().items()}, "step": 3}, protenix)
    converted = folder / "converted.pt"
    result = _cli(["convert", protenix, converted, "--to", "featurecache"])
    assert result.exit_code == 0, result.output
    assert f"{converted}: featurecache checkpoint of a model with 2 Pairformer blocks" in result.output
    return {"protenix": protenix, "converted": converted}


def test_convert_writes_a_protenix_dialect_checkpoint_and_back_bit_for_bit(small_protenix, checkpoints, tmp_path):
    model, config, _ = small_protenix
    saved = torch.load(checkpoints["converted"], weights_only=False)
    assert saved["model_config"] == dataclasses.asdict(config)
    recorded = saved_model_settings(saved["model_config"])
    assert all(recorded[name] == value for name, value in PROTENIX_SETTINGS.items())
    back = tmp_path / "back.pt"
    result = _cli(["convert", checkpoints["converted"], back, "--to", "protenix"])
    assert result.exit_code == 0, result.output
    weights = torch.load(back, weights_only=True)["model"]
    original = model.state_dict()
    assert set(weights) == set(original) and all(torch.equal(weights[name], original[name]) for name in original)


def test_refusals_are_one_line(checkpoints, tmp_path):
    garbled = tmp_path / "garbled.pt"
    garbled.write_bytes(b"not a checkpoint")
    assert "garbled.pt: not a readable Protenix checkpoint" in _error_line(
        _cli(["convert", garbled, tmp_path / "out.pt", "--to", "featurecache"])
    )
    line = _error_line(_cli(["convert", checkpoints["converted"], tmp_path / "out.pt", "--to", "featurecache"]))
    assert "a featurecache checkpoint" in line and "--to protenix" in line
    line = _error_line(_cli(["convert", checkpoints["protenix"], tmp_path / "out.pt", "--to", "protenix"]))
    assert "not a featurecache checkpoint" in line and "--to featurecache" in line
    assert "does not exist" in _error_line(
        _cli(["convert", checkpoints["protenix"], tmp_path / "no" / "out.pt", "--to", "featurecache"])
    )
    assert "the same file as SOURCE" in _error_line(
        _cli(["convert", checkpoints["protenix"], checkpoints["protenix"], "--to", "featurecache"])
    )
    # a Protenix model with an input the map does not cover (an ESM embedding): named
    state = torch.load(checkpoints["protenix"], weights_only=True)
    state["model"]["module.input_embedder.linear_esm.weight"] = torch.zeros(97, 2560)
    esm = tmp_path / "esm.pt"
    torch.save(state, esm)
    line = _error_line(_cli(["convert", esm, tmp_path / "out.pt", "--to", "featurecache"]))
    assert f"{esm}: not a Protenix model the map covers: 1 unknown key(s) (input_embedder.linear_esm.weight)" in line
    assert not (tmp_path / "out.pt").exists()


@pytest.fixture(scope="module")
def cache(tmp_path_factory, shared_data) -> Path:
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    inputs = copy_sample_structures(f"{TARGET}.cif", tmp_path_factory.mktemp("inputs"))
    cache_dir = tmp_path_factory.mktemp("cache") / "cache"
    summary = precompute(
        PrecomputeOptions(
            inputs=[inputs],
            cache_dir=cache_dir,
            alignments_dir=shared_data / "alignments",
            num_workers=1,
            progress=False,
            executor="inline",
        )
    )
    assert summary.failed == 0, summary.format()
    return cache_dir


def test_predict_runs_a_converted_model_on_a_real_target(small_protenix, checkpoints, cache, tmp_path):
    _, config, state = small_protenix
    model = load_model(checkpoints["converted"], torch.device("cpu"), "torch")
    assert model.config == config.replace(kernels="torch", checkpoint_blocks=False)
    assert all(torch.equal(model.state_dict()[name], value) for name, value in state.items())
    out = tmp_path / "predictions"
    result = _cli(
        [
            "predict",
            "--cache",
            cache,
            TARGET,
            "--checkpoint",
            checkpoints["converted"],
            "--out",
            out,
            "--samples",
            "1",
            "--steps",
            "2",
            "--cycles",
            "1",
            "--kernels",
            "torch",
            "--device",
            "cpu",
        ]
    )
    assert result.exit_code == 0, result.output
    assert (out / TARGET / f"{TARGET}_model.cif").is_file()
    assert (out / TARGET / f"{TARGET}_summary_confidences.json").is_file()


def test_train_fine_tunes_a_converted_model_and_resumes(small_protenix, checkpoints, cache, tmp_path):
    _, config, state = small_protenix
    settings = dict(
        cache=str(cache),
        out=str(tmp_path / "run"),
        kernels="torch",
        steps=1,
        num_workers=0,
        device="cpu",
        warmup=1,
        lr=1e-4,
        checkpoint_every=1,
        model_settings={"diffusion_batch": 2},
        init_from=str(checkpoints["converted"]),
    )
    from featurecache.config import SampleConfig

    sample = SampleConfig(crop_size=32, msa_rows_per_sample=4, msa_cycle_draws=1)
    # the model is the checkpoint's: a setting of what the weights are is refused, by name
    with pytest.raises(TrainSetupError, match=r"\['pairformer_blocks'\] do not go with --init-from"):
        TrainConfig(**{**settings, "model_settings": {"pairformer_blocks": 1, "diffusion_batch": 2}}, sample=sample)
    first = train(TrainConfig(**settings, sample=sample))
    saved = torch.load(tmp_path / "run" / "checkpoint-00000001.pt", weights_only=False)
    # the checkpoint's model, with this run's diffusion batch (how it trains, not what the weights are)
    here = {
        name: value
        for name, value in saved_model_settings(saved["model_config"]).items()
        if name not in RUNTIME_SETTINGS
    }
    trained = config.replace(diffusion_batch=2)
    assert here == {name: value for name, value in trained.settings().items() if name not in RUNTIME_SETTINGS}
    assert set(saved["model"]) == set(state)
    changed = [name for name, value in state.items() if not torch.equal(saved["model"][name], value)]
    assert changed, "one step moved no weight"
    resumed = train(TrainConfig(**{**settings, "steps": 2, "resume": str(tmp_path / "run")}, sample=sample))
    assert [record["step"] for record in first] == [1] and [record["step"] for record in resumed] == [2]
    # the fine-tuned model, its EMA weights, converts back: what Protenix lacks stayed zero
    back = tmp_path / "protenix_finetuned.pt"
    result = _cli(["convert", tmp_path / "run" / "checkpoint-00000002.pt", back, "--to", "protenix"])
    assert result.exit_code == 0, result.output
    protenix = protenix_model(torch.Generator().manual_seed(2))
    protenix.load_state_dict(torch.load(back, weights_only=True)["model"], strict=True)


def test_init_from_refuses_what_is_no_featurecache_checkpoint(checkpoints, cache, tmp_path):
    line = _error_line(
        _cli(
            [
                "train",
                "--cache",
                cache,
                "--out",
                tmp_path / "run",
                "--init-from",
                checkpoints["protenix"],
                "--kernels",
                "torch",
                "--device",
                "cpu",
                "--steps",
                "1",
                "--num-workers",
                "0",
            ]
        )
    )
    assert f"--init-from {checkpoints['protenix']}: not a featurecache checkpoint" in line
    assert "featurecache convert" in line
    assert not (tmp_path / "run").exists()
