"""Permutation alignment of the ground truth (AF3 SI 4.2, after AF-Multimer SI 7.3): before the
losses, the truth's interchangeable chains and symmetric atoms are relabelled to best match a
prediction, so the model is not punished for picking another copy of a homomer's chain or the
other oxygen of a carboxylate.

1. Chains. Two chains are interchangeable when they belong to one entity and the crop holds the
   same residues of both (same residue numbers, classes and atom counts, token by token). The
   anchor is the least ambiguous resolved chain (a polymer first, then the fewest copies, then
   the most resolved tokens). For every predicted chain that could be the anchor's, the truth is
   rigidly moved to put the anchor's representative atoms (`distogram_atom_index`) onto it, and
   the remaining predicted chains, longest first, each take the nearest free interchangeable
   truth chain by centroid; the candidate with the lowest representative-atom error wins.
2. Atoms. The prediction is rigidly aligned onto the relabelled truth, then each residue or
   ligand takes the symmetric relabelling of its atoms (`atom_permutations`, from
   features.symmetry) with the least squared error, the identity on ties.

Where: AF3Model.forward aligns the truth to the mini-rollout (the confidence head's, as AF3 and
Protenix do) before it draws the diffusion batch, so the noised inputs and every loss see one
labelling; without the head, AF3Model.loss aligns to the least noisy denoised sample.
Everything is tensor operations on fixed shapes, without a host synchronization, so a training
step stays capturable as a CUDA graph. Greedy matching takes one pass per chain of a multi-copy
entity, at most MAX_MATCHED_CHAINS; a sample with more keeps its chains as they are.
Symbols: B batch, N tokens (and chain slots: a chain is named by its first token), A atoms,
K symmetries per residue.
"""

from __future__ import annotations

import torch

from featurecache.model.network.atoms import distogram_atoms, gather_atoms, token_first_atom
from featurecache.model.objectives.rigid import rigid_fit, weighted_rigid_align

MAX_MATCHED_CHAINS = 32
MIN_ANCHOR_TOKENS = 3  # a rigid fit needs three points
UNRESOLVED_DISTANCE = 1e8  # squared Angstrom: a truth chain without resolved atoms is matched last


def prediction_for_alignment(outputs: dict) -> torch.Tensor:
    """[B, A, 3]: the mini-rollout's first structure (AF3), else the diffusion sample denoised
    from the lowest noise level."""
    if "rollout_positions" in outputs:
        return outputs["rollout_positions"][:, 0].float()
    denoised = outputs["denoised_positions"].float()  # [B, S, A, 3]
    lowest = outputs["noise_level"].argmin(dim=1)  # [B]
    return denoised[torch.arange(denoised.shape[0], device=denoised.device), lowest]


def align_ground_truth(batch: dict, outputs: dict) -> dict:
    """The batch with `atom_pos` and `atom_mask` relabelled to match the prediction in `outputs`
    (see the module docstring); every other entry is the batch's own. Outputs without a
    structure (no diffusion samples): the batch itself."""
    if "rollout_positions" not in outputs and "denoised_positions" not in outputs:
        return batch
    return relabelled(batch, ground_truth_sources(batch, outputs))


def relabelled(batch: dict, sources: torch.Tensor) -> dict:
    """The batch with atom i's truth (`atom_pos`, `atom_mask`) taken from atom sources[b, i]."""
    return {**batch, "atom_pos": _take(batch["atom_pos"], sources), "atom_mask": _take(batch["atom_mask"], sources)}


@torch.no_grad()
def ground_truth_sources(batch: dict, outputs: dict) -> torch.Tensor:
    """[B, A]: the truth atom each atom takes its position and mask from, chains first, then
    each residue's symmetric atoms (the module docstring)."""
    predicted = prediction_for_alignment(outputs)
    with torch.autocast(predicted.device.type, enabled=False):  # fp32 fits and distances
        sources = chain_permutation(batch, predicted)
        if "atom_permutations" not in batch:
            return sources
        true = _take(batch["atom_pos"].float(), sources)
        resolved = _take(batch["atom_mask"], sources) & batch["atom_pad_mask"]
        within = symmetric_atom_permutation(
            predicted, true, resolved, batch["atom_permutations"], batch["ref_space_uid"], batch["atom_pad_mask"]
        )
        return _take(sources, within)


def _take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values [B, A, ...] at index [B, A] along the atom axis."""
    expanded = index.long().view(*index.shape, *([1] * (values.dim() - 2))).expand(*index.shape, *values.shape[2:])
    return torch.gather(values, 1, expanded)


def _first_true(matrix: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last axis (0 where none)."""
    return matrix.int().argmax(dim=-1)


def chain_layout(batch: dict) -> dict:
    """Chains of each sample, each named by its first token: `chain` [B, N] (a token's chain),
    `is_chain` [B, N] (the token starts a chain), `partner` [B, N, N] (the token of chain c that
    corresponds to token t, where the chains are `interchangeable` [B, N, N])."""
    valid = batch["token_pad_mask"]
    asym, entity = batch["asym_id"], batch["entity_id"]
    residue, restype = batch["residue_index"], batch["restype"]
    pair_valid = valid[:, :, None] & valid[:, None, :]
    same_chain = (asym[:, :, None] == asym[:, None, :]) & pair_valid
    chain = _first_true(same_chain)
    token = torch.arange(valid.shape[1], device=valid.device)
    is_chain = valid & (chain == token)
    same_residue = same_chain & (residue[:, :, None] == residue[:, None, :])
    rank = (same_residue & (token[None, None, :] < token[None, :, None])).sum(dim=-1)  # place within its residue
    atoms = torch.zeros_like(residue).scatter_add(1, batch["atom_to_token"].long(), batch["atom_pad_mask"].long())
    corresponds = pair_valid & (entity[:, :, None] == entity[:, None, :])
    for key in (residue, rank, restype, atoms):
        corresponds &= key[:, :, None] == key[:, None, :]
    member = (chain[:, :, None] == token[None, None, :]) & valid[:, :, None]  # [B, t, c]: token t is in chain c
    member_f = member.float()
    length = member_f.sum(dim=1)  # [B, c]
    # tokens of chain q with a counterpart in chain c, and that counterpart's index
    matched = torch.einsum("btq,bts,bsc->bqc", member_f, corresponds.float(), member_f)
    interchangeable = (
        is_chain[:, :, None]
        & is_chain[:, None, :]
        & (matched == length[:, :, None])
        & (length[:, :, None] == length[:, None, :])
    )
    partner = torch.einsum("bts,bsc->btc", corresponds.float() * token.float(), member_f).round().long()
    return {
        "chain": chain,
        "is_chain": is_chain,
        "length": length,
        "interchangeable": interchangeable,
        "partner": partner,
        "member": member,
    }


def chain_permutation(batch: dict, predicted: torch.Tensor) -> torch.Tensor:
    """[B, A]: for each atom, the truth atom whose position and mask it takes once the truth's
    interchangeable chains are matched to the prediction (AF-Multimer's anchor and greedy
    matching); the identity where nothing is interchangeable."""
    layout = chain_layout(batch)
    chain, is_chain, partner, interchangeable = (
        layout[name] for name in ("chain", "is_chain", "partner", "interchangeable")
    )
    member = layout["member"].float()  # [B, t, c]
    batch_size, num_tokens = chain.shape
    device = chain.device
    token = torch.arange(num_tokens, device=device)
    rows = torch.arange(batch_size, device=device)
    # representative atoms: truth and prediction [B, N, 3], resolved [B, N]
    rep_true, rep_ok = distogram_atoms(batch)
    rep_pred = gather_atoms(predicted, batch["distogram_atom_index"])

    # the anchor: resolved enough, a polymer first, then the fewest copies, then the most resolved
    copies = interchangeable.sum(dim=-1)  # [B, c], itself included
    resolved = torch.einsum("bt,btc->bc", rep_ok.float(), member).long()
    polymer = ~batch["is_ligand"] & is_chain
    eligible = is_chain & (resolved >= MIN_ANCHOR_TOKENS)
    scale = num_tokens + 1
    score = ((eligible.long() * 2 + polymer.long()) * scale - copies) * scale + resolved
    anchor = score.argmax(dim=1)  # [B]
    has_anchor = eligible[rows, anchor]

    # candidates p: the predicted chains that may be the anchor's; the truth moved onto each
    candidate = interchangeable[rows, anchor]  # [B, p]
    from_anchor = partner[rows, :, anchor]  # [B, t]
    anchor_true = _take(rep_true, from_anchor)  # [B, t, 3]: the anchor's token matching token t
    fit_weights = member.transpose(1, 2) * (_take(rep_ok, from_anchor) & candidate.gather(1, chain)).float()[:, None]
    rotation, shift = rigid_fit(anchor_true[:, None], rep_pred[:, None], fit_weights)  # [B, p, 3, 3], [B, p, 3]

    # centroids: truth chain c [B, c, 3]; prediction of chain q over the tokens whose partner in c is resolved
    resolved_in = torch.gather(rep_ok[:, None, :].expand(-1, num_tokens, -1), 2, partner)  # [B, t, c]
    true_weight = member * rep_ok[:, :, None].float()
    true_centre = torch.einsum("btc,btd->bcd", true_weight, rep_true) / true_weight.sum(1).clamp(min=1)[..., None]
    pred_sum = torch.einsum("btqd,btc->bqcd", member[..., None] * rep_pred[:, :, None], resolved_in.float())
    pred_count = torch.einsum("btq,btc->bqc", member, resolved_in.float())
    pred_centre = pred_sum / pred_count.clamp(min=1)[..., None]  # [B, q, c, 3]
    moved_centre = torch.einsum("bpij,bcj->bpci", rotation, true_centre) + shift[:, :, None]  # [B, p, c, 3]

    # greedy: chains of multi-copy entities, longest first, each take the nearest free chain. What
    # does not depend on the chains taken so far is gathered for every step before the loop: on a
    # GPU each step is then ~10 small kernels, not ~25 (the loop runs MAX_MATCHED_CHAINS times,
    # for fixed shapes)
    assign = token.expand(batch_size, num_tokens, num_tokens).clone()  # [B, p, q] -> truth chain
    assign[rows[:, None], token[None, :], token[None, :]] = torch.where(candidate, anchor[:, None], token[None, :])
    used = torch.zeros(batch_size, num_tokens, num_tokens, dtype=torch.bool, device=device)  # [B, p, c]
    used[rows[:, None], token[None, :], anchor[:, None].expand(-1, num_tokens)] = candidate
    ambiguous = is_chain & (copies > 1)
    order = torch.where(ambiguous, -layout["length"] * scale + token, scale * scale).argsort(dim=1)
    count = ambiguous.sum(dim=1)
    steps = min(MAX_MATCHED_CHAINS, num_tokens)
    picked = order[:, :steps]  # [B, T]: the predicted chain q matched at each step (distinct)
    step_index = torch.arange(steps, device=device)
    active = (  # [B, T, p]: the candidates whose matching takes a truth chain for q at this step
        (step_index[None, :] < count[:, None])[:, :, None]
        & (token[None, None, :] != picked[:, :, None])
        & candidate[:, None, :]
    )
    picked_centre = pred_centre[rows[:, None], picked]  # [B, T, c, 3]
    not_allowed = ~interchangeable[rows[:, None], picked]  # [B, T, c]
    unresolved = (resolved == 0)[:, None].float() * UNRESOLVED_DISTANCE  # [B, 1, c]: resolved chains first
    choices = []
    for step in range(steps):
        distance = (moved_centre - picked_centre[:, step, None]).square().sum(-1) + unresolved  # [B, p, c]
        choice = distance.masked_fill(used | not_allowed[:, step, None], float("inf")).argmin(dim=-1)  # [B, p]
        used.scatter_(2, choice[..., None], used.gather(2, choice[..., None]) | active[:, step, :, None])
        choices.append(choice)
    # each step's choice into assign[:, p, q] (q distinct over the steps), where the step was active
    columns = picked[:, None, :].expand(-1, num_tokens, -1)  # [B, p, T]
    taken = torch.where(active.transpose(1, 2), torch.stack(choices, dim=2), assign.gather(2, columns))
    assign.scatter_(2, columns, taken)

    # the candidate whose matching puts the truth's representative atoms closest
    source = torch.gather(
        partner, 2, torch.gather(assign, 2, chain[:, None, :].expand(-1, num_tokens, -1)).transpose(1, 2)
    ).transpose(1, 2)  # [B, p, t]
    moved = torch.einsum("bpij,bptj->bpti", rotation, _take_tokens(rep_true, source)) + shift[:, :, None]
    weight = torch.gather(rep_ok[:, None, :].expand(-1, num_tokens, -1), 2, source).float()
    error = ((moved - rep_pred[:, None]).square().sum(-1) * weight).sum(-1) / weight.sum(-1).clamp(min=1)
    error = error.masked_fill(~candidate, float("inf"))
    # the anchor as it is, unless another candidate is better by more than rounding (an exactly
    # symmetric assembly, a crystal's copies, ties: either labelling is a rigid image of the other)
    own = error[rows, anchor]
    best = torch.where(error < own[:, None] * (1 - 1e-4) - 1e-6, error, own[:, None]).argmin(dim=1)
    best = torch.where(error[rows, best] < own * (1 - 1e-4) - 1e-6, best, anchor)
    keep = ~has_anchor | (count > MAX_MATCHED_CHAINS)
    source_token = torch.where(keep[:, None], token[None, :], source[rows, best])  # [B, t]
    return _atom_sources(source_token, batch["atom_to_token"].long(), batch["atom_pad_mask"])


def _take_tokens(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values [B, N, 3] at index [B, P, N] -> [B, P, N, 3]."""
    expanded = values[:, None].expand(-1, index.shape[1], -1, -1)
    return torch.gather(expanded, 2, index[..., None].expand(*index.shape, 3))


def _atom_sources(source_token: torch.Tensor, atom_to_token: torch.Tensor, atom_pad_mask: torch.Tensor) -> torch.Tensor:
    """[B, A]: atom k of token t takes atom k of token source_token[t] (padding atoms their own)."""
    batch_size, num_atoms = atom_to_token.shape
    atom = torch.arange(num_atoms, device=atom_to_token.device).expand(batch_size, -1)
    first = token_first_atom(atom_to_token, atom_pad_mask, source_token.shape[1])  # [B, N]
    own_first = first.gather(1, atom_to_token)
    source_first = first.gather(1, source_token.gather(1, atom_to_token))
    return torch.where(atom_pad_mask, source_first + atom - own_first, atom)


def symmetric_atom_permutation(
    predicted: torch.Tensor,
    true: torch.Tensor,
    resolved: torch.Tensor,
    permutations: torch.Tensor,
    ref_space_uid: torch.Tensor,
    atom_pad_mask: torch.Tensor,
) -> torch.Tensor:
    """[B, A]: for each atom, the atom of its residue whose truth it takes under the residue's
    symmetric relabelling (`permutations` [B, A, K], -1 where none) that best fits the prediction
    rigidly aligned onto `true` [B, A, 3] over `resolved` atoms; the identity on ties."""
    batch_size, num_atoms = resolved.shape
    atom = torch.arange(num_atoms, device=resolved.device).expand(batch_size, -1)
    aligned = weighted_rigid_align(predicted, true, resolved.float())
    candidates = torch.cat([atom[..., None], permutations.long()], dim=-1)  # [B, A, 1 + K], identity first
    present = candidates >= 0
    safe = candidates.clamp(min=0)
    flat = safe.flatten(1)
    moved_true = _take(true, flat).view(*safe.shape, 3)
    moved_resolved = _take(resolved, flat).view(safe.shape) & present
    error = (aligned[:, :, None] - moved_true).square().sum(-1) * moved_resolved.float()  # [B, A, 1 + K]
    # one residue: its atoms are consecutive; name it by its first atom
    start = torch.ones_like(atom_pad_mask)
    start[:, 1:] = ref_space_uid[:, 1:] != ref_space_uid[:, :-1]
    residue = torch.cummax(torch.where(start, atom, 0), dim=1).values  # [B, A]
    total = torch.zeros_like(error).scatter_add(1, residue[..., None].expand_as(error), error)
    available = torch.ones_like(candidates).scatter_reduce(  # every atom of the residue has the relabelling
        1, residue[..., None].expand_as(present), (present | ~atom_pad_mask[..., None]).long(), reduce="amin"
    )
    total = total.masked_fill(available == 0, float("inf"))
    # the identity unless a relabelling is better by more than rounding
    best = torch.where(total < total[..., :1] * (1 - 1e-6) - 1e-9, total, total[..., :1]).argmin(dim=-1)
    choice = best.gather(1, residue)  # [B, A]
    return torch.where(atom_pad_mask, safe.gather(2, choice[..., None]).squeeze(-1), atom)
