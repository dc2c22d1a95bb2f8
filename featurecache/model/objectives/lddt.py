"""lDDT (Mariani et al. 2013) as AF3 scores it, in one place for its three users: the smooth LDDT
loss (losses.py, Algorithm 27), the pLDDT target (confidence_losses.py, SI 4.3.1) and the
validation scores (training/validation.py).

A pair of atoms counts when both are resolved, they differ, and they are closer in the truth than
the inclusion radius: 15 A, or 30 A for a nucleotide. Its score is the fraction of the thresholds
0.5, 1, 2 and 4 A that |d_pred - d_true| stays under (the smooth loss: sigmoid(threshold - error)).
The numbers (thresholds and radii) are defined once, in kernels/reference.py and exported by
kernels/smooth_lddt/ (the Triton path's radii and reference use them too; kernels import nothing
from the model), and imported here.
"""

from __future__ import annotations

import math

import torch

from featurecache.kernels.smooth_lddt import INCLUSION_RADIUS, LDDT_THRESHOLDS, NUCLEOTIDE_INCLUSION_RADIUS
from featurecache.model.network.atoms import pairwise_distances


def inclusion_radius(is_nucleotide: torch.Tensor) -> torch.Tensor:
    """Per atom: NUCLEOTIDE_INCLUSION_RADIUS for nucleotide atoms, else INCLUSION_RADIUS."""
    return torch.where(is_nucleotide, NUCLEOTIDE_INCLUSION_RADIUS, INCLUSION_RADIUS)


def pair_scores(error: torch.Tensor) -> torch.Tensor:
    """|d_pred - d_true| -> the fraction of LDDT_THRESHOLDS it stays under."""
    return sum((error < threshold).float() for threshold in LDDT_THRESHOLDS) / len(LDDT_THRESHOLDS)


def smooth_pair_scores(error: torch.Tensor) -> torch.Tensor:
    """|d_pred - d_true| -> Algorithm 27's mean over the thresholds of sigmoid(threshold - error)."""
    return sum(torch.sigmoid(threshold - error) for threshold in LDDT_THRESHOLDS) / len(LDDT_THRESHOLDS)


def lddt(
    predicted: torch.Tensor,
    true: torch.Tensor,
    resolved: torch.Tensor,
    is_nucleotide: torch.Tensor,
    scored: torch.Tensor | None = None,
) -> torch.Tensor:
    """lDDT of each predicted structure over all atom pairs (l, m), the radius that of atom l:
    predicted [S, A, 3], true [A, 3]; resolved, is_nucleotide and scored (the atoms l whose
    pairs count; default all) [A] -> [S]. NaN where no pair is within the inclusion radius."""
    true = true.float()
    true_distance = pairwise_distances(true, true)
    radius = inclusion_radius(is_nucleotide)[:, None]
    scored = resolved if scored is None else scored & resolved
    eye = torch.eye(true.shape[0], dtype=torch.bool, device=true.device)
    pairs = (true_distance < radius) & scored[:, None] & resolved[None, :] & ~eye
    count = pairs.sum()
    if count == 0:
        return torch.full(predicted.shape[:1], math.nan, device=predicted.device)
    scores = []
    for structure in predicted.float():  # one [A, A] distance matrix at a time
        error = (pairwise_distances(structure, structure) - true_distance).abs()[pairs]
        scores.append(pair_scores(error).sum() / count)
    return torch.stack(scores)
