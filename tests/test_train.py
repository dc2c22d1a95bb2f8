"""The training loop on a real cache built from ../shared/data (CPU, tiny preset)."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from featurecache.config import SampleConfig
from featurecache.loader import CacheDataset, collate
from featurecache.model import AF3Model, preset, sample_num_cycles
from featurecache.online import OnlineDataset
from featurecache.training import EpochBatchSampler, TrainConfig, train, train_command
from tests.conftest import copy_sample_structures

STRUCTURES = ("209d-assembly1.cif", "721p-assembly1.cif", "7a4d-assembly1.cif")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: see tests/conftest.py


@pytest.fixture(scope="module")
def raw_inputs(tmp_path_factory) -> Path:
    return copy_sample_structures(STRUCTURES, tmp_path_factory.mktemp("inputs"))


def _build_cache(inputs: Path, cache_dir: Path, shared_data: Path) -> Path:
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    summary = precompute(
        PrecomputeOptions(
            inputs=[inputs],
            cache_dir=cache_dir,
            alignments_dir=shared_data / "alignments",
            template_dir=shared_data / "templates" / "mmcif",
            num_workers=1,
            progress=False,
            executor="inline",  # Ray is tested with the workers; here it would only add start-up time
        )
    )
    assert summary.failed == 0, summary.format()
    return cache_dir


@pytest.fixture(scope="module")
def cache(tmp_path_factory, raw_inputs, shared_data) -> Path:
    return _build_cache(raw_inputs, tmp_path_factory.mktemp("cache") / "cache", shared_data)


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory, shared_data) -> Path:
    """Only the smallest target (79 tokens): a step at the default crop size takes a second on
    a CPU, where 7a4d's 549 tokens cropped to 384 take about a minute."""
    inputs = copy_sample_structures(STRUCTURES[0], tmp_path_factory.mktemp("small-inputs"))
    return _build_cache(inputs, tmp_path_factory.mktemp("small-cache") / "cache", shared_data)


def _config(cache: Path, out: Path, crop_size: int = 16, msa_rows_per_sample: int = 8, **changes) -> TrainConfig:
    settings = dict(
        cache=str(cache),
        out=str(out),
        preset="tiny",
        kernels="torch",
        steps=3,
        num_workers=0,
        warmup=2,
        lr=1e-3,
        checkpoint_every=2,
        device="cpu",
        sample=SampleConfig(crop_size=crop_size, msa_rows_per_sample=msa_rows_per_sample),
    )
    settings.update(changes)
    return TrainConfig(**settings)


def _log(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def test_batch_sampler_runs_on_across_epochs_from_a_resume_point():
    # 5 samples, 2 ranks, batches of 2: a step takes 4 of them, one full step per epoch
    ranks = [EpochBatchSampler(5, 2, rank, 2, seed=4, start_epoch=1) for rank in range(2)]
    assert ranks[0].steps_per_epoch == 1
    first = [next(iter(sampler)) for sampler in ranks]
    assert all(epoch == 1 for batch in first for epoch, _ in batch)
    assert len({i for batch in first for _, i in batch}) == 4 and len(first[0]) == 2
    # unbounded: epoch after epoch, each a new shuffle, no batch straddling two epochs; the
    # resume point counts samples (4: two batches of 2 taken)
    stream = iter(EpochBatchSampler(6, 2, 0, 1, seed=4, start_epoch=0, start_sample=4))
    batches = [next(stream) for _ in range(4)]
    assert [[e for e, _ in b] for b in batches] == [[0, 0], [1, 1], [1, 1], [1, 1]]
    assert sorted(i for b in batches[1:] for _, i in b) == list(range(6))
    assert len(list(EpochBatchSampler(6, 2, 0, 1, seed=4, epochs=2))) == 6


def test_a_step_takes_the_same_samples_on_any_number_of_ranks():
    """The global order: 2 ranks with batches of 2 take, step by step, what 1 rank takes with
    batches of 4, or accumulating 2 micro-batches of 2; micro-batch g of a step is the same
    samples in every layout (g = micro-step * ranks + rank)."""

    def steps(world_size: int, batch_size: int, accumulate: int, count: int = 4, **start) -> list[list[list]]:
        streams = [
            iter(EpochBatchSampler(10, batch_size, rank, world_size, seed=1, accumulate=accumulate, **start))
            for rank in range(world_size)
        ]
        taken = []
        for _ in range(count):
            micro = [[next(stream) for _ in range(accumulate)] for stream in streams]  # [rank][micro-step]
            taken.append([micro[g % world_size][g // world_size] for g in range(world_size * accumulate)])
        return taken

    two_ranks = steps(2, 2, 1)
    one_rank = steps(1, 2, 2)
    assert two_ranks == one_rank
    assert [[sample for micro in step for sample in micro] for step in two_ranks] == [
        step[0] for step in steps(1, 4, 1)
    ]
    assert [step[0][0][0] for step in two_ranks] == [0, 0, 1, 1]  # 10 samples: 2 whole steps of 4 per epoch
    # resuming mid-epoch on another layout continues the same order
    assert steps(1, 2, 2, count=3, start_sample=4) == two_ranks[1:]


def test_tiny_preset_trains_from_the_cache(cache, tmp_path):
    records = train(_config(cache, tmp_path / "run", num_workers=1))
    assert [r["step"] for r in records] == [1, 2, 3]
    logged = _log(tmp_path / "run")
    assert [r["loss"] for r in logged] == [r["loss"] for r in records]
    for record in logged:
        assert record["loss"] > 0 and record["step_time_s"] >= record["data_wait_s"] >= 0
        # the loss terms of AF3Model.loss, and N_cycle drawn from 1..4
        assert {"distogram", "diffusion", "mse", "smooth_lddt", "bond"} <= record.keys()
        assert record["loss"] == pytest.approx(
            0.03 * record["distogram"] + 4.0 * record["diffusion"] + 1e-4 * record.get("confidence", 0.0), rel=1e-5
        )
        assert record["num_cycles"] in (1, 2, 3, 4)
        assert record["peak_memory_gb"] > 0 and 0 < record["tokens"] <= 16
    # one epoch of three targets: every target once
    assert sorted(r["ids"][0][0] for r in logged) == sorted(Path(s).stem for s in STRUCTURES)
    # checkpoints at step 2 (checkpoint_every) and at the last step, the weights file for
    # predict, no partial files left
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "checkpoint-00000002.pt",
        "checkpoint-00000003.pt",
        "log.jsonl",
        "weights.pt",
    ]


@pytest.mark.parametrize("static_shapes", [False, True])
def test_resume_reproduces_the_next_losses(cache, tmp_path, static_shapes):
    # static shapes: the atom buckets (crop 16: 209d's crops take a smaller one than the others')
    straight = train(_config(cache, tmp_path / "straight", steps=5, static_shapes=static_shapes))
    # resume from step 2; steps 3-5 cross the end of the first epoch (3 targets, batch 1)
    resume = str(tmp_path / "straight" / "checkpoint-00000002.pt")
    resumed = train(_config(cache, tmp_path / "resumed", steps=5, resume=resume, static_shapes=static_shapes))
    assert [r["step"] for r in resumed] == [3, 4, 5]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight[2:]]
    assert [r["ids"] for r in resumed] == [r["ids"] for r in straight[2:]]
    assert [r["padded_atoms"] for r in resumed] == [r["padded_atoms"] for r in straight[2:]]
    if static_shapes:
        assert len({r["padded_atoms"] for r in straight}) > 1


def test_a_checkpoint_from_before_the_fidelity_settings_is_refused_in_one_line(cache, tmp_path):
    from featurecache.model.config import LEGACY_SETTINGS, saved_model_settings

    train(_config(cache, tmp_path / "old", steps=2))
    path = tmp_path / "old" / "checkpoint-00000002.pt"
    state = torch.load(path, weights_only=False)
    # as written before the settings existed, in the flat layout of then (its distogram edges
    # recorded: AF3's code's now)
    state["model_config"] = {
        name: value
        for name, value in saved_model_settings(state["model_config"]).items()
        if name not in LEGACY_SETTINGS or name.startswith("distogram")
    }
    torch.save(state, path)
    line = _error_line(
        _cli(
            [
                "train",
                "--cache",
                str(cache),
                "--out",
                str(tmp_path / "new"),
                "--resume",
                str(path),
                "--kernels",
                "torch",
                "--device",
                "cpu",
                "--preset",
                "tiny",
                *SMALL,
            ]
        )
    )
    assert f"--resume {path}" in line and "atom_key_adaln False there, True here" in line, line
    assert "distogram" not in line  # the edges it records are today's


def test_a_file_that_is_no_checkpoint_is_one_line_naming_it(cache, tmp_path):
    # a file that is no checkpoint: one line naming it, before the run directory is made
    garbled = tmp_path / "garbled.pt"
    for content in (b"", b"not a checkpoint", b"PK\x03\x04 zip?", b"\x80\x04K\x01."):
        garbled.write_bytes(content)
        line = _error_line(
            _cli(
                [
                    "train",
                    "--cache",
                    str(cache),
                    "--out",
                    str(tmp_path / "new"),
                    "--resume",
                    str(garbled),
                    "--kernels",
                    "torch",
                    "--device",
                    "cpu",
                    *SMALL,
                ]
            )
        )
        assert f"--resume {garbled}: not a" in line, line
    assert not (tmp_path / "new").exists()


def test_loss_falls_when_overfitting_one_real_example(cache):
    # fixed seeds (weights, crop): a test must give the same result on every run
    torch.manual_seed(0)
    dataset = CacheDataset(cache, crop_size=16, msa_rows_per_sample=8, seed=0)
    batch = collate([dataset[dataset.ids.index("721p-assembly1")]])
    model = AF3Model(preset("tiny", kernels="torch", checkpoint_blocks=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):  # the trunk alone: the distogram loss
        loss, _ = model.loss(batch, model(batch, num_cycles=1, diffusion_batch=0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_online_featurization_yields_the_cached_samples(cache, raw_inputs, shared_data):
    sample = SampleConfig(crop_size=16, msa_rows_per_sample=8, seed=3)
    cached = CacheDataset(cache, sample)
    online = OnlineDataset(raw_inputs, shared_data / "alignments", shared_data / "templates" / "mmcif", sample)
    assert online.ids == cached.ids
    index = online.ids.index("209d-assembly1")
    from_cache, from_files = cached[index], online[index]
    assert from_cache.keys() == from_files.keys()
    for name, value in from_cache.items():
        if isinstance(value, torch.Tensor):  # resolution is NaN for a structure without one
            torch.testing.assert_close(value, from_files[name], rtol=0, atol=0, equal_nan=True, msg=name)


def test_online_training_runs(raw_inputs, shared_data, tmp_path):
    records = train(
        TrainConfig(
            online=str(raw_inputs),
            alignments=str(shared_data / "alignments"),
            out=str(tmp_path / "online"),
            kernels="torch",
            steps=1,
            num_workers=0,
            device="cpu",
            sample=SampleConfig(crop_size=16, msa_rows_per_sample=8),
        )
    )
    assert len(records) == 1 and records[0]["data_wait_s"] > 0


def _cli(args: list[str], env: dict | None = None):
    """`featurecache ARGS` through the real command group (its error boundary included)."""
    from featurecache.cli import cli

    return CliRunner(env=env).invoke(cli, args)


def _error_line(result) -> str:
    """The one line a refused command prints, checked to be the only line and no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(lines) == 1, result.output
    return lines[0]


SMALL = ["--steps", "1", "--crop-size", "16", "--msa-rows-per-sample", "8", "--num-workers", "0"]


def test_command_line_errors_exit_2(tmp_path):
    runner = CliRunner()
    result = runner.invoke(train_command, ["--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "exactly one of --cache DIR or --online DIR" in result.output
    result = runner.invoke(train_command, ["--cache", str(tmp_path / "missing"), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "missing" in result.output


def test_a_folder_that_is_not_a_cache_is_one_line_naming_it(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    (garbled / "manifest.json").write_bytes(b'{"format": 1, \xff')
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"name": "someone else\'s index"}')
    a_file = tmp_path / "file.txt"
    a_file.write_text("not a folder")
    expected = {
        empty: "not a cache",
        garbled: "not valid JSON",
        foreign: "not a featurecache manifest",
        tmp_path / "missing": "does not exist",
        a_file: "is a file",
    }
    for folder, reason in expected.items():
        line = _error_line(_cli(["train", "--cache", str(folder), "--out", str(tmp_path / "run"), *SMALL]))
        assert str(folder) in line and reason in line, line
    assert not (tmp_path / "run").exists()  # refused before the run directory is made


def test_option_values_are_checked_before_anything_runs(tmp_path):
    for option, value in [
        ("--steps", "0"),
        ("--batch-size", "0"),
        ("--crop-size", "0"),
        ("--lr", "0"),
        ("--lr", "-1e-3"),
        ("--warmup", "-1"),
        ("--num-workers", "-1"),
        ("--checkpoint-every", "0"),
        ("--msa-rows-per-sample", "0"),
        ("--max-templates", "-1"),
        ("--spatial-crop-prob", "1.5"),
        ("--pairformer-blocks", "-2"),
        ("--steps", "many"),
        ("--max-recycling-cycles", "0"),
        ("--diffusion-batch", "0"),
        ("--kernels", "cuda"),
        ("--preset", "huge"),
        ("--accumulate", "0"),
        ("--ema-decay", "1"),
        ("--adam-beta2", "-0.1"),
        ("--lr-decay-factor", "0"),
        ("--lr-decay-every", "0"),
        ("--validation-fraction", "1"),
        ("--validate-every", "-1"),
        ("--grad-clip", "0"),
        ("--atom-buckets", "0"),
        ("--atom-buckets", "few"),
    ]:
        result = _cli(["train", "--cache", str(tmp_path), "--out", str(tmp_path / "run"), option, value])
        assert result.exit_code == 2 and option in result.output and "Traceback" not in result.output, (
            option,
            value,
            result.output,
        )
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_without_cuda_the_default_kernels_are_pytorch_and_cuda_settings_are_refused(cache, tmp_path):
    result = _cli(["train", "--cache", str(cache), "--out", str(tmp_path / "auto"), *SMALL])
    assert result.exit_code == 0, result.output
    assert "--kernels auto: torch" in result.output  # said once, in one line
    state = torch.load(tmp_path / "auto" / "checkpoint-00000001.pt", weights_only=False)
    assert state["model_config"]["runtime"]["kernels"] == "torch"
    # Triton on the CPU only under its interpreter; CUDA settings on a machine without CUDA
    no_interpreter = {"TRITON_INTERPRET": None}
    line = _error_line(
        _cli(
            [
                "train",
                "--cache",
                str(cache),
                "--out",
                str(tmp_path / "t"),
                "--kernels",
                "triton",
                "--device",
                "cpu",
                *SMALL,
            ],
            env=no_interpreter,
        )
    )
    assert "--kernels triton needs a CUDA device" in line
    line = _error_line(
        _cli(
            ["train", "--cache", str(cache), "--out", str(tmp_path / "t"), "--kernels", "triton", *SMALL],
            env=no_interpreter,
        )
    )
    assert "--kernels triton needs a CUDA device" in line
    line = _error_line(_cli(["train", "--cache", str(cache), "--out", str(tmp_path / "t"), "--device", "cuda", *SMALL]))
    assert "--device cuda: this machine has no CUDA device" in line
    line = _error_line(_cli(["train", "--cache", str(cache), "--out", str(tmp_path / "t"), "--device", "tpu", *SMALL]))
    assert "--device tpu" in line
    assert not (tmp_path / "t").exists()


def test_the_old_msa_rows_flag_still_works_and_names_the_new_one(cache, tmp_path):
    args = [
        "train",
        "--cache",
        str(cache),
        "--out",
        str(tmp_path / "old"),
        "--kernels",
        "torch",
        "--device",
        "cpu",
        "--steps",
        "1",
        "--crop-size",
        "16",
        "--num-workers",
        "0",
    ]
    with pytest.warns(DeprecationWarning, match="--msa-rows-per-sample"):
        result = _cli([*args, "--max-msa-rows", "8"])
    assert result.exit_code == 0, result.output
    assert "--max-msa-rows is deprecated: use --msa-rows-per-sample" in result.output
    state = torch.load(tmp_path / "old" / "checkpoint-00000001.pt", weights_only=False)
    assert state["train_config"]["sample"]["msa_rows_per_sample"] == 8
    with pytest.warns(DeprecationWarning):
        line = _error_line(_cli([*args, "--max-msa-rows", "8", "--msa-rows-per-sample", "8"]))
    assert "--msa-rows-per-sample only" in line


def _readme_cpu_training_command() -> list[str]:
    """The README's first `featurecache train` command (its CPU example), split into words."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    training = readme[readme.index("## Training") :]
    training = training[: training.index("\n## ", 1)]
    lines = [text for text in training.splitlines() if text.startswith("featurecache train ")]
    assert lines, "the README's Training section shows no `featurecache train` command"
    return lines[0].split("#")[0].split()


def test_the_readme_cpu_training_command_runs(small_cache, tmp_path):
    """The README's CPU command as written, except: at most 2 steps, this test's cache (a test
    must not write /tmp/fc-cache, which may be a user's), and the run folder under tmp_path."""
    args = _readme_cpu_training_command()
    assert "--device" not in args or args[args.index("--device") + 1] == "cpu"
    args[args.index("--steps") + 1] = str(min(2, int(args[args.index("--steps") + 1])))
    args[args.index("--cache") + 1] = str(small_cache)
    run_dir = tmp_path / Path(args[args.index("--out") + 1]).relative_to(
        "/" if Path(args[args.index("--out") + 1]).is_absolute() else "."
    )
    args[args.index("--out") + 1] = str(run_dir)
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert [r["step"] for r in _log(run_dir)] == list(range(1, int(args[args.index("--steps") + 1]) + 1))
    if "--kernels" not in args and not torch.cuda.is_available():
        assert "--kernels auto: torch" in result.stdout  # the default on a machine without CUDA, said once


@pytest.mark.slow
def test_ddp_two_processes_gloo(cache, tmp_path):
    """torchrun, 2 CPU processes, gloo: both ranks train, on different samples."""
    run_dir = tmp_path / "ddp"
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
        "--cache",
        str(cache),
        "--out",
        str(run_dir),
        "--kernels",
        "torch",
        "--steps",
        "2",
        "--crop-size",
        "16",
        "--msa-rows-per-sample",
        "8",
        "--num-workers",
        "0",
        "--device",
        "cpu",
        "--checkpoint-every",
        "2",
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    logged = _log(run_dir)
    assert [r["step"] for r in logged] == [1, 2]
    assert all(record["world_size"] == 2 and len(record["ids"]) == 2 for record in logged)
    # the cache weighs chains and interfaces: each rank takes its own draws (with replacement, so
    # both may draw one target in a step; test_sampler checks that the draws are disjoint)
    assert [record["ids"][0] for record in logged] != [record["ids"][1] for record in logged], logged
    state = torch.load(run_dir / "checkpoint-00000002.pt", weights_only=False)
    assert state["world_size"] == 2 and len(state["rng"]) == 2


def test_static_shapes_pad_every_batch_to_one_shape_and_keep_the_loss(cache, tmp_path):
    # crop 96: the smallest target (79 tokens) is padded along tokens too
    # --atom-buckets 1: one size for every batch
    config = _config(cache, tmp_path / "static", num_workers=0, static_shapes=True, crop_size=96, atom_buckets=1)
    dataset = CacheDataset(cache, config.sample)
    from featurecache.training.buckets import padding_buckets
    from featurecache.training.data import make_loader

    pad_to = padding_buckets(config, dataset)
    # templates: as many as the records hold, read from the manifest
    stored = max(dataset.load_arrays(target)[0]["template_restype"].shape[0] for target in dataset.ids)
    # atoms: no crop holds more than the largest target, rounded up to whole key windows of 128
    largest = max(dataset.load_arrays(target)[0]["ref_pos"].shape[0] for target in dataset.ids)
    atoms = min(96 * 24, -(-largest // 128) * 128)
    assert pad_to == [{"token": 96, "msa": 4 * 7 + 1, "template": stored, "atom": atoms, "token_bond": 96 * 3}]
    sampler = EpochBatchSampler(len(dataset), 1, 0, 1, 0, epochs=1)
    shapes = {
        (
            batch["restype"].shape,
            batch["msa"].shape,
            batch["template_restype"].shape,
            batch["ref_pos"].shape,
            batch["token_bonds"].shape,
        )
        for batch in make_loader(dataset, sampler, config, torch.device("cpu"), pad_to)
    }
    assert shapes == {((1, 96), (1, 4 * 7 + 1, 96), (1, stored, 96), (1, atoms, 3), (1, 96 * 3, 2))}
    # padding is masked everywhere: the same steps give the same losses (one diffusion sample:
    # then the real atoms' noise is, but for the last few atoms, the same draw padded or not)
    padded = train(dataclasses.replace(config, model_settings={"diffusion_batch": 1}))
    plain = train(
        _config(cache, tmp_path / "plain", num_workers=0, crop_size=96, model_settings={"diffusion_batch": 1})
    )
    assert [r["ids"] for r in padded] == [r["ids"] for r in plain]
    assert min(r["tokens"] for r in padded) < 96  # a padded batch was among them
    for mine, ref in zip(padded, plain):
        # The diffusion noise of the last few real atoms differs: torch's CPU randn fills a
        # tensor's last partial block of 16 values afresh, and the padded tensor's blocks end
        # elsewhere. So the losses agree closely, and after the first step AdamW's normalized
        # updates carry that difference into the weights.
        assert mine["loss"] == pytest.approx(ref["loss"], rel=2e-2), (mine["ids"], mine["loss"], ref["loss"])
    # the first step's trunk, from the same weights: padded and unpadded give one distogram loss
    assert padded[0]["distogram"] == pytest.approx(plain[0]["distogram"], rel=1e-4)


def test_static_shapes_give_a_cuda_graph_one_input_signature_while_msa_draws_change(cache, tmp_path):
    """What a captured step needs (training/cuda_graph.py refuses an input whose shape or dtype
    differs from the captured one): every tensor the graph reads (graph_inputs) has one shape and
    dtype in every batch, over targets of different MSA depths (209d's shallow MSAs, 721p's and
    7a4d's thousands of rows), epoch after epoch, while the per-cycle MSA rows (msa_cycle_rows into
    the batch's pool) differ from cycle to cycle: a replay reads each step's rows from its buffers."""
    from featurecache.training.buckets import padding_buckets
    from featurecache.training.data import make_loader
    from featurecache.training.loop import graph_inputs

    config = _config(cache, tmp_path / "static", num_workers=0, static_shapes=True, crop_size=32, atom_buckets=1)
    dataset = CacheDataset(cache, config.sample)
    pad_to = padding_buckets(config, dataset)
    sampler = EpochBatchSampler(len(dataset), 1, 0, 1, 0, epochs=2)
    batches = list(make_loader(dataset, sampler, config, torch.device("cpu"), pad_to))
    signatures = {
        tuple(sorted((name, tuple(value.shape), value.dtype) for name, value in graph_inputs(batch).items()))
        for batch in batches
    }
    assert len(signatures) == 1, signatures
    draws, pool = config.sample.msa_cycle_draws, config.sample.msa_pool_rows
    for batch in batches:
        cycle_rows = batch["msa_cycle_rows"][0]
        assert cycle_rows.shape == (draws, config.sample.msa_rows_per_sample)
        used = cycle_rows[cycle_rows >= 0]
        assert (cycle_rows >= -1).all() and (used < int(batch["msa_row_mask"][0].sum())).all() and used.max() < pool
        assert (cycle_rows[:, 0] == 0).all()  # the query first in every cycle
    # a deep MSA: each cycle its own rows, into the same shapes
    deep = [batch for batch in batches if batch["id"][0] != "209d-assembly1"]
    assert deep and all(len({tuple(rows.tolist()) for rows in batch["msa_cycle_rows"][0]}) == draws for batch in deep)


def test_static_shapes_on_targets_of_different_sizes_take_several_atom_buckets_and_train(cache, tmp_path):
    """The default --atom-buckets: the three targets' crops (whole DNA-peptide 209d, crops of Ras
    and of 7a4d) are padded to more than one atom size, each no larger than the one size of
    --atom-buckets 1, and the run trains as the unpadded run does (the padding is masked: losses
    within the tolerance of the one-size test above, for the same reason)."""
    from featurecache.training.buckets import padding_buckets

    settings = dict(crop_size=96, steps=3, model_settings={"diffusion_batch": 1})  # one epoch: each target once
    config = _config(cache, tmp_path / "buckets", static_shapes=True, **settings)
    dataset = CacheDataset(cache, config.sample)
    sizes = [bucket["atom"] for bucket in padding_buckets(config, dataset)]
    (single,) = padding_buckets(dataclasses.replace(config, atom_buckets=1), dataset)
    records = train(config)
    padded = [record["padded_atoms"] for record in records]
    assert set(padded) <= set(sizes) and len(set(padded)) > 1, (padded, sizes)
    assert max(sizes) == single["atom"] and min(padded) < single["atom"]
    assert all(0 < record["atoms"] <= record["padded_atoms"] for record in records)
    assert _log(tmp_path / "buckets")[-1]["padded_atoms"] == padded[-1]
    plain = train(_config(cache, tmp_path / "plain", **settings))
    assert [r["ids"] for r in records] == [r["ids"] for r in plain]
    for mine, ref in zip(records, plain):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=2e-2), (mine["ids"], mine["loss"], ref["loss"])
    assert records[0]["distogram"] == pytest.approx(plain[0]["distogram"], rel=1e-4)


def test_cuda_graph_options_are_checked(cache, tmp_path):
    with pytest.raises(ValueError, match="--cuda-graphs and --compile"):
        _config(cache, tmp_path / "run", cuda_graphs=True, compile=True)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        _config(cache, tmp_path / "run", cuda_graphs=True, device="cpu")
    assert _config(cache, tmp_path / "run", cuda_graphs=True, device="auto").fixed_shapes


def test_graph_learning_rate_follows_the_schedule_and_saves_as_a_float():
    """The tensor learning rate of CUDA-graph runs: same updates as a float one, float in checkpoints."""
    from featurecache.training.checkpoint import optimizer_state
    from featurecache.training.schedule import GraphLearningRate, lr_factor

    def run(tensor_lr: bool):
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 2)
        # foreach=False: the CPU stand-in for the capturable AdamW that accepts a tensor lr
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(4))
        graph_lr = GraphLearningRate(optimizer, torch.device("cpu")) if tensor_lr else None
        lrs = []
        for step in range(6):
            model(torch.full((3, 5), float(step))).square().sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            if graph_lr is not None:
                graph_lr.set(scheduler.get_last_lr()[0])
                assert optimizer.param_groups[0]["lr"] is graph_lr.value
            lrs.append(float(optimizer.param_groups[0]["lr"]))
        return model, optimizer, lrs

    plain_model, _, plain_lrs = run(False)
    graph_model, graph_optimizer, graph_lrs = run(True)
    assert graph_lrs == pytest.approx(plain_lrs) and graph_lrs[0] == pytest.approx(5e-3)
    for mine, ref in zip(graph_model.parameters(), plain_model.parameters()):
        torch.testing.assert_close(mine, ref)
    saved = optimizer_state(graph_optimizer)["param_groups"][0]["lr"]
    assert type(saved) is float and saved == pytest.approx(1e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph_training_matches_the_launched_loop_and_resumes_without_graphs(cache, tmp_path):
    settings = dict(kernels="triton", device="cuda", crop_size=96, steps=6, warmup=3, checkpoint_every=6)
    launched = train(_config(cache, tmp_path / "launched", static_shapes=True, **settings))
    graphed = train(_config(cache, tmp_path / "graphs", cuda_graphs=True, **settings))
    assert [r["ids"] for r in graphed] == [r["ids"] for r in launched]
    for mine, ref in zip(graphed, launched):  # steps 4-6 are replays
        assert mine["loss"] == pytest.approx(ref["loss"], rel=2e-3), mine["step"]
        assert mine["lr"] == pytest.approx(ref["lr"])
    resumed = train(
        _config(
            cache, tmp_path / "graphs", static_shapes=True, resume=str(tmp_path / "graphs"), **{**settings, "steps": 8}
        )
    )
    assert [r["step"] for r in resumed] == [7, 8]


def test_every_trainable_parameter_gets_a_gradient_in_one_loop_step(cache, tmp_path):
    """One step of the loop's Trainer (forward with recycling and the diffusion batch, loss,
    backward, clipping, AdamW) on a crop of Ras with its bonded GNP (token bonds, ligands) and of
    the DNA-peptide complex 209d. The template embedder is left out: no target in ../shared/data
    has both coordinates and template structures in the sample folder (a templated target without
    coordinates has no loss to carry a gradient); tests/model checks it on synthetic templates."""
    from featurecache.training.distributed import setup_distributed
    from featurecache.training.loop import Trainer, cycle_generator_of

    config = _config(cache, tmp_path / "run", crop_size=64, model_settings={"diffusion_batch": 3}, lr=1e-3)
    dataset = CacheDataset(cache, config.sample)
    ras, dna = dataset.ids.index("721p-assembly1"), dataset.ids.index("209d-assembly1")
    # the first epoch whose crop of Ras keeps a bonded ligand
    ras_crop = next(sample for epoch in range(30) for sample in [dataset[(epoch, ras)]] if len(sample["token_bonds"]))
    batch = collate([ras_crop, dataset[(0, dna)]])
    assert batch["token_bond_mask"].any() and batch["is_dna"].any() and batch["is_ligand"].any()
    world = setup_distributed("cpu")
    torch.manual_seed(0)
    trainer = Trainer(config, "torch", world)
    trainer.start()
    # a step that recycles: with one cycle the recycling LayerNorms see zeros (no weight gradient)
    step = next(step for step in range(20) if sample_num_cycles(cycle_generator_of(config.sample.seed, step), 4) > 1)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    result, num_cycles = trainer.step([batch], step)
    assert num_cycles > 1 and torch.isfinite(result["loss"])
    trainable = [
        (name, p)
        for name, p in trainer.model.named_parameters()
        if p.requires_grad and not name.startswith("template_embedder.")
    ]
    assert len(trainable) > 100
    # zero in exact arithmetic shows as float noise (~1e-11); real gradients are far larger
    dead = [name for name, p in trainable if p.grad is None or not p.grad.abs().max() > 1e-8]
    assert not dead, f"parameters without gradient: {dead}"
    assert all(not torch.equal(p, before[name]) for name, p in trainable)  # AdamW moved every one
