"""Distogram head and loss on the tokens' representative atoms: 64 bins, 63 inner edges evenly
from 2.3125 to 21.6875 Angstrom in AF3's code and Protenix (ModelConfig.distogram_min / max;
a checkpoint keeps the edges it was trained with)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from featurecache.model.network.layers import Linear


class DistogramHead(nn.Module):
    def __init__(self, c_z: int, num_bins: int = 64) -> None:
        super().__init__()
        self.linear = Linear(c_z, num_bins)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """z [B, N, N, c_z] -> symmetric logits [B, N, N, num_bins]."""
        return self.linear(z + z.transpose(1, 2))


def distogram_bin_edges(num_bins: int, min_dist: float, max_dist: float, device=None, dtype=None) -> torch.Tensor:
    """num_bins - 1 inner edges: bin 0 is below min_dist, the last bin above max_dist."""
    return torch.linspace(min_dist, max_dist, num_bins - 1, device=device, dtype=dtype)


def distogram_loss(
    logits: torch.Tensor, positions: torch.Tensor, position_mask: torch.Tensor, min_dist: float, max_dist: float
) -> torch.Tensor:
    """Cross-entropy of the binned true distances, averaged over valid pairs of each sample, then
    over the batch. A distance's bin is the number of edges below it (AF3's code and Protenix:
    sum(d > edges); a distance on an edge falls in the lower bin).

    logits [B, N, N, bins]; positions [B, N, 3]; position_mask [B, N] bool (resolved and not
    padding). A sample with no valid pair contributes zero.
    """
    edges = distogram_bin_edges(logits.shape[-1], min_dist, max_dist, device=logits.device)
    distance = (positions[:, :, None, :].float() - positions[:, None, :, :].float()).norm(dim=-1)
    target = torch.bucketize(distance, edges)
    pair_mask = (position_mask[:, :, None] & position_mask[:, None, :]).float()
    per_pair = F.cross_entropy(logits.float().flatten(0, 2), target.flatten(), reduction="none")
    per_pair = per_pair.view_as(pair_mask) * pair_mask
    per_sample = per_pair.sum(dim=(1, 2)) / pair_mask.sum(dim=(1, 2)).clamp(min=1.0)
    return per_sample.mean()
