"""The structure losses of AF3 (SI 4.1-4.2, Algorithms 27-28): pure functions of tensors.

Symbols: x (predicted atom positions, `predicted`), x_GT (`true`), w_l (`weights`), sigma / t-hat
(`sigma`, the noise level of a diffusion sample), sigma_data. Shapes: B batch, S diffusion
samples, A atoms, E token bonds. Every mask is a bool named for what is true.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from featurecache.kernels import smooth_lddt
from featurecache.kernels.runtime import runs_triton
from featurecache.model.network.atoms import pairwise_distances
from featurecache.model.objectives.lddt import inclusion_radius, smooth_pair_scores
from featurecache.model.objectives.rigid import weighted_rigid_align

# Devices on which the PyTorch path's smooth LDDT lists the included pairs (data-dependent shapes:
# not on a GPU, where a CUDA graph may capture the step). benchmarks/flops.py empties it to count
# on fake tensors, which have no values to list.
LISTED_PAIR_DEVICES = ("cpu",)


def mse_atom_weights(
    is_dna: torch.Tensor,
    is_rna: torch.Tensor,
    is_ligand: torch.Tensor,
    resolved: torch.Tensor,
    mse_weight_dna: float = 5.0,
    mse_weight_rna: float = 5.0,
    mse_weight_ligand: float = 10.0,
) -> torch.Tensor:
    """SI 4.2, eq. 4: w_l = 1 + 5 is_dna + 5 is_rna + 10 is_ligand, 0 for unresolved atoms. [..., A] float.
    The weights are ModelConfig's of the same names."""
    weights = (
        1.0 + mse_weight_dna * is_dna.float() + mse_weight_rna * is_rna.float() + mse_weight_ligand * is_ligand.float()
    )
    return weights * resolved.float()


def aligned_mse_loss(
    predicted: torch.Tensor, true: torch.Tensor, weights: torch.Tensor, resolved: torch.Tensor
) -> torch.Tensor:
    """SI 4.2, eqs. 2-3: the ground truth rigidly aligned onto each prediction (no gradient through
    the alignment), then 1/3 of the weighted squared error summed over resolved atoms and divided
    by their number.

    predicted [B, S, A, 3]; true [B, A, 3]; weights [B, A]; resolved [B, A] -> [B, S].
    """
    true = true.unsqueeze(1).expand_as(predicted)
    weights = weights.unsqueeze(1).expand(predicted.shape[:-1])
    aligned = weighted_rigid_align(true, predicted, weights)
    squared_error = (predicted.float() - aligned.float()).square().sum(dim=-1)  # [B, S, A]
    count = resolved.sum(dim=-1, keepdim=True).clamp(min=1)  # [B, 1]
    return (weights * squared_error).sum(dim=-1) / count / 3.0


def smooth_lddt_loss(
    predicted: torch.Tensor,
    true: torch.Tensor,
    is_nucleotide: torch.Tensor,
    resolved: torch.Tensor,
    kernels: str = "torch",
) -> torch.Tensor:
    """Algorithm 27, SmoothLDDTLoss: 1 - the mean over atom pairs l != m within the inclusion
    radius (30 Angstrom in the truth when atom l is a nucleotide atom, else 15) of
    mean_{c in 0.5, 1, 2, 4} sigmoid(c - |d_lm - d_GT_lm|).

    predicted [B, S, A, 3]; true [B, A, 3]; is_nucleotide, resolved [B, A] -> [B, S].
    kernels="triton" (on CUDA or the interpreter): one kernel for the whole diffusion batch that
    never stores an [A, A] tensor (featurecache.kernels.smooth_lddt). On the CPU: the included
    pairs only (their indices, once; a 15 A neighbourhood holds a fifth of a protein crop's A^2
    pairs), one sample at a time, recomputed in backward. Otherwise (the PyTorch path on a GPU,
    which a CUDA graph may capture: no data-dependent shapes) dense [B, A, A] terms, one sample at
    a time, recomputed in backward (at 3,000 atoms, 36 MB a term instead of 1.7 GB for a
    diffusion batch of 48).
    """
    true = true.float()
    if kernels == "triton" and runs_triton(predicted.device):
        scores, count = smooth_lddt.smooth_lddt_sums(
            predicted.float(), true, smooth_lddt.inclusion_radius(is_nucleotide, resolved)
        )
        return 1.0 - scores / count.clamp(min=1.0)[:, None]
    true_distance = pairwise_distances(true, true)  # [B, A, A]
    radius = inclusion_radius(is_nucleotide).unsqueeze(-1)  # [B, A, 1]
    eye = torch.eye(true.shape[1], dtype=torch.bool, device=true.device)
    included = (true_distance < radius) & resolved[:, :, None] & resolved[:, None, :] & ~eye
    count = included.sum(dim=(-1, -2)).float().clamp(min=1.0)  # [B]
    if predicted.device.type in LISTED_PAIR_DEVICES:
        batch, first, second = pairs = included.nonzero(as_tuple=True)  # (batch, l, m) of each included pair
        atoms = true.shape[1]
        score_fn, inputs = (
            _smooth_lddt_pair_score,
            (batch, batch * atoms + first, batch * atoms + second, true_distance[pairs]),
        )
    else:
        score_fn, inputs = _smooth_lddt_score, (true_distance, included.float())
    scores = []
    for sample in predicted.float().unbind(1):
        if torch.is_grad_enabled() and sample.requires_grad:
            score = checkpoint(score_fn, sample, *inputs, use_reentrant=False)
        else:
            score = score_fn(sample, *inputs)
        scores.append(score)
    return 1.0 - torch.stack(scores, dim=1) / count[:, None]


def _smooth_lddt_score(predicted: torch.Tensor, true_distance: torch.Tensor, included: torch.Tensor) -> torch.Tensor:
    """Sum of the smooth LDDT pair scores over included pairs: predicted [B, A, 3] -> [B]."""
    error = (pairwise_distances(predicted, predicted) - true_distance).abs()
    score = smooth_pair_scores(error)
    return (score * included).sum(dim=(-1, -2))


def _smooth_lddt_pair_score(
    predicted: torch.Tensor, batch: torch.Tensor, first: torch.Tensor, second: torch.Tensor, true_distance: torch.Tensor
) -> torch.Tensor:
    """_smooth_lddt_score over the listed pairs (batch index, first and second atoms as rows of
    predicted's [B * A, 3] rows, [P] each; their true distances [P]): predicted [B, A, 3] -> [B].
    index_select of flat rows: its backward is one index_add_, which the CPU runs ~1.7x faster
    than advanced indexing's accumulating index_put_ (1.2 M pairs: 70 -> 42 ms fwd + bwd)."""
    rows = predicted.reshape(-1, 3)
    predicted_distance = (rows.index_select(0, first) - rows.index_select(0, second)).norm(dim=-1)
    score = smooth_pair_scores((predicted_distance - true_distance).abs())
    # index_add_ adds one pair after another: in float64, so the millions of terms keep fp32's precision
    sums = torch.zeros(predicted.shape[0], dtype=torch.float64, device=score.device)
    return sums.index_add_(0, batch, score.double()).to(score.dtype)


def bond_loss(predicted: torch.Tensor, true: torch.Tensor, bond_atoms: torch.Tensor) -> torch.Tensor:
    """SI 4.2, eq. 5: mean over bonded atom pairs (l, m) of (|x_l - x_m| - |x_GT_l - x_GT_m|)^2.

    predicted [B, S, A, 3]; true [B, A, 3]; bond_atoms [B, E, 2] atom indices (-1: no bond) ->
    [B, S] (0 for a sample without bonds).
    """
    valid = (bond_atoms >= 0).all(dim=-1)  # [B, E]
    index = bond_atoms.long().clamp(min=0)

    def bond_lengths(positions, index):  # positions [B, (S,) A, 3] -> [B, (S,) E]
        if positions.dim() == 4:
            index = index[:, None].expand(-1, positions.shape[1], -1, -1)
        first = torch.gather(positions, -2, index[..., 0:1].expand(*index.shape[:-1], 3))
        second = torch.gather(positions, -2, index[..., 1:2].expand(*index.shape[:-1], 3))
        return (first - second).norm(dim=-1)

    error = (bond_lengths(predicted.float(), index) - bond_lengths(true.float(), index).unsqueeze(1)).square()
    valid = valid.unsqueeze(1).float()
    return (error * valid).sum(dim=-1) / valid.sum(dim=-1).clamp(min=1.0)


def edm_loss_weight(sigma: torch.Tensor, sigma_data: float) -> torch.Tensor:
    """SI 4.2, eq. 6 (EDM's lambda): (sigma^2 + sigma_data^2) / (sigma * sigma_data)^2."""
    return (sigma.square() + sigma_data**2) / (sigma * sigma_data).square()
