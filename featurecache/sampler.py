"""AF3's weighted sampling of training examples (SI 2.5.1): chains and interfaces, not targets.

Every chain and every interface of the cache is one item with its eq. 1 weight from the
manifest's "sampling" table (precompute clusters and weighs them; format in store/manifest.py).
A draw picks an item with probability proportional to its weight and names its target and the
chains the crop centres on: one chain, or the two chains of an interface. A target without
sampling entries (a cache built with clustering off) is one item of the target's weight that
centres on nothing.

Draws are a pure function of (seed, epoch, position): epoch e draws `draws_per_epoch` items
from a generator seeded by (seed, e), and rank r of W takes positions r, r + W, r + 2W, ... of
that stream, so ranks see disjoint draws and a run resumes exactly from (epoch, draws taken),
which is all a checkpoint needs to hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

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
        if weights_array.size == 0 or not np.isfinite(weights_array).all() or (weights_array < 0).any() \
                or weights_array.sum() <= 0:
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


class WeightedSampler(torch.utils.data.Sampler):
    """Draws (chain or interface items, with replacement, by weight) for one rank, epoch after epoch.

    Each epoch has `draws_per_epoch` draws over all ranks (by default one per target, so an
    epoch is as long as a uniform pass); this rank gets every world_size-th one. Iteration starts
    at (start_epoch, start_draw: draws this rank already took in that epoch) and runs `epochs`
    epochs, or without end. Use with a DataLoader's `sampler=` (or batch it, as
    featurecache.training does); the dataset reads each Draw (CacheDataset.__getitem__).
    """

    def __init__(self, table: SamplingTable, seed: int, rank: int = 0, world_size: int = 1,
                 draws_per_epoch: int | None = None, start_epoch: int = 0, start_draw: int = 0,
                 epochs: int | None = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.table = table
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.draws_per_epoch = len(table.ids) if draws_per_epoch is None else draws_per_epoch
        if self.draws_per_epoch < 1:
            raise ValueError(f"draws_per_epoch must be at least 1, got {self.draws_per_epoch}")
        self.start_epoch = start_epoch
        self.start_draw = start_draw
        self.epochs = epochs

    @property
    def draws_per_rank(self) -> int:
        """Draws each rank takes per epoch (the epoch's draws, rounded up to a multiple of the ranks)."""
        return -(-self.draws_per_epoch // self.world_size)

    def epoch_draws(self, epoch: int) -> list[Draw]:
        """This rank's draws of one epoch, in order."""
        items = self.table.epoch_items(self.seed, epoch, self.draws_per_rank * self.world_size)
        positions = range(self.rank, items.size, self.world_size)
        return [Draw(epoch, position, int(self.table.targets[items[position]]),
                     self.table.focus_chains[items[position]]) for position in positions]

    def __iter__(self) -> Iterator[Draw]:
        epoch, first = self.start_epoch, self.start_draw
        while self.epochs is None or epoch < self.start_epoch + self.epochs:
            yield from self.epoch_draws(epoch)[first:]
            epoch, first = epoch + 1, 0

    def __len__(self) -> int:
        if self.epochs is None:
            raise TypeError("an endless WeightedSampler (epochs=None) has no length")
        return self.draws_per_rank * self.epochs - self.start_draw
