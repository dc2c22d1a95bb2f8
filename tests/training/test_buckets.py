"""Atom padding buckets (training/buckets.py): the sizes chosen from a cache, collate's choice of
bucket per batch, and the graphed update with one backward step per bucket (capture=False on the
CPU) against the eager step."""

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from featurecache.config import SampleConfig
from featurecache.loader import CacheDataset, collate
from featurecache.sampler import EpochBatchSampler
from featurecache.testing.synthetic import random_batch
from featurecache.training import TrainConfig
from featurecache.training.buckets import atom_bucket_sizes, crop_atom_estimates, padding_buckets
from featurecache.training.data import make_loader
from featurecache.training.distributed import Dist
from featurecache.training.loop import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: see tests/conftest.py


def _padded_total(estimates: list[int], sizes: list[int]) -> int:
    return sum(min(size for size in sizes if size >= -(-atoms // 128) * 128) for atoms in estimates)


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_bucket_sizes_hold_every_estimate_and_pad_least(count):
    generator = torch.Generator().manual_seed(count)
    estimates = (torch.randint(100, 3000, (40,), generator=generator)).tolist()
    bound = 3200
    sizes = atom_bucket_sizes(estimates, bound, count)
    assert sizes == sorted(set(sizes)) and sizes[-1] == bound and len(sizes) <= count
    assert all(size % 128 == 0 for size in sizes)
    # optimal: no other choice of at most `count` sizes among the rounded estimates pads fewer atoms
    candidates = sorted({-(-atoms // 128) * 128 for atoms in estimates} - {bound})
    best = min(
        _padded_total(estimates, [*chosen, bound])
        for size in range(count)
        for chosen in itertools.combinations(candidates, size)
    )
    assert _padded_total(estimates, sizes) == best


def test_one_bucket_is_the_bound_and_few_distinct_crops_take_few_buckets():
    assert atom_bucket_sizes([3000] * 10 + [600] * 5, 6528, 1) == [6528]
    assert atom_bucket_sizes([3000] * 10 + [600] * 5, 6528, 8) == [640, 3072, 6528]  # no empty buckets
    assert atom_bucket_sizes([], 6528, 4) == [6528]
    assert atom_bucket_sizes([9000], 6528, 4) == [6528]  # an estimate past the bound takes the bound
    with pytest.raises(ValueError, match="at least 1"):
        atom_bucket_sizes([3000], 6528, 0)
    with pytest.raises(ValueError, match="--atom-buckets must be at least 1, got 0"):
        TrainConfig(cache="unused", atom_buckets=0)
    # a target within the crop is whole; a larger one its mean atoms per token times the crop, with headroom
    assert crop_atom_estimates([(84, 422), (547, 4209)], 384) == [422, 3251]


def _config(cache: Path, buckets: int, crop: int = 96, **changes) -> TrainConfig:
    return TrainConfig(
        cache=str(cache),
        out="unused",
        kernels="torch",
        device="cpu",
        num_workers=0,
        static_shapes=True,
        atom_buckets=buckets,
        sample=SampleConfig(crop_size=crop, msa_rows_per_sample=8),
        **changes,
    )


def test_every_batch_takes_the_smallest_bucket_that_holds_it(recipe_cache):
    """Crops of the three sample targets over several epochs: each batch's atom axis is one of the
    buckets, the smallest that holds its atoms and bonds, and more than one bucket is used."""
    config = _config(recipe_cache, buckets=4)
    dataset = CacheDataset(recipe_cache, config.sample)
    buckets = padding_buckets(config, dataset)
    single = padding_buckets(_config(recipe_cache, buckets=1), dataset)
    assert 1 < len(buckets) <= 4 and len(single) == 1
    assert buckets[-1] == single[0]  # the largest bucket is the one size of --atom-buckets 1
    assert [b["atom"] for b in buckets] == sorted({b["atom"] for b in buckets})
    assert all({**b, "atom": 0, "token_bond": 0} == {**single[0], "atom": 0, "token_bond": 0} for b in buckets)
    sampler = EpochBatchSampler(len(dataset), 2, 0, 1, 0, epochs=4)
    taken = set()
    for batch in make_loader(dataset, sampler, config, torch.device("cpu"), buckets):
        atoms = int(batch["atom_pad_mask"].sum(dim=1).max())
        bonds = int(batch["token_bond_mask"].sum(dim=1).max())
        bucket = next(b for b in buckets if b["atom"] >= atoms and b["token_bond"] >= bonds)
        assert batch["ref_pos"].shape[1] == bucket["atom"] and batch["token_bonds"].shape[1] == bucket["token_bond"]
        assert batch["restype"].shape[1] == bucket["token"]
        taken.add(bucket["atom"])
    assert len(taken) > 1, taken


def test_collate_names_what_no_bucket_holds(recipe_cache):
    dataset = CacheDataset(recipe_cache, SampleConfig(crop_size=96, msa_rows_per_sample=8))
    sample = dataset[0]
    atoms = sample["ref_pos"].shape[0]
    buckets = [{"atom": 128 * (atoms // 256)}, {"atom": 128 * (atoms // 128)}]  # both too small
    with pytest.raises(
        ValueError, match=rf"{sample['id']} has {atoms} along 'atom' .* fixed size {buckets[1]['atom']}"
    ):
        collate([sample], pad_to=buckets)
    with pytest.raises(ValueError, match="empty list of buckets"):
        collate([sample], pad_to=[])
    fits = [{"atom": atoms - 1}, {"atom": atoms}, {"atom": atoms + 128}]
    assert collate([sample], pad_to=fits)["ref_pos"].shape[1] == atoms


def _trainer(manual_sync: bool, accumulate: int = 1) -> Trainer:
    config = TrainConfig(
        accumulate=accumulate,
        cache="unused",
        preset="tiny",
        kernels="torch",
        device="cpu",
        model_settings={"diffusion_batch": 1, "max_recycling_cycles": 1},
        warmup=1,
        lr=1e-3,
    )
    torch.manual_seed(0)
    trainer = Trainer(config, "torch", Dist(0, 1, torch.device("cpu")), manual_sync=manual_sync)
    trainer.start()
    return trainer


def test_graphed_update_over_two_buckets_is_the_eager_step():
    """The graphed update (capture=False: its CPU path) on batches of two atom sizes keeps one
    backward step per shape, each counting its own warm-up, and trains as the eager loop does:
    the same losses, gradients and weights (one summation order, one process)."""
    # 2 and 3 atoms per token: two shapes of the atom axis, in an order that revisits both
    batches = [
        random_batch([12], [4], [1], torch.Generator().manual_seed(step), num_atoms_per_token=atoms)
        for step, atoms in enumerate([2, 3, 3, 2, 3])
    ]
    graphed, eager = _trainer(manual_sync=True), _trainer(manual_sync=False)
    for step, batch in enumerate(batches):
        mine, _ = graphed.step([batch], step)
        ref, _ = eager.step([batch], step)
        assert mine.keys() == ref.keys()
        for name in ref:
            torch.testing.assert_close(mine[name], ref[name], rtol=0, atol=0, msg=f"step {step} {name}")
        for (name, p), q in zip(graphed.model.named_parameters(), eager.model.parameters()):
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=f"step {step} grad {name}")
    steps = graphed.graphed.backward_steps
    assert len(steps) == 2
    assert sorted(step.steps_run for step in steps.values()) == [2, 3]
    shapes = {tuple(batch["ref_pos"].shape) for batch in batches}
    assert len(shapes) == 2 and {shape for key in steps for name, shape, _ in key if name == "ref_pos"} == shapes
    assert graphed.graphed.apply.steps_run == len(batches)
    for mine, ref in zip(graphed.model.parameters(), eager.model.parameters()):
        torch.testing.assert_close(mine, ref, rtol=0, atol=0)


def test_micro_batches_of_one_step_may_take_different_buckets():
    """--accumulate 2 with a step's two micro-batches in two buckets: each replays its own backward
    step into the same gradient buffers, and the update is the eager loop's."""
    batches = [
        [
            random_batch([12], [4], [1], torch.Generator().manual_seed(10 * step + micro), num_atoms_per_token=atoms)
            for micro, atoms in enumerate([2, 3])
        ]
        for step in range(2)
    ]
    graphed, eager = _trainer(manual_sync=True, accumulate=2), _trainer(manual_sync=False, accumulate=2)
    for step, micro_batches in enumerate(batches):
        mine, _ = graphed.step(micro_batches, step)
        ref, _ = eager.step(micro_batches, step)
        for name in ref:
            torch.testing.assert_close(mine[name], ref[name], rtol=0, atol=0, msg=f"step {step} {name}")
    assert sorted(step.steps_run for step in graphed.graphed.backward_steps.values()) == [2, 2]
    for mine, ref in zip(graphed.model.parameters(), eager.model.parameters()):
        torch.testing.assert_close(mine, ref, rtol=0, atol=0)


def test_benchmark_script_runs_on_the_cpu(recipe_cache, tmp_path):
    """benchmarks/atom_buckets.py --smoke: the command's runs with one size and with buckets, side by side."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OUT": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "atom_buckets.py"), "--cache", str(recipe_cache), "--smoke"]
        + ["--steps", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line.split("|") for line in result.stdout.splitlines() if line.startswith("| ")}
    one, four = rows["1"], rows["4"]
    assert int(one[2]) == 1 and int(four[2]) > 1  # buckets used
    assert float(four[7]) < float(one[7])  # padded atoms per step
