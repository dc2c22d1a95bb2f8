"""AF3's training recipe: optimizer settings and schedule, EMA, gradient accumulation, validation
with lDDT, resume on another number of ranks, deterministic mode (CPU, tiny preset, real cache)."""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from featurecache.loader import CacheDataset, collate
from featurecache.training import TrainConfig, train
from featurecache.training.ema import WeightAverage
from featurecache.training.schedule import lr_factor
from featurecache.training.validation import LDDT_KEYS, VALIDATION_KEYS
from tests.training.conftest import read_log, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: see tests/conftest.py


def test_defaults_are_af3s_recipe():
    config = TrainConfig(cache="c")
    assert (config.lr, config.adam_beta1, config.adam_beta2, config.adam_eps) == (1.8e-3, 0.9, 0.95, 1e-8)
    assert (config.warmup, config.lr_decay_factor, config.lr_decay_every) == (1000, 0.95, 50_000)
    assert (config.grad_clip, config.ema_decay, config.weight_decay) == (10.0, 0.999, 0.0)


def test_schedule_warms_up_linearly_then_decays_by_0_95_every_50k_steps():
    factor = lr_factor(1000, 0.95, 50_000)
    assert [factor(step) for step in (0, 499, 998, 999)] == [1 / 1000, 500 / 1000, 999 / 1000, 1.0]
    assert factor(1000) == 1.0 and factor(50_999) == 1.0
    assert factor(51_000) == pytest.approx(0.95) and factor(100_999) == pytest.approx(0.95)
    assert factor(101_000) == pytest.approx(0.95**2) and factor(1_001_000) == pytest.approx(0.95**20)
    assert lr_factor(0)(0) == 1.0  # no warm-up: the peak from the first step


def test_ema_follows_its_formula_and_swaps_in_place():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    average = WeightAverage(model, decay=0.9)
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    for _ in range(5):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        average.update()
        for name, p in model.named_parameters():
            expected[name] = 0.9 * expected[name] + 0.1 * p.detach()
    state = average.state_dict()
    for name in expected:
        torch.testing.assert_close(state[name], expected[name], rtol=1e-6, atol=1e-7)
    live = {name: p.detach().clone() for name, p in model.named_parameters()}
    average.swap()
    assert all(torch.equal(p, state[name]) for name, p in model.named_parameters())
    average.swap()
    assert all(torch.equal(p, live[name]) for name, p in model.named_parameters())


def test_two_accumulated_micro_batches_give_the_step_of_their_mean_loss(recipe_cache, tmp_path):
    """--accumulate 2: the update of the mean loss of both micro-batches (each with its own
    draws), clipped and applied once, written here without the Trainer."""
    from featurecache.training.distributed import setup_distributed
    from featurecache.training.loop import Trainer, noise_generator

    config = tiny_config(recipe_cache, tmp_path / "run", accumulate=2, grad_clip=1e-3)  # the clip acts
    dataset = CacheDataset(recipe_cache, config.sample)
    batches = [collate([dataset[(0, index)]]) for index in (0, 1)]
    world = setup_distributed("cpu")
    torch.manual_seed(0)
    trainer = Trainer(config, "torch", world)
    trainer.start()
    torch.manual_seed(0)
    reference = Trainer(dataclasses.replace(config, accumulate=1), "torch", world)
    result, cycles = trainer.step(batches, 0)

    model = reference.model
    losses = []
    for slot, batch in enumerate(batches):
        outputs = model(
            batch,
            num_cycles=cycles,
            diffusion_batch=1,
            generator=noise_generator(config.sample.seed, 0, slot, world.device),
        )
        losses.append(model.loss(batch, outputs)[0])
    (sum(losses) / 2).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    reference.optimizer.step()
    assert result["loss"].item() == pytest.approx((sum(losses) / 2).item(), rel=1e-6)
    assert result["grad_norm"].item() == pytest.approx(norm.item(), rel=1e-5)
    for (name, mine), ref in zip(trainer.model.named_parameters(), model.parameters()):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-7, msg=name)


def test_validation_lines_report_lddt_on_held_out_keys(recipe_cache, tmp_path):
    held_out = "209d-assembly1"  # DNA and a peptide
    config = tiny_config(
        recipe_cache,
        tmp_path / "run",
        steps=2,
        validate_every=1,
        validation_keys=(held_out,),
        validation_sampler_steps=2,
    )
    records = train(config)
    assert all(held_out not in ids for record in records for ids in record["ids"])  # never trained on
    logged = read_log(tmp_path / "run")
    # one pass before the first step (the untrained weights: the curve's start), then one per step
    assert [record["kind"] for record in logged] == ["validation"] + ["train", "validation"] * 2
    assert [record["step"] for record in logged if record["kind"] == "validation"] == [0, 1, 2]
    for validation in logged[0::2]:
        assert set(VALIDATION_KEYS) <= validation.keys()
        assert {"loss", "distogram", "diffusion", "mse", "smooth_lddt"} <= validation.keys()
        assert validation["targets"] == [held_out] and validation["weights"] == "ema"
        assert 0.0 <= validation["lddt"] <= 1.0 and validation["loss"] > 0
        assert validation["lddt_dna"] is not None and validation["lddt_protein"] is not None
        assert validation["lddt_rna"] is None and validation["lddt_ligand"] is None
    # the same crops and draws at every pass: only the weights move the numbers
    assert all(logged[0]["lddt"] != later["lddt"] or logged[0]["loss"] != later["loss"] for later in logged[2::2])
    assert set(LDDT_KEYS) <= logged[0].keys()
    # a resumed run starts from trained weights: no second step-0 pass, the next one at step 3
    train(dataclasses.replace(config, steps=3, resume=str(tmp_path / "run")))
    resumed = read_log(tmp_path / "run")[len(logged) :]
    assert [(record["kind"], record["step"]) for record in resumed] == [("train", 3), ("validation", 3)]


def test_validation_settings_are_checked(recipe_cache, tmp_path):
    with pytest.raises(ValueError, match="--validate-every needs held-out targets"):
        tiny_config(recipe_cache, tmp_path, validate_every=5)
    with pytest.raises(ValueError, match="not both"):
        tiny_config(recipe_cache, tmp_path, validation_keys=("a",), validation_fraction=0.1)
    with pytest.raises(ValueError, match="--validation-keys: not in the cache"):
        train(tiny_config(recipe_cache, tmp_path / "run", validation_keys=("nope",), validate_every=1))
    assert not (tmp_path / "run").exists()
    # the command: keys by repeating the option or separated by commas; one line, exit 2
    from click.testing import CliRunner

    from featurecache.cli import cli

    result = CliRunner().invoke(
        cli,
        [
            "train",
            "--cache",
            str(recipe_cache),
            "--out",
            str(tmp_path / "run"),
            "--validate-every",
            "1",
            "--validation-keys",
            "nope,209d-assembly1",
            "--validation-keys",
            "also-not",
        ],
    )
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "--validation-keys: not in the cache" in result.output and "also-not nope" in result.output
    assert not (tmp_path / "run").exists()


def test_checkpoints_hold_the_ema_which_resume_restores_and_predict_loads(recipe_cache, tmp_path):
    from featurecache.prediction.run import load_model

    straight = train(tiny_config(recipe_cache, tmp_path / "straight", steps=3, checkpoint_every=1, ema_decay=0.5))
    resumed = train(
        tiny_config(
            recipe_cache,
            tmp_path / "resumed",
            steps=3,
            ema_decay=0.5,
            resume=str(tmp_path / "straight" / "checkpoint-00000002.pt"),
        )
    )
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight[2:]]
    first, last = (torch.load(tmp_path / "straight" / f"checkpoint-0000000{n}.pt", weights_only=False) for n in (2, 3))
    again = torch.load(tmp_path / "resumed" / "checkpoint-00000003.pt", weights_only=False)
    for name, average in last["ema"].items():
        assert torch.equal(again["ema"][name], average), name
        torch.testing.assert_close(average, 0.5 * first["ema"][name] + 0.5 * last["model"][name])
    model = load_model(tmp_path / "straight" / "checkpoint-00000003.pt", torch.device("cpu"), "torch")
    assert all(torch.equal(p, last["ema"][name]) for name, p in model.named_parameters())


def test_deterministic_runs_are_bitwise_identical(recipe_cache, tmp_path):
    runs = [
        train(tiny_config(recipe_cache, tmp_path / name, steps=3, deterministic=True)) for name in ("first", "second")
    ]
    assert not torch.are_deterministic_algorithms_enabled()  # the process's setting is put back
    assert [r["loss"] for r in runs[0]] == [r["loss"] for r in runs[1]]
    assert [r["grad_norm"] for r in runs[0]] == [r["grad_norm"] for r in runs[1]]
    states = [
        torch.load(tmp_path / name / "checkpoint-00000003.pt", weights_only=False) for name in ("first", "second")
    ]
    for part in ("model", "ema"):
        for name, value in states[0][part].items():
            assert torch.equal(value, states[1][part][name]), (part, name)
    other = train(
        tiny_config(
            recipe_cache,
            tmp_path / "other",
            steps=1,
            deterministic=True,
            sample=dataclasses.replace(tiny_config(recipe_cache, tmp_path).sample, seed=7),
        )
    )
    assert other[0]["loss"] != runs[0][0]["loss"]  # the seed matters


@pytest.mark.slow
def test_a_two_rank_checkpoint_resumes_on_one_rank(recipe_cache, tmp_path):
    """2 gloo processes, batch 1, train 2 steps; resumed on 1 process accumulating 2 micro-batches
    (the same global batch), steps 3-4 repeat those of a 1-process run with --accumulate 2 from
    the start: the same samples and draws per step (micro-batch slot g = micro-step * ranks + rank)."""
    common = [
        "--cache",
        str(recipe_cache),
        "--kernels",
        "torch",
        "--crop-size",
        "16",
        "--msa-rows-per-sample",
        "8",
        "--num-workers",
        "0",
        "--device",
        "cpu",
        "--diffusion-batch",
        "1",
        "--max-recycling-cycles",
        "1",
        "--warmup",
        "2",
        "--lr",
        "1e-3",
        "--checkpoint-every",
        "2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "featurecache.training",
        "--out",
        str(tmp_path / "two"),
        "--steps",
        "2",
        *common,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    two_ranks = read_log(tmp_path / "two")
    one_rank = train(tiny_config(recipe_cache, tmp_path / "one", steps=4, accumulate=2))
    resumed = train(
        tiny_config(
            recipe_cache,
            tmp_path / "resumed",
            steps=4,
            accumulate=2,
            resume=str(tmp_path / "two" / "checkpoint-00000002.pt"),
        )
    )
    # the same samples in every step: rank r of 2 took micro-batch r, as 1 rank's micro-step r
    assert [[ids for rank in r["ids"] for ids in rank] for r in two_ranks] == [r["ids"][0] for r in one_rank[:2]]
    assert [r["ids"] for r in resumed] == [r["ids"] for r in one_rank[2:]]
    for mine, ref in zip(two_ranks + resumed, one_rank):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=1e-5), mine["step"]
