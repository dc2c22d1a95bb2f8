"""Validation during training: lDDT of predicted structures on held-out cache keys, and the loss.

Every `validate_every` steps each rank takes its share of the held-out targets (never sampled
for training), and for each one, with gradients off and the EMA weights in the model:
- the training loss and its terms, on the same diffusion batch a step would draw;
- one structure from AF3Model.sample with `validation_sampler_steps` sampler steps, scored
  by lDDT against the truth over all atoms and per molecule type (protein, DNA, RNA, ligand).
The main rank writes their means over targets as one JSON line, `"kind": "validation"`
(VALIDATION_KEYS lists the keys). Draws are seeded by (seed, target), so every validation pass
of a run sees the same crops and the same noise: its numbers move only with the weights.

lDDT is model/objectives/lddt.py's, over all atom pairs (l, m); the score of a molecule type counts the
pairs whose atom l has that type (m is any atom).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from featurecache.loader import collate
from featurecache.model import AF3Model
from featurecache.model.network.atoms import atom_flags
from featurecache.model.objectives.lddt import lddt
from featurecache.training.config import TrainConfig
from featurecache.training.distributed import Dist, all_ranks
from featurecache.training.ema import WeightAverage

MOLECULE_TYPES = ("protein", "dna", "rna", "ligand")
LDDT_KEYS = ("lddt", *(f"lddt_{kind}" for kind in MOLECULE_TYPES))
# Keys of a validation line besides the loss terms (AF3Model.loss's metrics: loss, distogram, ...).
VALIDATION_KEYS = ("kind", "step", "targets", "weights", *LDDT_KEYS)


def lddt_by_molecule_type(batch: dict, predicted: torch.Tensor) -> dict[str, float]:
    """lDDT of the first batch element's structures (mean over them) over all atoms and per
    molecule type; a type the target lacks is NaN."""
    resolved = (batch["atom_mask"] & batch["atom_pad_mask"])[0]
    atom_to_token = batch["atom_to_token"]
    kinds = {kind: atom_flags(batch[f"is_{kind}"], atom_to_token)[0].bool() for kind in MOLECULE_TYPES}
    is_nucleotide = kinds["dna"] | kinds["rna"]
    true, structures = batch["atom_pos"][0], predicted[0]
    scores = {"lddt": lddt(structures, true, resolved, is_nucleotide)}
    for kind in MOLECULE_TYPES:
        scores[f"lddt_{kind}"] = lddt(structures, true, resolved, is_nucleotide, scored=kinds[kind])
    return {name: float(value.mean()) for name, value in scores.items()}


def target_seed(seed: int, index: int) -> int:
    """The seed of a held-out target's draws (its diffusion batch and sampler noise)."""
    return int(np.random.SeedSequence([seed, index, 0x7A11D]).generate_state(1, dtype=np.uint64)[0] >> 1)


@torch.no_grad()
def validate_target(model: AF3Model, batch: dict, config: TrainConfig, seed: int, autocast) -> dict[str, float]:
    """The loss terms and the lDDTs of one held-out target (a collated batch of one sample)."""
    cycles = model.config.trunk.max_recycling_cycles
    generator = torch.Generator().manual_seed(seed)
    with autocast:
        outputs = model(batch, num_cycles=cycles, generator=generator)  # on the model's diffusion batch
    _, metrics = model.loss(batch, outputs)
    with autocast:
        predicted = model.sample(
            batch,
            num_cycles=cycles,
            num_samples=1,
            num_steps=config.validation_sampler_steps,
            generator=generator,
            confidences=False,  # only the positions are scored
        )["positions"]
    return {**{name: float(value) for name, value in metrics.items()}, **lddt_by_molecule_type(batch, predicted)}


def validate(
    model: AF3Model, average: WeightAverage | None, dataset, config: TrainConfig, world: Dist, step: int, autocast
) -> dict | None:
    """One validation pass over `dataset` (the held-out targets), split across ranks; returns
    the log record on the main rank (None elsewhere). Runs the EMA weights when there are."""
    was_training = model.training
    model.eval()
    if average is not None:
        average.swap()
    try:
        mine = {}
        for index in range(world.rank, len(dataset), world.world_size):
            batch = {
                name: value.to(world.device) if isinstance(value, torch.Tensor) else value
                for name, value in collate([dataset[(0, index)]]).items()
            }
            mine[dataset.ids[index]] = validate_target(
                model, batch, config, target_seed(config.sample.seed, index), autocast
            )
    finally:
        if average is not None:
            average.swap()
        model.train(was_training)
    results = {key: values for part in all_ranks(world, mine) for key, values in part.items()}
    if not world.is_main:
        return None
    return validation_record(step, results, "ema" if average is not None else "live")


def validation_record(step: int, results: dict[str, dict[str, float]], weights: str) -> dict:
    """The JSON line of one pass: each quantity's mean over the targets that have it (a type no
    held-out target has is null)."""
    names = list(dict.fromkeys(name for values in results.values() for name in values))
    record = {"kind": "validation", "step": step, "targets": sorted(results), "weights": weights}
    for name in names:
        values = [values[name] for values in results.values() if not math.isnan(values.get(name, math.nan))]
        record[name] = sum(values) / len(values) if values else None
    return record
