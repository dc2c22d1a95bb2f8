"""The confidence losses of AF3 (SI 4.3.1-4.3.4) and their targets, computed from the structures
the head judged (the training mini-rollout) against the ground truth: pure functions of tensors.

Targets (no gradient):
- pLDDT (4.3.1): per atom l, the lDDT of its distances to the centre atoms m (CA, C1') of
  polymer tokens within 15 A in the truth (30 A when m is a nucleotide), m != l, thresholds
  0.5 / 1 / 2 / 4 A; binned into 50 bins of 0.02. Atoms with no such m are left out. With
  ModelConfig.dialect.plddt_bins_protenix, Protenix's target instead (`protenix_lddt_bins`).
- PAE (4.3.2, Algorithms 29-30): e_ij, the error of token j's centre atom in token i's frame
  (a, b, c) of the prediction against the same in the truth's; 64 bins of 0.5 A, the last open.
  Frames whose three atoms the truth does not resolve are left out.
- PDE (4.3.3): |d_pred - d_true| between centre atoms (with ModelConfig.dialect.pde_distogram_atoms, as
  Protenix, between the distogram atoms: CB, C4 / C2); the same 64 bins.
- experimentally resolved (4.3.4): atom_mask, over every real atom.

Only structures of resolution 0.1-4 A train the head (SI 4.3; `confidence_rows`,
ModelConfig.confidence_resolution_range): another batch row's entries count as invalid.

Shapes: B batch, S structures, N tokens, A atoms. Each loss is the cross-entropy averaged over
the valid entries of each structure, then over structures and batch rows (0 with none valid).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from featurecache.model.network.atoms import (
    centre_atom_index,
    gather_atoms,
    pairwise_distances,
    representative_atom_index,
)
from featurecache.model.network.checkpointing import maybe_checkpointed
from featurecache.model.objectives.lddt import inclusion_radius, pair_scores

ERROR_BIN_WIDTH = 0.5  # Angstrom: PAE and PDE bins [0, 0.5), [0.5, 1), ..., [31.5, inf)
FRAME_EPS = 1e-8  # Algorithm 29-30's epsilon in norms and in the error's square root


def error_bins(error: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Distances in Angstrom -> bin indices of width ERROR_BIN_WIDTH, the last bin open above."""
    return torch.div(error, ERROR_BIN_WIDTH, rounding_mode="floor").long().clamp(0, num_bins - 1)


def lddt_bins(lddt: torch.Tensor, num_bins: int) -> torch.Tensor:
    """lDDT in [0, 1] -> one of num_bins equal bins (1.0 in the top one)."""
    return (lddt * num_bins).floor().long().clamp(0, num_bins - 1)


# Protenix's PLDDTLoss: the lDDT's denominator is pairs + this (loss.plddt.eps)
PROTENIX_LDDT_EPS = 1e-6


def protenix_lddt_bins(score: torch.Tensor, count: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Protenix's pLDDT bins (PLDDTLoss.bins_from_lddt), from the summed pair scores and the pair
    count of each atom: lDDT = score / (count + 1e-6), bin k for (k/n, (k+1)/n], so an lDDT on an
    edge k/n falls in bin k - 1 (AF2's floor puts it in bin k), and an atom with no pair in bin 0.
    Computed in fp32 as Protenix does, edges from linspace(0, 1, n + 1): the same bins exactly."""
    lddt = score.float() / (count.float().unsqueeze(-2) + PROTENIX_LDDT_EPS)
    edges = torch.linspace(0.0, 1.0, num_bins + 1, device=score.device)
    return ((lddt.unsqueeze(-1) > edges).sum(-1).clamp(1, num_bins) - 1).long()


def masked_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, item_dims: int, recompute: bool = False
) -> torch.Tensor:
    """Cross-entropy of logits [B, S, *items, bins] against target [B, S, *items], averaged over
    the mask's items in each structure, then over structures and batch (a 0-d tensor).
    `recompute`: re-run the cross-entropy in backward instead of keeping the logits' fp32 copy and
    log-softmax (two pair-sized tensors for the [N, N, 64] PAE and PDE logits)."""
    errors = maybe_checkpointed(recompute, _cross_entropy, logits, target)
    mask = mask.expand_as(target).float()
    dims = tuple(range(-item_dims, 0))
    return ((errors * mask).sum(dims) / mask.sum(dims).clamp(min=1.0)).mean()


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, -2), target.flatten(), reduction="none").view_as(target)


@torch.no_grad()
def plddt_target(
    predicted: torch.Tensor,
    true: torch.Tensor,
    atom_resolved: torch.Tensor,
    centre: torch.Tensor,
    centre_valid: torch.Tensor,
    centre_is_nucleotide: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-atom lDDT (4.3.1) -> (lddt [B, S, A], has_reference [B, A]).

    predicted [B, S, A, 3]; true [B, A, 3]; atom_resolved [B, A]; centre [B, N] centre atom of
    each token; centre_valid [B, N] (a polymer token whose centre atom is resolved);
    centre_is_nucleotide [B, N]."""
    score, count = plddt_scores(predicted, true, atom_resolved, centre, centre_valid, centre_is_nucleotide)
    return score / count[:, None].clamp(min=1), count > 0


@torch.no_grad()
def plddt_scores(
    predicted: torch.Tensor,
    true: torch.Tensor,
    atom_resolved: torch.Tensor,
    centre: torch.Tensor,
    centre_valid: torch.Tensor,
    centre_is_nucleotide: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """plddt_target's parts: each atom's summed pair scores [B, S, A] and its pair count [B, A]."""
    true = true.float()
    true_distance = pairwise_distances(true, gather_atoms(true, centre))  # [B, A, N]
    predicted_distance = pairwise_distances(predicted.float(), gather_atoms(predicted.float(), centre))  # [B, S, A, N]
    radius = inclusion_radius(centre_is_nucleotide)[:, None, :]
    atom_index = torch.arange(true.shape[1], device=true.device)[None, :, None]
    included = (
        (true_distance < radius)
        & centre_valid[:, None, :]
        & atom_resolved[:, :, None]
        & (atom_index != centre[:, None, :])
    )  # [B, A, N]
    error = (predicted_distance - true_distance[:, None]).abs()
    score = pair_scores(error)
    return (score * included[:, None]).sum(-1), included.sum(-1)


def frames(positions: torch.Tensor, frame_atoms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 29: each token's frame from its atoms (a, b, c) -> (origin b [..., N, 3], axes
    [..., N, 3, 3] with rows e1, e2, e3). positions [B, (S,) A, 3]; frame_atoms [B, N, 3]."""
    a, b, c = (gather_atoms(positions, frame_atoms[..., k]) for k in range(3))
    w1 = F.normalize(a - b, dim=-1, eps=FRAME_EPS)
    w2 = F.normalize(c - b, dim=-1, eps=FRAME_EPS)
    e1 = F.normalize(w1 + w2, dim=-1, eps=FRAME_EPS)
    e2 = F.normalize(w2 - w1, dim=-1, eps=FRAME_EPS)
    return b, torch.stack([e1, e2, torch.linalg.cross(e1, e2)], dim=-2)


def in_frames(points: torch.Tensor, origin: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    """points [..., N_j, 3] in each frame i -> [..., N_i, N_j, 3]."""
    offset = points[..., None, :, :] - origin[..., :, None, :]
    return torch.einsum("...ikc,...ijc->...ijk", axes, offset)


@torch.no_grad()
def aligned_errors(
    predicted: torch.Tensor, true: torch.Tensor, frame_atoms: torch.Tensor, centre: torch.Tensor
) -> torch.Tensor:
    """Algorithm 30: e_ij [B, S, N, N], the error of token j's centre atom in token i's frame."""
    predicted, true = predicted.float(), true.float()
    predicted_local = in_frames(gather_atoms(predicted, centre), *frames(predicted, frame_atoms))
    true_local = in_frames(gather_atoms(true, centre), *frames(true, frame_atoms))
    return ((predicted_local - true_local[:, None]).square().sum(-1) + FRAME_EPS).sqrt()


def confidence_rows(batch: dict, resolution_range: tuple[float, float] | None) -> torch.Tensor:
    """[B] bool: the batch rows whose structure trains the confidence head, those with
    low <= resolution <= high (a NaN resolution, none known, is out). Every row when
    resolution_range is None or the batch has no "resolution" (built by hand, not by collate)."""
    every = torch.ones_like(batch["atom_pad_mask"][:, 0])
    if resolution_range is None or "resolution" not in batch:
        return every
    low, high = resolution_range
    resolution = batch["resolution"].to(every.device)
    return (resolution >= low) & (resolution <= high)


def confidence_losses(
    outputs: dict,
    positions: torch.Tensor,
    batch: dict,
    recompute: bool = False,
    rows: torch.Tensor | None = None,
    plddt_bins_protenix: bool = False,
    pde_distogram_atoms: bool = False,
) -> dict:
    """The four losses (0-d tensors: plddt, pae, pde, resolved) of the head's outputs on the
    structures positions [B, S, A, 3] it judged, against batch's ground truth. `recompute`: the
    pair-sized cross-entropies are re-run in backward (masked_cross_entropy). `rows` [B] bool
    (confidence_rows): the batch rows that count; the others contribute 0. None: every row.
    `plddt_bins_protenix` (ModelConfig's): Protenix's pLDDT target, every resolved atom binned
    by protenix_lddt_bins. `pde_distogram_atoms` (ModelConfig's): the PDE between the tokens'
    distogram atoms, as Protenix's PDELoss reads them."""
    true = batch["atom_pos"].float()
    atom_real = batch["atom_pad_mask"]
    if rows is not None:  # a row left out has no valid entry in any of the four losses
        atom_real = atom_real & rows[:, None]
    atom_resolved = batch["atom_mask"] & atom_real
    token_real = batch["token_pad_mask"] if rows is None else batch["token_pad_mask"] & rows[:, None]
    centre = centre_atom_index(batch)
    centre_resolved = torch.gather(atom_resolved, 1, centre) & token_real
    is_nucleotide = batch["is_dna"] | batch["is_rna"]
    polymer = ~batch["is_ligand"]

    plddt_logits = outputs["plddt_logits"]
    score, count = plddt_scores(positions, true, atom_resolved, centre, centre_resolved & polymer, is_nucleotide)
    if plddt_bins_protenix:
        plddt_target_bins, plddt_atoms = protenix_lddt_bins(score, count, plddt_logits.shape[-1]), atom_resolved
    else:
        lddt = score / count[:, None].clamp(min=1)
        plddt_target_bins, plddt_atoms = lddt_bins(lddt, plddt_logits.shape[-1]), (count > 0) & atom_resolved
    plddt = masked_cross_entropy(plddt_logits, plddt_target_bins, plddt_atoms[:, None], item_dims=1)

    frame_atoms = batch["frame_atom_index"].long()
    frame_resolved = torch.gather(atom_resolved, 1, frame_atoms.clamp(min=0).flatten(1)).view_as(frame_atoms)
    frame_valid = (frame_atoms >= 0).all(-1) & frame_resolved.all(-1) & token_real
    pae_logits = outputs["pae_logits"]
    pae_target = error_bins(aligned_errors(positions, true, frame_atoms, centre), pae_logits.shape[-1])
    pae = masked_cross_entropy(
        pae_logits,
        pae_target,
        (frame_valid[:, :, None] & centre_resolved[:, None, :])[:, None],
        item_dims=2,
        recompute=recompute,
    )

    pde_atoms = representative_atom_index(batch) if pde_distogram_atoms else centre
    pde_resolved = torch.gather(atom_resolved, 1, pde_atoms) & token_real
    with torch.no_grad():
        predicted_atoms = gather_atoms(positions.float(), pde_atoms)
        true_atoms = gather_atoms(true, pde_atoms)
        distance_error = (
            pairwise_distances(predicted_atoms, predicted_atoms) - pairwise_distances(true_atoms, true_atoms)[:, None]
        ).abs()
    pde_logits = outputs["pde_logits"]
    pde = masked_cross_entropy(
        pde_logits,
        error_bins(distance_error, pde_logits.shape[-1]),
        (pde_resolved[:, :, None] & pde_resolved[:, None, :])[:, None],
        item_dims=2,
        recompute=recompute,
    )

    resolved_logits = outputs["resolved_logits"]
    resolved_target = atom_resolved.long()[:, None].expand(resolved_logits.shape[:-1])
    resolved = masked_cross_entropy(resolved_logits, resolved_target, atom_real[:, None], item_dims=1)
    return {"plddt": plddt, "pae": pae, "pde": pde, "resolved": resolved}
