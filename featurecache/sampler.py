"""The order in which training visits its samples: one global order per epoch, split over ranks.

Each epoch is a sequence of samples, a pure function of (seed, epoch): AF3's weighted draws of
chains and interfaces (WeightedSampler, SI 2.5.1) or a shuffle of the targets (EpochBatchSampler,
for a cache without sampling weights). Every chain and every interface of the cache is one item
of a SamplingTable with its eq. 1 weight from the manifest's "sampling" table (precompute
clusters and weighs them; format in store/manifest.py); a draw picks an item with probability
proportional to its weight and names its target and the chains the crop centres on: one chain,
or the two chains of an interface. A target without sampling entries (a cache built with
clustering off) is one item of the target's weight that centres on nothing.

One rank split (StepLayout), for both: an optimizer step takes the next `global_batch` =
batch_size * accumulate * world_size samples of the epoch's sequence; micro-batch g of the step
(g = micro-step * world_size + rank) is the step's samples g * batch_size ... g * batch_size +
batch_size - 1, and its random draws are seeded by g too (featurecache.training.loop.noise_generator).
So a step trains on the same samples with the same noise on 2 ranks as on 1 rank accumulating 2
micro-batches: a run's place is (epoch, samples of the epoch taken over all ranks), independent of
the number of ranks, which is all a checkpoint holds and why a run resumes on any number of ranks.

An epoch has `samples_per_epoch` samples (by default one per target, so a weighted epoch is as
long as a uniform pass); an incomplete last step is dropped, so no step straddles two epochs.
The samplers yield micro-batches (lists) for a DataLoader's `batch_sampler=`; the dataset reads
each Draw (CacheDataset.__getitem__) or (epoch, index) pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch


class Draw(NamedTuple):
    """One sampled training example, as the dataset receives it."""

    epoch: int
    position: int  # draw number within the epoch over all ranks: seeds the sample's crop and MSA rows
    target: int  # index into the dataset's ids
    focus_chains: tuple[int, ...]  # asym_ids the crop centres on: a chain, an interface's two, or ()


@dataclass(frozen=True)
class SamplingTable:
    """Every item a draw can pick: its target (index into `ids`), its chains and its weight."""

    ids: tuple[str, ...]
    targets: np.ndarray  # [items] int64
    focus_chains: tuple[tuple[int, ...], ...]  # [items]
    weights: np.ndarray  # [items] float64

    @classmethod
    def from_targets(cls, ids: Sequence[str], targets: Mapping[str, Mapping[str, Any]]) -> SamplingTable:
        """Items of `ids` from manifest entries (Manifest.targets: "chains", "interfaces", "weight")."""
        item_targets, focus, weights = [], [], []
        for index, target_id in enumerate(ids):
            entry = targets[target_id]
            chains, interfaces = entry.get("chains"), entry.get("interfaces")
            if chains is None and interfaces is None:
                item_targets.append(index)
                focus.append(())
                weights.append(float(entry.get("weight", 1.0)))
                continue
            for chain in chains or ():
                item_targets.append(index)
                focus.append((int(chain["asym_id"]),))
                weights.append(float(chain["weight"]))
            for interface in interfaces or ():
                item_targets.append(index)
                focus.append(tuple(int(asym_id) for asym_id in interface["chains"]))
                weights.append(float(interface["weight"]))
        weights_array = np.asarray(weights, dtype=np.float64)
        if (
            weights_array.size == 0
            or not np.isfinite(weights_array).all()
            or (weights_array < 0).any()
            or weights_array.sum() <= 0
        ):
            raise ValueError(f"no positive sampling weights over {len(ids)} targets (weights must be finite and >= 0)")
        return cls(tuple(ids), np.asarray(item_targets, dtype=np.int64), tuple(focus), weights_array)

    def __len__(self) -> int:
        return self.weights.size

    @property
    def probabilities(self) -> np.ndarray:
        return self.weights / self.weights.sum()

    def epoch_items(self, seed: int, epoch: int, count: int) -> np.ndarray:
        """The items of one epoch's `count` draws over all ranks, in draw order."""
        generator = np.random.default_rng([seed, epoch])
        cumulative = np.cumsum(self.weights)
        # Inverse-CDF draws (what Generator.choice does with p=), without its renormalization check.
        picks = np.searchsorted(cumulative, generator.random(count) * cumulative[-1], side="right")
        return np.minimum(picks, len(self) - 1)


@dataclass(frozen=True)
class StepLayout:
    """How one optimizer step's samples are split over ranks and micro-steps."""

    batch_size: int = 1
    world_size: int = 1
    accumulate: int = 1

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size * self.accumulate

    def slot(self, rank: int, micro_step: int) -> int:
        """The step's micro-batch number g of this rank's micro-step."""
        return micro_step * self.world_size + rank

    def steps_per_epoch(self, samples_per_epoch: int, start_sample: int = 0) -> int:
        """Whole steps left in an epoch from `start_sample` on."""
        return max(0, (samples_per_epoch - start_sample) // self.global_batch)


class GlobalOrderSampler(torch.utils.data.Sampler):
    """This rank's micro-batches, step after step and epoch after epoch, from (start_epoch,
    start_sample); `epochs` epochs or without end. Subclasses give each epoch's order."""

    def __init__(
        self,
        samples_per_epoch: int,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        start_epoch: int = 0,
        start_sample: int = 0,
        epochs: int | None = None,
        accumulate: int = 1,
    ) -> None:
        if samples_per_epoch == 0:
            raise ValueError("the dataset is empty")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.samples_per_epoch = samples_per_epoch
        self.layout = StepLayout(batch_size, world_size, accumulate)
        self.rank = rank
        self.seed = seed
        self.start_epoch = start_epoch
        self.start_sample = start_sample
        self.epochs = epochs

    @property
    def steps_per_epoch(self) -> int:
        return self.layout.steps_per_epoch(self.samples_per_epoch)

    def epoch_order(self, epoch: int) -> list:
        raise NotImplementedError

    def __iter__(self) -> Iterator[list]:
        layout, batch = self.layout, self.layout.batch_size
        epoch, first = self.start_epoch, self.start_sample
        while self.epochs is None or epoch < self.start_epoch + self.epochs:
            order = self.epoch_order(epoch)
            for step in range(layout.steps_per_epoch(self.samples_per_epoch, first)):
                start = first + step * layout.global_batch
                for micro in range(layout.accumulate):
                    offset = start + layout.slot(self.rank, micro) * batch
                    yield order[offset : offset + batch]
            epoch, first = epoch + 1, 0


class EpochBatchSampler(GlobalOrderSampler):
    """Micro-batches of (epoch, index) pairs: each epoch a new shuffle of the targets, seeded by
    (seed, epoch). The epoch travels with each index, so the dataset's workers pick each epoch's
    crops without `set_epoch` and are started once per run, not once per epoch."""

    def epoch_order(self, epoch: int) -> list[tuple[int, int]]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return [(epoch, index) for index in torch.randperm(self.samples_per_epoch, generator=generator).tolist()]


class WeightedSampler(GlobalOrderSampler):
    """Micro-batches of weighted Draws (a chain or interface by its AF3 weight, with
    replacement): an epoch is the seeded stream of SamplingTable.epoch_items, `samples_per_epoch`
    long (None: one draw per target), each Draw's position (which seeds its crop) being its place
    in that stream."""

    def __init__(
        self,
        table: SamplingTable,
        batch_size: int = 1,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        start_epoch: int = 0,
        start_sample: int = 0,
        epochs: int | None = None,
        accumulate: int = 1,
        samples_per_epoch: int | None = None,
    ) -> None:
        super().__init__(
            len(table.ids) if samples_per_epoch is None else samples_per_epoch,
            batch_size,
            rank,
            world_size,
            seed,
            start_epoch,
            start_sample,
            epochs,
            accumulate,
        )
        self.table = table

    def epoch_order(self, epoch: int) -> list[Draw]:
        items = self.table.epoch_items(self.seed, epoch, self.samples_per_epoch)
        return [
            Draw(epoch, position, int(self.table.targets[item]), self.table.focus_chains[item])
            for position, item in enumerate(items.tolist())
        ]
