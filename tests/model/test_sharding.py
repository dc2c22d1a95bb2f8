"""Pair sharding (featurecache.model.parallel.sharding) on CPU ranks with gloo: a Pairformer stack and the
trunk on P = 2 and 4 ranks give P = 1's outputs and gradients, each rank's saved activations
shrink about 1/P, and a training step with --pair-shards 2 has the unsharded step's loss."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from featurecache.model import AF3Model, preset
from featurecache.model.network.pairformer import Pairformer
from featurecache.model.parallel.sharding import ShardedPairformer, reduce_gradients, shard_trunk
from featurecache.testing.synthetic import random_batch
from featurecache.training.config import TrainSetupError
from featurecache.training.distributed import all_ranks, mean_over_ranks, rank_layout, setup_distributed, shutdown
from tests.conftest import copy_sample_structures

LENGTH = 11  # not a multiple of 2 or 4: the sharded stack pads it
MEMORY_LENGTH = 32  # activations well above the parameter-sized tensors saved with them
PAIRFORMER = dict(
    num_blocks=2,
    c_s=16,
    c_z=16,
    single_heads=2,
    single_head_dim=8,
    pair_heads=2,
    pair_head_dim=8,
    transition_expansion=2,
    dropout=0.25,
)


# --------------------------------------------------------------------------------------------
# What each rank runs (module level: spawned processes import it)
# --------------------------------------------------------------------------------------------


class SavedBytes:
    """Bytes of the distinct tensors autograd saves for backward (parameters left out): the
    activation memory a backward pass holds."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.storages: dict[int, int] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.parameters:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def _pairformer_inputs(length: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    s = torch.randn(2, length, PAIRFORMER["c_s"], generator=generator)
    z = torch.randn(2, length, length, PAIRFORMER["c_z"], generator=generator)
    token_mask = torch.arange(length)[None, :] < torch.tensor([[length], [length - 3]])
    weights = (torch.randn(s.shape, generator=generator), torch.randn(z.shape, generator=generator))
    return s, z, token_mask, weights


def pairformer_case(kernels: str, checkpoint: bool, group, length: int = LENGTH, inputs_seed: int = 1) -> dict:
    """Outputs, input and parameter gradients and saved bytes of a 2-block Pairformer; sharded
    over `group`, or whole with group None."""
    torch.manual_seed(0)
    model = Pairformer(**PAIRFORMER, checkpoint_blocks=checkpoint, kernels=kernels).train()
    s, z, token_mask, (weight_s, weight_z) = _pairformer_inputs(length, torch.Generator().manual_seed(inputs_seed))
    s.requires_grad_(True)
    z.requires_grad_(True)
    run = model if group is None else ShardedPairformer(model, group)
    saved = SavedBytes(model)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda tensor: tensor):
        s_out, z_out = run(s, z, token_mask, token_mask[:, :, None] & token_mask[:, None, :])
    ((s_out * weight_s).sum() + (z_out * weight_z).sum()).backward()
    if group is not None:
        run.reduce_gradients()
    return {
        "s": s_out.detach(),
        "z": z_out.detach(),
        "ds": s.grad,
        "dz": z.grad,
        "saved_bytes": saved.total,
        "params": {name: p.grad for name, p in model.named_parameters() if p.grad is not None},
    }


def trunk_case(group) -> dict:
    """The tiny AF3 trunk on a synthetic batch (MSA, templates, padding), its MSA module and
    Pairformer sharded over `group` (or not): outputs and every parameter's gradient."""
    torch.manual_seed(0)
    model = AF3Model(preset("tiny", kernels="torch", msa_blocks=2)).train()  # the last skips the MSA updates
    if group is not None:
        shard_trunk(model, group)
    batch = random_batch([LENGTH, 8], [5, 3], [2, 0], torch.Generator().manual_seed(2))
    outputs = model(batch, num_cycles=1, diffusion_batch=0)  # the trunk alone, dropout from seed 0
    weight = torch.randn(outputs["single"].shape, generator=torch.Generator().manual_seed(3))
    (model.loss(batch, outputs)[0] + (outputs["single"] * weight).sum()).backward()
    if group is not None:
        reduce_gradients(model)
    return {
        "pair": outputs["pair"].detach(),
        "single": outputs["single"].detach(),
        "params": {name: p.grad for name, p in model.named_parameters() if p.grad is not None},
    }


def _worker(rank: int, world: int, port: int, out_dir: str, cases: list) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {}
        for name, kind, kwargs in cases:
            case = pairformer_case if kind == "pairformer" else trunk_case
            results[name] = case(**kwargs, group=dist.group.WORLD)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _replicas_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """A rank of a torchrun-like world of 2 replicas x 2 pair shards: each replica its own input."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    placed = setup_distributed("cpu", pair_shards=2)
    try:
        result = pairformer_case("torch", checkpoint=True, group=placed.shard_group, inputs_seed=1 + placed.rank)
        result["place"] = (placed.rank, placed.world_size, placed.shard_rank, placed.is_main)
        result["mean"] = mean_over_ranks(placed, torch.tensor([float(placed.rank)]))
        result["all"] = all_ranks(placed, placed.rank)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        shutdown(placed)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_sharded(world: int, cases: list, tmp_path: Path) -> list[dict]:
    """Every case on `world` spawned gloo ranks; each rank's results, in rank order."""
    mp.spawn(_worker, args=(world, _free_port(), str(tmp_path), cases), nprocs=world, join=True)
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(world)]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Equal to fp32 rounding: sums in another order differ by ~1e-6 of the tensor's largest value."""
    atol = 1e-5 * max(1.0, expected.abs().max().item())
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=atol, msg=lambda m: f"{what}: {m}")


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def references() -> dict:
    return {
        "pairformer": pairformer_case("torch", checkpoint=True, group=None),
        "pairformer_saved": pairformer_case("torch", checkpoint=False, group=None, length=MEMORY_LENGTH),
        "trunk": trunk_case(group=None),
    }


@pytest.mark.parametrize("shards", [2, 4])
def test_sharded_pairformer_and_trunk_match_one_rank(shards, references, tmp_path):
    cases = [
        ("pairformer", "pairformer", {"kernels": "torch", "checkpoint": True}),
        ("pairformer_saved", "pairformer", {"kernels": "torch", "checkpoint": False, "length": MEMORY_LENGTH}),
        ("trunk", "trunk", {}),
    ]
    ranks = run_sharded(shards, cases, tmp_path)
    for rank, results in enumerate(ranks):
        for name in ("pairformer", "pairformer_saved"):
            mine, reference = results[name], references[name]
            for key in ("s", "z", "ds", "dz"):
                assert_close(mine[key], reference[key], f"P={shards} rank {rank} {name} {key}")
            assert mine["params"].keys() == reference["params"].keys()
            for param, grad in reference["params"].items():
                assert_close(mine["params"][param], grad, f"P={shards} rank {rank} {name} grad of {param}")
        trunk, reference = results["trunk"], references["trunk"]
        assert_close(trunk["pair"], reference["pair"], f"P={shards} rank {rank} trunk pair")
        assert_close(trunk["single"], reference["single"], f"P={shards} rank {rank} trunk single")
        assert trunk["params"].keys() == reference["params"].keys()
        for param, grad in reference["params"].items():
            assert_close(trunk["params"][param], grad, f"P={shards} rank {rank} trunk grad of {param}")

    # activation memory: the bytes each rank saves for backward, against the whole stack's
    whole = references["pairformer_saved"]["saved_bytes"]
    per_rank = max(results["pairformer_saved"]["saved_bytes"] for results in ranks)
    print(
        f"\nsaved for backward, 2 blocks, L={MEMORY_LENGTH}, c_z={PAIRFORMER['c_z']}: P=1 {whole} B, "
        f"P={shards} {per_rank} B per rank ({per_rank / whole:.3f} of P=1, 1/P = {1 / shards:.3f})"
    )
    # What does not shrink: the triangle attentions' gathered bias ([L, L, heads] on every rank,
    # 2 of 16 channels here, 4 of 128 in AF3), the single track's gathered keys and values, and
    # the concatenated projection weights; a few percent of P=1's bytes at these widths.
    assert per_rank < whole * (1 / shards + 0.05)


@pytest.mark.slow
def test_sharded_pairformer_on_the_triton_kernels(tmp_path, monkeypatch):
    """The triton kernel switch under Triton's interpreter: P = 2 matches the unsharded stack."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    reference = pairformer_case("triton", checkpoint=True, group=None, length=7)  # interpreted: small
    (mine, _) = run_sharded(
        2, [("triton", "pairformer", {"kernels": "triton", "checkpoint": True, "length": 7})], tmp_path
    )
    mine = mine["triton"]
    for key in ("s", "z", "ds", "dz"):
        assert_close(mine[key], reference[key], f"triton P=2 {key}")
    for param, grad in reference["params"].items():
        assert_close(mine["params"][param], grad, f"triton P=2 grad of {param}")


def test_rank_layout_puts_a_samples_shards_on_neighbouring_ranks():
    # world 8 = 4 data-parallel replicas x 2 shards: shard groups of consecutive ranks (one
    # host's GPUs), data-parallel groups of the ranks holding the same rows
    shard_groups, data_groups = rank_layout(8, 2)
    assert shard_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert data_groups == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert rank_layout(4, 1) == ([[0], [1], [2], [3]], [[0, 1, 2, 3]])
    with pytest.raises(ValueError, match="--pair-shards 3"):
        rank_layout(4, 3)


def test_two_replicas_of_two_shards_each_compute_their_own_sample(tmp_path):
    mp.spawn(_replicas_worker, args=(4, _free_port(), str(tmp_path)), nprocs=4, join=True)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(4)]
    assert [r["place"] for r in ranks] == [(0, 2, 0, True), (0, 2, 1, False), (1, 2, 0, False), (1, 2, 1, False)]
    assert all(r["mean"].item() == 0.5 and r["all"] == [0, 1] for r in ranks)  # over the replicas
    for rank, result in enumerate(ranks):
        reference = pairformer_case("torch", checkpoint=True, group=None, inputs_seed=1 + rank // 2)
        for key in ("z", "dz", "ds"):
            assert_close(result[key], reference[key], f"rank {rank} {key}")
        for param, grad in reference["params"].items():
            assert_close(result["params"][param], grad, f"rank {rank} grad of {param}")


def test_pair_shards_that_do_not_divide_the_ranks_are_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(TrainSetupError, match="--pair-shards 3 does not divide the 2 ranks"):
        setup_distributed("cpu", pair_shards=3)


# --------------------------------------------------------------------------------------------
# One training step with --pair-shards 2
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory, shared_data) -> Path:
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    inputs = copy_sample_structures("209d-assembly1.cif", tmp_path_factory.mktemp("inputs"))
    cache_dir = tmp_path_factory.mktemp("cache") / "cache"
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


def _train(cache: Path, out: Path, processes: int, extra: list[str]) -> tuple[list[dict], str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
        if processes > 1
        else [sys.executable]
    )
    command = [
        *launcher,
        "-m",
        "featurecache.training",
        "--cache",
        str(cache),
        "--out",
        str(out),
        "--kernels",
        "torch",
        "--device",
        "cpu",
        "--steps",
        "2",
        "--crop-size",
        "24",
        "--msa-rows-per-sample",
        "8",
        "--num-workers",
        "0",
        "--checkpoint-every",
        "2",
        "--diffusion-batch",
        "2",
        *extra,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()], result.stdout


@pytest.mark.slow
def test_training_step_with_two_pair_shards_matches_one_rank(small_cache, tmp_path):
    whole, _ = _train(small_cache, tmp_path / "whole", 1, [])
    sharded, said = _train(small_cache, tmp_path / "sharded", 2, ["--pair-shards", "2"])
    assert "2 ranks, 1 data-parallel replica(s) x 2 pair shards" in said
    # one data-parallel replica of two shards: the same samples as one rank
    assert [r["ids"] for r in sharded] == [r["ids"] for r in whole] and sharded[0]["world_size"] == 1
    for mine, reference in zip(sharded, whole):
        for term in ("loss", "distogram", "diffusion"):
            assert mine[term] == pytest.approx(reference[term], rel=1e-4), (term, mine, reference)
        assert mine["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-3)
    # the sharded run's checkpoint is an ordinary AF3Model's
    state = torch.load(tmp_path / "sharded" / "checkpoint-00000002.pt", weights_only=False)
    AF3Model(preset("tiny", kernels="torch")).load_state_dict(state["model"])
