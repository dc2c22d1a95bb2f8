"""Confidence metrics of one predicted structure from the head's logits (AF3 SI 5.9.1 and
AlphaFold 3's released code): pLDDT, expected PAE, pTM, ipTM and the per-chain and
chain-pair summaries AlphaFold 3 writes, plus the contact probabilities of the distogram.

pTM = max_i mean_j E[f(e_ij)], f(e) = 1 / (1 + (e / d0)^2), d0 = 1.24 (max(N, 19) - 15)^(1/3) - 1.8,
the expectation over the PAE bins at their centres (0.25, 0.75, ..., 31.75 A); i runs over
tokens with a frame, j over every token (ipTM: over tokens of other chains). As AlphaFold 3
does, pTM and ipTM take N = all tokens; a chain pair's score takes N = the tokens of the pair.

Inputs are unbatched: one structure, N real tokens (padding removed by the caller).
"""

from __future__ import annotations

import math

import torch

from featurecache.model.network.heads import distogram_bin_edges
from featurecache.model.objectives.confidence_losses import ERROR_BIN_WIDTH

CONTACT_DISTANCE = 8.0  # Angstrom: the distogram's contact probability (AF3 output.md)


def bin_centres(num_bins: int, width: float, device=None) -> torch.Tensor:
    return (torch.arange(num_bins, dtype=torch.float64, device=device) + 0.5) * width


def plddt(plddt_logits: torch.Tensor) -> torch.Tensor:
    """[..., bins] -> expected lDDT on AF3's 0-100 scale [...]."""
    probs = torch.softmax(plddt_logits.double(), dim=-1)
    return 100.0 * (probs * bin_centres(probs.shape[-1], 1.0 / probs.shape[-1], probs.device)).sum(-1)


def expected_error(logits: torch.Tensor) -> torch.Tensor:
    """PAE or PDE logits [..., bins] -> expected error in Angstrom [...]."""
    probs = torch.softmax(logits.double(), dim=-1)
    return (probs * bin_centres(probs.shape[-1], ERROR_BIN_WIDTH, probs.device)).sum(-1)


def tm_d0(num_tokens) -> torch.Tensor | float:
    """TM-score's d0 for num_tokens (clipped at 19 so it stays positive)."""
    if isinstance(num_tokens, torch.Tensor):
        return 1.24 * (num_tokens.double().clamp(min=19) - 15) ** (1.0 / 3) - 1.8
    return 1.24 * (max(num_tokens, 19) - 15) ** (1.0 / 3) - 1.8


def tm_terms(pae_logits: torch.Tensor, d0) -> torch.Tensor:
    """E[f(e_ij)] [N, N] from PAE logits [N, N, bins]; d0 a number or [N, N]."""
    probs = torch.softmax(pae_logits.double(), dim=-1)
    centres = bin_centres(probs.shape[-1], ERROR_BIN_WIDTH, probs.device)
    d0 = torch.as_tensor(d0, dtype=torch.float64, device=probs.device)
    if d0.dim() == 2:
        d0 = d0[..., None]
    return (probs / (1.0 + (centres / d0) ** 2)).sum(-1)


def predicted_tm(terms: torch.Tensor, pair_mask: torch.Tensor) -> float:
    """max over rows i of the mean of terms [N, N] over row i's masked pairs (NaN with none)."""
    if not bool(pair_mask.any()):
        return math.nan
    mask = pair_mask.double()
    per_row = (terms * mask).sum(-1) / (mask.sum(-1) + 1e-8)
    return float(per_row.max())


def chain_pair_iptm(pae_logits: torch.Tensor, asym_id: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
    """[C, C]: (i, j) the ipTM over tokens of chains i and j, (i, i) the pTM of chain i, with
    d0 from the pair's token count. Chains in ascending asym_id."""
    chains = torch.unique(asym_id)
    same_chain = asym_id[:, None] == asym_id[None, :]
    chain_tokens = same_chain.sum(-1)  # per token: its chain's size
    pair_tokens = torch.where(same_chain, chain_tokens[:, None], chain_tokens[:, None] + chain_tokens[None, :])
    terms = tm_terms(pae_logits, tm_d0(pair_tokens))
    result = torch.full((len(chains), len(chains)), math.nan, dtype=torch.float64)
    for i, first in enumerate(chains):
        for j, second in enumerate(chains):
            members = (asym_id == first) | (asym_id == second)
            mask = frame_mask[:, None] & members[:, None] & members[None, :]
            if first != second:
                mask &= ~same_chain
            result[i, j] = predicted_tm(terms, mask)
    return result


def _cross_chain_mean(matrix: torch.Tensor) -> torch.Tensor:
    """[C] each chain's mean over its off-diagonal row and column entries (NaN-aware), as
    AlphaFold 3's chain_iptm."""
    count = matrix.shape[0]
    off = ~torch.eye(count, dtype=torch.bool)

    def nanmean(values, mask, dim):
        valid = mask & ~values.isnan()
        return torch.where(valid, values, 0.0).sum(dim) / valid.sum(dim)  # NaN where none

    rows, columns = nanmean(matrix, off, -1), nanmean(matrix, off, -2)
    return torch.nanmean(torch.stack([rows, columns]), dim=0)


def chain_pair_pae_min(pae: torch.Tensor, asym_id: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
    """[C, C] the lowest expected PAE over rows (frames) of chain i and columns of chain j."""
    chains = torch.unique(asym_id)
    result = torch.full((len(chains), len(chains)), math.nan, dtype=torch.float64)
    for i, first in enumerate(chains):
        rows = (asym_id == first) & frame_mask
        for j, second in enumerate(chains):
            if rows.any():
                result[i, j] = pae[rows][:, asym_id == second].min()
    return result


def confidence_summary(pae_logits: torch.Tensor, asym_id: torch.Tensor, frame_mask: torch.Tensor) -> dict:
    """One structure's pae [N, N] (Angstrom), ptm, iptm (NaN for one chain), chain_pair_iptm
    [C, C], chain_ptm [C], chain_iptm [C] and chain_pair_pae_min [C, C] (float64 tensors or
    floats). pae_logits [N, N, bins]; asym_id [N]; frame_mask [N] (tokens with a frame)."""
    asym_id, frame_mask = asym_id.cpu(), frame_mask.cpu().bool()
    pae_logits = pae_logits.cpu()
    pair_mask = frame_mask[:, None].expand(-1, len(asym_id))
    terms = tm_terms(pae_logits, tm_d0(len(asym_id)))
    pairs = chain_pair_iptm(pae_logits, asym_id, frame_mask)
    pae = expected_error(pae_logits)
    return {
        "pae": pae,
        "ptm": predicted_tm(terms, pair_mask),
        "iptm": predicted_tm(terms, pair_mask & (asym_id[:, None] != asym_id[None, :])),
        "chain_pair_iptm": pairs,
        "chain_ptm": pairs.diagonal().clone(),
        "chain_iptm": _cross_chain_mean(pairs),
        "chain_pair_pae_min": chain_pair_pae_min(pae, asym_id, frame_mask),
    }


def contact_probabilities(distogram_logits: torch.Tensor, min_dist: float, max_dist: float) -> torch.Tensor:
    """[..., N, N, bins] -> probability that the distogram atoms lie within 8 A [..., N, N]:
    the mass of the bins whose upper edge is at most 8 A."""
    bins = distogram_logits.shape[-1]
    upper = distogram_bin_edges(bins, min_dist, max_dist, device=distogram_logits.device, dtype=torch.float64)
    upper = torch.cat([upper, upper.new_full((1,), math.inf)])
    probs = torch.softmax(distogram_logits.double(), dim=-1)
    return (probs * (upper <= CONTACT_DISTANCE + 1e-3)).sum(-1)
