"""Data parallelism without DDP, as --cuda-graphs runs it (training/cuda_graph.py's GraphedUpdate,
training/distributed.py's GradientBuckets): checked on CPU ranks with gloo, where the same update
runs launched (manual_sync) instead of captured.

Two spawned gloo ranks train the tiny model a few steps on random batches, once through DDP and
once through the manual sync, each from different per-rank initial weights (rank 0's must win,
as DDP's broadcast makes them); one process accumulating every rank's micro-batches is the
reference. The step's micro-batch g (= micro-step x ranks + rank) has its own batch and its own
noise seed, so all three train on the same samples with the same draws.
"""

import copy
import gc
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from click.testing import CliRunner

from featurecache.testing.synthetic import random_batch
from featurecache.training import TrainConfig, train_command
from featurecache.training.distributed import Dist, GradientBuckets
from featurecache.training.loop import Trainer

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
WORLD = 2
SEED = 1000  # rank r initializes its weights from SEED + r; rank 0's are broadcast


def _config(accumulate: int) -> TrainConfig:
    # grad_clip small enough to act: a rank that clipped its own gradients would drift from the others.
    # adam_eps well above the gradients' summation error: Adam's update is then within lr / eps
    # times a gradient difference, so the weights of two summation orders (DDP's buckets, the
    # manual sync, one process) stay as close as their gradients. With AF3's 1e-8 an element whose
    # gradient is near zero turns a rounding difference into up to a whole lr-sized step.
    return TrainConfig(
        cache="unused",
        preset="tiny",
        kernels="torch",
        device="cpu",
        accumulate=accumulate,
        model_settings={"diffusion_batch": 1, "max_recycling_cycles": 1},
        warmup=1,
        lr=1e-3,
        grad_clip=0.05,
        ema_decay=0.5,
        adam_eps=1e-3,
    )


def _batch(step: int, slot: int) -> dict:
    """Micro-batch `slot` of step `step`: the same on any number of ranks."""
    generator = torch.Generator().manual_seed(100 * step + slot)
    return random_batch([12], [4], [1], generator)


def _train(world: Dist, accumulate: int, manual_sync: bool, slots_per_rank: int | None = None) -> dict:
    """STEPS steps on this rank's micro-batches; the weights and EMA afterwards."""
    torch.manual_seed(SEED + world.rank)
    trainer = Trainer(_config(accumulate), "torch", world, manual_sync=manual_sync)
    trainer.start()
    losses = []
    for step in range(STEPS):
        batches = [_batch(step, trainer.layout.slot(world.rank, micro)) for micro in range(accumulate)]
        result, _ = trainer.step(batches, step)
        losses.append(result["loss"].item())
    results = {
        "params": {name: p.detach().clone() for name, p in trainer.model.named_parameters()},
        "ema": trainer.average.state_dict(),
        "losses": losses,
    }
    # what the run's end leaves holding the process groups while the trainer is still referenced
    # (train() destroys them in that state): no DDP wrapper, cycle or not
    trainer.close()
    gc.collect()
    results["ddp_alive_after_close"] = sum(
        isinstance(obj, torch.nn.parallel.DistributedDataParallel) for obj in gc.get_objects()
    )
    return results


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        world = Dist(rank=rank, world_size=WORLD, device=torch.device("cpu"))
        results = {
            (way, accumulate): _train(world, accumulate, manual_sync=way == "manual")
            for way in ("ddp", "manual")
            for accumulate in (1, 2)
        }
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("ddp-graphs")
    mp.spawn(_worker, args=(_free_port(), str(out_dir)), nprocs=WORLD, join=True)
    return [torch.load(out_dir / f"rank{rank}.pt") for rank in range(WORLD)]


def _assert_close(mine: dict, reference: dict, what: str) -> None:
    for name, value in reference.items():
        torch.testing.assert_close(
            mine[name], value, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{what} {name}: {m}"
        )


@pytest.mark.parametrize("accumulate", [1, 2])
def test_manual_sync_trains_as_ddp_and_as_one_process(ranks, accumulate):
    manual, ddp = ranks[0][("manual", accumulate)], ranks[0][("ddp", accumulate)]
    _assert_close(manual["params"], ddp["params"], f"accumulate {accumulate}, manual sync vs DDP:")
    _assert_close(manual["ema"], ddp["ema"], f"accumulate {accumulate}, manual sync vs DDP, EMA:")
    assert manual["losses"] == pytest.approx(ddp["losses"], rel=1e-5)
    # one process accumulating the step's WORLD x accumulate micro-batches in slot order
    torch.set_num_threads(1)
    alone = _train(Dist(rank=0, world_size=1, device=torch.device("cpu")), WORLD * accumulate, manual_sync=False)
    _assert_close(manual["params"], alone["params"], f"accumulate {accumulate}, manual sync vs one process:")


def test_closing_the_trainer_frees_its_ddp_wrapper(ranks):
    # Trainer.close drops DDP (which holds the process groups and gloo's finished work) before
    # train() destroys the groups: freed at the interpreter's exit instead, a rank aborted once
    for rank in ranks:
        for (way, accumulate), result in rank.items():
            assert result["ddp_alive_after_close"] == 0, f"{way}, accumulate {accumulate}"


def test_ranks_stay_bitwise_identical_from_rank_0s_weights(ranks):
    torch.manual_seed(SEED)
    initial = {
        name: p.detach()
        for name, p in Trainer(_config(1), "torch", Dist(0, 1, torch.device("cpu"))).model.named_parameters()
    }
    torch.manual_seed(SEED + 1)
    other = Trainer(_config(1), "torch", Dist(0, 1, torch.device("cpu"))).model
    assert any(not torch.equal(initial[name], p.detach()) for name, p in other.named_parameters())  # differ at init
    for key in (("manual", 1), ("manual", 2)):
        first, second = ranks[0][key], ranks[1][key]
        for name, value in first["params"].items():
            assert torch.equal(value, second["params"][name]), f"{key}: {name} differs between the ranks"
        for name, value in first["ema"].items():
            assert torch.equal(value, second["ema"][name]), f"{key}: EMA of {name} differs between the ranks"
        trained = [name for name, value in first["params"].items() if not torch.equal(value, initial[name])]
        assert len(trained) > 100, f"{key}: only {len(trained)} parameters moved"


def test_gradient_buckets_hold_only_trainable_parameters_and_catch_a_zero_grad():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    model[1].bias.requires_grad_(False)  # frozen (like the PAE head while its loss weight is 0)
    reference = copy.deepcopy(model)
    buckets = GradientBuckets(model, Dist(0, 1, torch.device("cpu")), bucket_bytes=40)
    assert model[1].bias.grad is None
    assert [flat.numel() for flat in buckets.buffers] == [12, 3 + 6]  # a bucket closes once past 40 bytes
    inputs = torch.randn(5, 4)
    model(inputs).square().sum().backward()
    model(inputs).square().sum().backward()  # accumulates into the buffers
    reference(inputs).square().sum().backward()
    for (name, mine), expected in zip(model.named_parameters(), reference.parameters()):
        if expected.requires_grad:
            torch.testing.assert_close(mine.grad, 2 * expected.grad, msg=name)
    buckets.all_reduce()  # one rank: nothing to average, but the gradients are checked
    buckets.zero()
    assert not any(flat.any() for flat in buckets.buffers) and not model[0].weight.grad.any()
    torch.optim.SGD(model.parameters()).zero_grad(set_to_none=True)
    with pytest.raises(RuntimeError, match="zero_grad"):
        buckets.all_reduce()


def test_cuda_graph_option_combinations():
    runner = CliRunner()
    base = ["--cache", "unused", "--cuda-graphs", "--device", "auto"]
    result = runner.invoke(train_command, [*base, "--pair-shards", "2"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--cuda-graphs" in lines[0] and "--pair-shards" in lines[0], result.output
    # --accumulate is taken now; the config is made (the run would need CUDA)
    config = TrainConfig(cache="unused", cuda_graphs=True, accumulate=2)
    assert config.accumulate == 2 and config.fixed_shapes


def test_benchmark_script_runs_on_the_cpu(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OUT": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "ddp_graphs.py"), "--cpu", "--steps", "2", "--accumulate", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = result.stdout.strip().splitlines()
    assert "max abs param diff vs plain DDP | ranks identical" in result.stdout
    row = next(line for line in table if line.startswith("| manual"))
    assert "| yes |" in row, result.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_captured_ranks_stay_identical_on_one_gpu(tmp_path):
    """The benchmark on the GPU: two gloo ranks share it, the update is captured, ranks agree bitwise."""
    env = {**os.environ, "OUT": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "ddp_graphs.py"), "--steps", "6"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| CUDA graphs")]
    assert len(rows) == 1 and "not captured" not in rows[0] and "| yes |" in rows[0], result.stdout
    diff = float(rows[0].split("|")[2])
    assert diff < 1e-1, result.stdout  # bf16 roundings moved through 6 AdamW steps of lr 1e-3, not a divergence
